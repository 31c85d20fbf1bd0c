"""Loading DeepSeek-V3 / Kimi-K2-style FP8 checkpoints: `tandem debug` on the fp8 checkpoint against transformers'
fp32 forward (and PEFT's LoRA gradients) of the same weights dequantised.

The checkpoint is made here the way DeepSeek ships it: config.json carries
  quantization_config {quant_method: fp8, fmt: e4m3, weight_block_size: [128, 128], activation_scheme: dynamic},
every Linear of the decoder layers (attention, dense MLP, shared experts, routed experts, one weight per expert) is
F8_E4M3 with a sibling `X.weight_scale_inv` f32 [ceil(out/128), ceil(in/128)], and
W[o][i] = fp8[o][i] * scale_inv[o // 128][i // 128] (DeepSeek's inference/kernel.py weight_dequant). Embeddings,
norms, the router and lm_head stay bf16, e_score_correction_bias f32. Shapes are chosen so that most matrices have
partial edge blocks (moe_intermediate 160, intermediate 200, q_lora_rank 96, kv_a 80 rows).

The reference is a plain fp32 checkpoint of the dequantised weights (computed here block by block), run by
transformers 5.17 (+ peft 0.18.1 for the gradients). With the fp32 `generic` expert backend Tandem must match it
as the fp32 parity tests do (reference.compare_case: rel-L2 <= 1e-4 for logits, loss and every LoRA grad); the
default backend packs the fp8 experts to bf16 and int8 quantises them again, so those are held to the expert
engine's bf16 / int8 bounds (docs/experts.md).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import reference as R

pytestmark = pytest.mark.filterwarnings("ignore:Unsupported layer type:UserWarning")

REPO = Path(__file__).resolve().parents[2]
DEMO_DATA = REPO / "resources" / "demo"  # the demo's tokenizer (789 ids) and identity dataset, for `tandem train`
BLOCK = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn
QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK],
                "activation_scheme": "dynamic"}
CONFIG = dict(hidden_size=256, intermediate_size=200, moe_intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, vocab_size=800, max_position_embeddings=128,
              rms_norm_eps=1e-6, attention_dropout=0.0, tie_word_embeddings=False, use_cache=False,
              n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
              q_lora_rank=96, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
              n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True)


def quantised(name, tensor):
    """Whether DeepSeek-V3's checkpoint stores this tensor in fp8: the Linear weights of the decoder layers
    except the router (mlp.gate)."""
    return (tensor.dim() == 2 and name.startswith("model.layers.")
            and (name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight")))


def quantise_blocks(w):
    """w [rows, cols] fp32 -> fp8 e4m3 codes [rows, cols] and scale_inv [ceil(rows/128), ceil(cols/128)] f32,
    one scale per 128 x 128 block (amax / 448, as DeepSeek's and transformers' block quantisers)."""
    rows, cols = w.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale = torch.empty(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            block = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            s = float(block.abs().max()) / FP8_MAX or 1.0
            scale[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (block / scale[i, j]).to(torch.float8_e4m3fn)
    return q, scale


def dequantise_blocks(q, scale):
    """The written-out definition: W[o][i] = fp8[o][i] * scale_inv[o // 128][i // 128], in fp32."""
    w = torch.empty(q.shape, dtype=torch.float32)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            rows, cols = slice(i * BLOCK, (i + 1) * BLOCK), slice(j * BLOCK, (j + 1) * BLOCK)
            w[rows, cols] = q[rows, cols].to(torch.float32) * scale[i, j]
    return w


def quantise(name, w):
    """fp8 block-quantised, as DeepSeek-V3's checkpoints: every 2-D projection but the embeddings, lm_head and the
    router gate (None: kept in bf16)."""
    if not quantised(name, w):
        return None
    q, scale = quantise_blocks(w)
    return {name: q, name + "_scale_inv": scale}, dequantise_blocks(q, scale)


def write_checkpoints(root, seed=0):
    """root/model: the fp8 checkpoint; root/dequantised: the same weights in fp32 (what transformers runs)."""
    return R.write_quantised_checkpoints(root, CONFIG, quantise, QUANTIZATION, DEMO_DATA, seed)


@pytest.fixture(scope="session")
def case(tmp_path_factory):
    """A case directory in reference.build_case's layout (model/ is the fp8 checkpoint), so compare_case judges it:
    the reference outputs come from transformers + peft on the dequantised fp32 checkpoint."""
    root = write_checkpoints(tmp_path_factory.mktemp("fp8"))
    ref_dir = root / "dequantised"
    adapter = R.make_adapter(ref_dir, root / "adapter", rank=4, alpha=8, seed=1, per_expert_dir=root / "adapter_per_expert")
    model = R.load_reference(ref_dir, adapter["fused"], "fp32")
    tokens, labels, margin = R.pick_batch(model, R.LENGTHS)
    (root / "tokens.json").write_text(json.dumps(tokens))
    (root / "labels.json").write_text(json.dumps(labels))
    ref = R.reference_forward(ref_dir, adapter["fused"], tokens, labels, "fp32", model=model)
    R._save_reference(root / "reference.safetensors", ref)
    base = R.reference_forward(ref_dir, None, tokens, labels, "fp32")
    save_file({"logits": base["logits"].contiguous(), "loss": base["loss"].reshape(())},
              str(root / "reference_base.safetensors"))
    (root / "meta.json").write_text(json.dumps({"dtype": "fp32", "lengths": [len(t) for t in tokens],
                                                "routing_margin": margin}))
    return root


def run_debug(tandem, case, out, mode="forward", adapter=None, extra=()):
    cmd = [tandem, "debug", mode, "--model", str(case / "model"), "--tokens", str(case / "tokens.json"),
           "--labels", str(case / "labels.json"), "--out", str(out), "--dtype", "fp32", *extra]
    if adapter:
        cmd += ["--adapter", str(case / adapter)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_the_checkpoint_is_what_deepseek_ships(case):
    """The fixture itself: fp8 weights with partial edge blocks, scales of the documented shape, the rest bf16."""
    from safetensors import safe_open
    with safe_open(str(case / "model" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        kv_a = f.get_tensor("model.layers.0.self_attn.kv_a_proj_with_mqa.weight")
        expert = f.get_tensor("model.layers.1.mlp.experts.3.down_proj.weight")
        assert kv_a.dtype == expert.dtype == torch.float8_e4m3fn
        assert tuple(f.get_tensor("model.layers.1.mlp.experts.3.down_proj.weight_scale_inv").shape) == (2, 2)
        assert tuple(f.get_tensor("model.layers.0.mlp.gate_proj.weight_scale_inv").shape) == (2, 2)  # 200 x 256
        assert f.get_tensor("model.layers.1.mlp.gate.weight").dtype == torch.bfloat16
        assert f.get_tensor("lm_head.weight").dtype == torch.bfloat16
    assert "model.layers.1.mlp.shared_experts.up_proj.weight_scale_inv" in names
    assert not any(n.endswith("gate.weight_scale_inv") and ".mlp.gate." in n for n in names)


def test_logits_match_transformers_on_the_dequantised_weights(tandem, case, tmp_path):
    """No adapter: fp32 dense parts dequantised at load, fp8 experts dequantised by the generic backend."""
    out = tmp_path / "out.safetensors"
    result = run_debug(tandem, case, out, extra=["--experts-backend", "generic"])
    assert result.returncode == 0, result.stderr
    got, ref = load_file(str(out)), load_file(str(case / "reference_base.safetensors"))
    mask = R.mask_from_lengths(json.loads((case / "meta.json").read_text())["lengths"])
    lg, lr = R.valid_positions(got["logits"], mask), R.valid_positions(ref["logits"], mask)
    assert R.rel_l2(lg, lr) <= R.FP32_REL
    assert float((lg - lr).abs().max()) <= 1e-4 * float(lr.abs().max())
    assert abs(float(got["loss"]) / float(ref["loss"]) - 1) <= R.FP32_REL


@pytest.mark.parametrize("adapter", ["adapter", "adapter_per_expert"])
def test_lora_gradients_match_peft_on_the_dequantised_weights(tandem, case, tmp_path, adapter):
    out = tmp_path / "out.safetensors"
    result = run_debug(tandem, case, out, mode="grad", adapter=adapter, extra=["--experts-backend", "generic"])
    assert result.returncode == 0, result.stderr
    verdict = R.compare_case(case, out, expect_grads=True)
    assert verdict["ok"], "\n".join(verdict["failures"]) + f"\nerrors: {verdict['errors']}"


@pytest.mark.parametrize("fmt,bound", [("auto", 1e-2), ("fp8", 1e-2), ("int8", 2.5e-2)])
def test_packed_formats_stay_close(tandem, case, tmp_path, fmt, bound):
    """The default backend packs the fp8 experts to bf16 (auto and fp8 alike); int8 re-quantises them per channel.
    Measured here: bf16 packs 1.8e-3 (logits rel-L2), int8 5.3e-3; the bounds leave 5x room (the expert engine's
    own bounds per layer are 1e-2 and 5e-2, docs/experts.md)."""
    out = tmp_path / "out.safetensors"
    result = run_debug(tandem, case, out, mode="grad", adapter="adapter",
                       extra=["--experts-format", fmt, "--experts-wt-policy", "on_demand"])
    assert result.returncode == 0, result.stderr
    got, ref = R.load_outputs(out), R.load_outputs(case / "reference.safetensors")
    errors = R.compare_outputs(got, ref, R.mask_from_lengths(json.loads((case / "meta.json").read_text())["lengths"]))
    assert errors["logits_rel_l2"] <= bound, errors
    assert errors["loss_rel"] <= bound, errors
    assert errors["grads_cos"] >= 0.999, errors


CPU_FLAGS = open("/proc/cpuinfo").read()


# (Not int8 in bf16: there the fp32 checkpoint's experts are rounded to the model's bf16 before they are quantised,
# the fp8 ones are quantised from their exact values.)
@pytest.mark.parametrize("backend,fmt,dtype", [("avx512_bf16", "auto", "fp32"), ("avx512_bf16", "auto", "bf16"),
                                               ("generic", "int8", "fp32")])
def test_packs_equal_those_of_the_dequantised_checkpoint(tandem, case, tmp_path, backend, fmt, dtype):
    """Packing the fp8 experts (dequantised at pack time) gives the packs of the same weights given in fp32:
    the whole forward agrees to rounding."""
    if backend == "avx512_bf16" and "avx512_bf16" not in CPU_FLAGS:
        pytest.skip("this CPU has no AVX512_BF16")
    outs = []
    for model in ("model", "dequantised"):
        out = tmp_path / f"{model}.safetensors"
        result = subprocess.run([tandem, "debug", "forward", "--model", str(case / model), "--tokens",
                                 str(case / "tokens.json"), "--out", str(out), "--dtype", dtype,
                                 "--experts-backend", backend, "--experts-format", fmt],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        outs.append(load_file(str(out))["logits"])
    assert R.rel_l2(outs[0], outs[1]) <= 1e-6


def test_offload_mode_dequantises_the_fp8_experts(tandem, case, tmp_path):
    """--experts gpu-offload (here on the CPU device): the experts are dequantised into the offload copy."""
    out = tmp_path / "out.safetensors"
    result = run_debug(tandem, case, out, mode="grad", adapter="adapter_per_expert", extra=["--experts", "gpu-offload"])
    assert result.returncode == 0, result.stderr
    verdict = R.compare_case(case, out, expect_grads=True)
    assert verdict["ok"], "\n".join(verdict["failures"]) + f"\nerrors: {verdict['errors']}"


TRAIN_YAML = """\
model_name_or_path: {model}
stage: sft
do_train: true
finetuning_type: lora
lora_target: all
lora_rank: 4
dataset: identity
dataset_dir: {data}
template: qwen3_nothink
cutoff_len: 64
output_dir: {output}
per_device_train_batch_size: 4
learning_rate: 3.0e-3
max_steps: 6
logging_steps: 1
save_steps: 100
device: cpu
kt_config:
  kt_backend: AMXInt8
  kt_expert_weight_format: int8
experts_backend: {backend}
experts_wt_policy: on_demand
"""


def test_training_on_the_fp8_checkpoint_gives_an_adapter_peft_reads(tandem, case, tmp_path):
    """`tandem train` straight from the fp8 checkpoint with int8 experts and on-demand W^T (the KT spelling of the
    format; amx_int8 where the CPU has it, else generic int8), then the adapter in PEFT on the dequantised weights
    gives Tandem's logits on the fp8 checkpoint."""
    amx = "amx_int8" in CPU_FLAGS
    config = tmp_path / "fp8_lora_sft.yaml"
    output = tmp_path / "saves"
    yaml = TRAIN_YAML.format(model=case / "model", data=DEMO_DATA, output=output,
                             backend="amx_int8" if amx else "generic")
    config.write_text(yaml if amx else yaml.replace("  kt_backend: AMXInt8\n", ""))
    result = subprocess.run([tandem, "train", str(config)], capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, TANDEM_HOME=str(tmp_path / "home")))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    backend = "amx_int8" if amx else "generic"
    assert f"routed experts: {backend}, int8 packs, W^T on_demand (fp8 checkpoint)" in result.stdout, result.stdout
    history = [json.loads(line)["loss"] for line in (output / "trainer_log.jsonl").read_text().splitlines()
               if "loss" in json.loads(line)]
    assert len(history) == 6 and all(torch.isfinite(torch.tensor(history))), history
    assert history[-1] < history[0], history
    out = tmp_path / "out.safetensors"
    forward = subprocess.run([tandem, "debug", "forward", "--model", str(case / "model"), "--adapter", str(output),
                              "--tokens", str(case / "tokens.json"), "--out", str(out), "--experts-backend",
                              "generic"], capture_output=True, text=True, timeout=300)
    assert forward.returncode == 0, forward.stderr
    tokens = json.loads((case / "tokens.json").read_text())
    ref = R.reference_forward(case / "dequantised", output, tokens)
    mask = R.mask_from_lengths([len(t) for t in tokens])
    got = load_file(str(out))["logits"]
    assert R.rel_l2(R.valid_positions(got, mask), R.valid_positions(ref["logits"], mask)) <= R.FP32_REL


def test_fp8_format_of_a_bf16_checkpoint_is_refused(tandem, case, tmp_path):
    result = subprocess.run([tandem, "debug", "forward", "--model", str(case / "dequantised"), "--tokens",
                             str(case / "tokens.json"), "--out", str(tmp_path / "o.safetensors"),
                             "--experts-format", "fp8"], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "fp8" in result.stderr and "f32" in result.stderr, result.stderr


def _corrupt(tandem, case, tmp_path, edit_tensors=None, edit_config=None):
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = load_file(str(case / "model" / "model.safetensors"))
    config = json.loads((case / "model" / "config.json").read_text())
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    (bad / "config.json").write_text(json.dumps(config))
    return subprocess.run([tandem, "debug", "forward", "--model", str(bad), "--tokens",
                           str(case / "tokens.json"), "--out", str(tmp_path / "o.safetensors")],
                          capture_output=True, text=True, timeout=300)


EXPERT = "model.layers.1.mlp.experts.5.up_proj.weight"
ATTENTION = "model.layers.0.self_attn.kv_b_proj.weight"


def _one_expert_in_bf16(tensors):
    tensors[EXPERT] = tensors[EXPERT].to(torch.bfloat16)
    del tensors[EXPERT + "_scale_inv"]


def _fused_experts(tensors):
    """transformers' fused layout (gate_up_proj [E, 2I, H], down_proj [E, H, I]) stored in fp8."""
    prefix = "model.layers.1.mlp.experts."
    experts = range(CONFIG["n_routed_experts"])
    per = {(e, proj): tensors.pop(f"{prefix}{e}.{proj}.weight") for e in experts
           for proj in ("gate_proj", "up_proj", "down_proj")}
    for e, proj in per:
        del tensors[f"{prefix}{e}.{proj}.weight_scale_inv"]
    tensors[prefix + "gate_up_proj"] = torch.stack([torch.cat([per[e, "gate_proj"], per[e, "up_proj"]]) for e in experts])
    tensors[prefix + "down_proj"] = torch.stack([per[e, "down_proj"] for e in experts])


@pytest.mark.parametrize("what,edit_tensors,edit_config,message", [
    ("expert scales missing", lambda t: t.pop(EXPERT + "_scale_inv"), None, "are missing"),
    ("attention scales missing", lambda t: t.pop(ATTENTION + "_scale_inv"), None, "are missing"),
    ("scales of the wrong shape", lambda t: t.__setitem__(EXPERT + "_scale_inv", torch.ones(3, 2)), None,
     "needs [2, 2]"),
    ("one expert in bf16", _one_expert_in_bf16, None, "the experts of one layer must share a type"),
    ("fused fp8 experts", _fused_experts, None, "fp8 in transformers' fused expert layout"),
    ("no quantization_config", None, lambda c: c.pop("quantization_config"), "no quantization_config"),
    ("fmt e5m2", None, lambda c: c["quantization_config"].__setitem__("fmt", "e5m2"), "fmt 'e5m2'"),
    ("64 x 64 blocks", None, lambda c: c["quantization_config"].__setitem__("weight_block_size", [64, 64]),
     "weight_block_size [64, 64]"),
])
def test_broken_fp8_checkpoints_are_explained(tandem, case, tmp_path, what, edit_tensors, edit_config, message):
    result = _corrupt(tandem, case, tmp_path, edit_tensors, edit_config)
    assert result.returncode != 0, what
    assert message in result.stderr, f"{what}: {result.stderr}"
    assert "Traceback" not in result.stderr and "terminate" not in result.stderr


def test_merged_export_dequantises_the_fp8_weights(tandem, case, tmp_path):
    """`tandem export --merge --format hf` on the fp8 checkpoint writes a plain bf16 folder (no fp8 tensor, no
    scale_inv, no quantization_config) whose logits in transformers are those of transformers + peft on the
    dequantised fp32 checkpoint, within bf16 rounding."""
    out = tmp_path / "merged"
    result = subprocess.run([tandem, "export", "--merge", "--format", "hf", "--adapter", str(case / "adapter"),
                             "--model", str(case / "model"), "--out", str(out)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    merged = load_file(str(out / "model.safetensors"))
    assert not any(name.endswith("_scale_inv") for name in merged)
    assert {t.dtype for t in merged.values()} <= {torch.bfloat16, torch.float32}
    fp8 = load_file(str(case / "model" / "model.safetensors"))
    assert set(merged) == {name for name in fp8 if not name.endswith("_scale_inv")}

    tokens = json.loads((case / "tokens.json").read_text())
    ids, mask, _ = R.pad_batch(tokens)
    with torch.no_grad():
        got = R._load_model(out, "fp32")(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
    ref = R.load_outputs(case / "reference.safetensors")["logits"]
    base = R.load_outputs(case / "reference_base.safetensors")["logits"]
    valid = R.mask_from_lengths([len(t) for t in tokens])
    got, ref, base = (R.valid_positions(x, valid) for x in (got, ref, base))
    assert R.rel_l2(got, ref) <= 1e-2
    assert R.rel_l2(got, base) > 5 * R.rel_l2(got, ref)  # the adapter is in it
