"""Parity of Tandem's model engine (`tandem debug forward|grad`) with HF transformers 5.17 + peft 0.18.1.

Each case (reference.build_case) is a tiny random model of one architecture with a random non-zero LoRA adapter,
a ragged right-padded batch and the transformers + peft outputs: logits, loss and the gradient of every LoRA
parameter. Tandem must reproduce them:
  fp32: logits rel-L2 <= 1e-4 at real positions, loss rel <= 1e-4, every LoRA grad rel-L2 <= 1e-4;
  bf16: against the fp32 run on the same bf16 weights, within twice HF bf16's own error (floors 2e-2 logits,
        1e-2 loss, 5e-2 grads; cosine >= 0.999 or HF's), see reference.compare_case.
Routed-expert grads are compared per expert (`...mlp.experts.E.gate_proj.lora_A.weight`): the diagonal blocks of
PEFT's fused grads (test_peft_reference.py checks those against a plain torch reference). The adapter is given
both in PEFT's fused target_parameters form and in the per-expert form; both must give the same numbers.

Contract of the CLI:
  tandem debug forward --model DIR [--adapter DIR] --tokens T.json [--labels L.json] --out OUT.safetensors
                       [--dtype fp32|bf16] [--device cpu|cuda:N] [--experts-backend auto|generic|avx512]
  tandem debug grad    ... (--labels required) also writes every LoRA grad (fp32) under PEFT's names.

The tandem executable comes from --tandem-bin or $TANDEM_BIN. Until `tandem debug` exists these tests skip
(pass --require-tandem-debug to make that a failure).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import reference as R

pytestmark = pytest.mark.filterwarnings("ignore:Unsupported layer type:UserWarning")

MOE = R.MOE_ARCHS
ALL = list(R.ARCHS)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="torch.cuda is not available")


def _cpu_flags():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


HAS_AVX512 = "avx512f" in _cpu_flags()


@pytest.fixture(scope="session")
def tandem(request):
    path = request.config.getoption("--tandem-bin") or os.environ.get("TANDEM_BIN")
    required = request.config.getoption("--require-tandem-debug")
    stop = pytest.fail if required else pytest.skip
    if not path:
        stop("set TANDEM_BIN (or --tandem-bin) to the tandem executable")
    if not os.access(path, os.X_OK):
        pytest.fail(f"tandem not found or not executable: {path}")
    probe = subprocess.run([path, "debug", "forward", "--help"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        stop(f"`tandem debug forward` is not available yet: {probe.stderr.strip()[:200]}")
    return path


@pytest.fixture(scope="session")
def cases(tmp_path_factory):
    built = {}

    def get(arch, dtype="fp32", rslora=False, router_lora=False):
        key = (arch, dtype, rslora, router_lora)
        if key not in built:
            root = tmp_path_factory.mktemp(f"{arch}_{dtype}_{int(rslora)}{int(router_lora)}")
            built[key] = R.build_case(arch, root, dtype=dtype, rslora=rslora, router_lora=router_lora)
        return built[key]

    return get


def run_debug(tandem, mode, case, out, adapter="adapter", labels=True, dtype="fp32", device=None, backend=None,
              tokens="tokens.json", model="model", timeout=300, extra=()):
    cmd = [tandem, "debug", mode, "--model", str(case / model), "--tokens", str(case / tokens), "--out", str(out),
           "--dtype", dtype]
    if adapter:
        cmd += ["--adapter", str(case / adapter)]
    if labels:
        cmd += ["--labels", str(case / "labels.json")]
    if device:
        cmd += ["--device", device]
    if backend:
        cmd += ["--experts-backend", backend]
    cmd += list(extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def check(tandem, case, tmp_path, mode="grad", **kw):
    out = tmp_path / f"out_{mode}_{kw.get('adapter', 'adapter')}.safetensors"
    result = run_debug(tandem, mode, case, out, **kw)
    assert result.returncode == 0, f"tandem debug {mode} failed ({result.returncode}):\n{result.stderr}"
    verdict = R.compare_case(case, out, expect_grads=(mode == "grad"))
    assert verdict["ok"], "\n".join(verdict["failures"]) + f"\nerrors: {verdict['errors']}"
    return out, verdict


def adapter_forms(arch):
    return ["adapter", "adapter_per_expert"] if arch in MOE else ["adapter"]


FORMS = [(a, f) for a in ALL for f in adapter_forms(a)]


# ---------------------------------------------------------------------------------------------
# fp32
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,adapter", FORMS)
def test_grad_fp32(tandem, cases, tmp_path, arch, adapter):
    check(tandem, cases(arch), tmp_path, "grad", adapter=adapter)


@pytest.mark.parametrize("arch", ALL)
def test_forward_fp32(tandem, cases, tmp_path, arch):
    """forward with labels: logits + loss, no grads."""
    out, _ = check(tandem, cases(arch), tmp_path, "forward")
    assert "loss" in load_file(str(out))


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "llama"])
def test_forward_without_labels_writes_no_loss(tandem, cases, tmp_path, arch):
    out, _ = check(tandem, cases(arch), tmp_path, "forward", labels=False)
    assert "loss" not in load_file(str(out))


@pytest.mark.parametrize("arch", ALL)
def test_base_model_without_adapter_fp32(tandem, cases, tmp_path, arch):
    """No --adapter: the plain model (isolates model bugs from LoRA bugs)."""
    case = cases(arch)
    meta = json.loads((case / "meta.json").read_text())
    tokens = json.loads((case / "tokens.json").read_text())
    labels = json.loads((case / "labels.json").read_text())
    ref = R.reference_forward(case / "model", None, tokens, labels)
    out = tmp_path / "out.safetensors"
    result = run_debug(tandem, "forward", case, out, adapter=None)
    assert result.returncode == 0, result.stderr
    got = R.load_outputs(out)
    mask = R.mask_from_lengths(meta["lengths"])
    assert R.rel_l2(R.valid_positions(got["logits"], mask), R.valid_positions(ref["logits"], mask)) <= R.FP32_REL
    assert abs(float(got["loss"]) / float(ref["loss"]) - 1) <= R.FP32_REL


@pytest.mark.parametrize("arch,rslora,router_lora", [("qwen3_moe", True, False), ("deepseek_v3", True, True),
                                                     ("qwen2_moe", False, True), ("llama", True, False)])
@pytest.mark.parametrize("form", ["adapter", "adapter_per_expert"])
def test_rslora_and_router_lora_fp32(tandem, cases, tmp_path, arch, rslora, router_lora, form):
    """use_rslora (fused gate_up alpha = sqrt(2) * alpha) and LoRA on the router weight (`mlp.gate.weight`)."""
    check(tandem, cases(arch, rslora=rslora, router_lora=router_lora), tmp_path, "grad", adapter=form)


def test_unused_experts_get_zero_grads(tandem, cases, tmp_path):
    case = cases("qwen3_moe_top1")
    meta = json.loads((case / "meta.json").read_text())
    used = set(meta["experts_used"]["1"])
    assert len(used) < 16
    out, _ = check(tandem, case, tmp_path, "grad")
    grads = R.load_outputs(out)["grads"]
    # pad tokens are routed too (HF routes them), so only experts no token at all reached are surely zero
    ref = R.load_outputs(case / "reference.safetensors")["grads"]
    for e in range(16):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            for ab in "AB":
                k = R.expert_key(1, e, proj, ab)
                if float(ref[k].abs().max()) == 0:
                    assert float(grads[k].abs().max()) == 0, k


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "qwen2"])
def test_padding_does_not_leak(tandem, cases, tmp_path, arch):
    """Each row alone (no padding) gives the same logits as inside the padded batch."""
    case = cases(arch)
    tokens = json.loads((case / "tokens.json").read_text())
    batch_out = tmp_path / "batch.safetensors"
    assert run_debug(tandem, "forward", case, batch_out, labels=False).returncode == 0
    batch = load_file(str(batch_out))["logits"]
    for i, row in enumerate(tokens):
        (tmp_path / f"row{i}.json").write_text(json.dumps([row]))
        out = tmp_path / f"row{i}.safetensors"
        result = run_debug(tandem, "forward", case, out, labels=False, tokens=str(tmp_path / f"row{i}.json"))
        assert result.returncode == 0, result.stderr
        alone = load_file(str(out))["logits"]
        assert alone.shape == (1, len(row), batch.shape[-1])
        assert R.rel_l2(batch[i, :len(row)], alone[0]) <= R.FP32_REL, i


@pytest.mark.parametrize("backend,dtype", [("generic", "fp32"), ("generic", "bf16"), ("avx512", "bf16")])
def test_experts_backends(tandem, cases, tmp_path, backend, dtype):
    if backend == "avx512" and not HAS_AVX512:
        pytest.skip("CPU without AVX-512")
    check(tandem, cases("qwen3_moe", dtype), tmp_path, "grad", dtype=dtype, backend=backend)


# ---------------------------------------------------------------------------------------------
# bf16 (model bf16, adapter fp32 as PEFT keeps it)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,adapter", FORMS)
def test_grad_bf16(tandem, cases, tmp_path, arch, adapter):
    check(tandem, cases(arch, "bf16"), tmp_path, "grad", adapter=adapter, dtype="bf16")


# ---------------------------------------------------------------------------------------------
# CUDA (run on a GPU machine; same references, computed on the CPU)
# ---------------------------------------------------------------------------------------------

@needs_cuda
@pytest.mark.parametrize("arch", ALL)
def test_grad_fp32_cuda(tandem, cases, tmp_path, arch):
    check(tandem, cases(arch), tmp_path, "grad", device="cuda:0")


@needs_cuda
@pytest.mark.parametrize("arch", ALL)
def test_grad_bf16_cuda(tandem, cases, tmp_path, arch):
    check(tandem, cases(arch, "bf16"), tmp_path, "grad", dtype="bf16", device="cuda:0")


@needs_cuda
@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_forward_fp32_cuda_per_expert_adapter(tandem, cases, tmp_path, arch):
    check(tandem, cases(arch), tmp_path, "forward", adapter="adapter_per_expert", device="cuda:0")


# ---------------------------------------------------------------------------------------------
# Placement: layers split over devices, routed experts in offload mode (docs/placement_runtime.md)
# ---------------------------------------------------------------------------------------------

PLACED_ARCHS = ["qwen3_moe", "deepseek_v2", "mixtral"]
N_GPUS = torch.cuda.device_count() if CUDA else 0


def split_devices(first, second):
    """Layer 0 on `first`, layers 1-2 (the tiny models have 3) and the head on `second`."""
    return ["--device", first, "--layer-devices", f"{first}:0,{second}:1-2"]


def assert_same_outputs(a_path, b_path, tol=R.FP32_REL):
    a, b = load_file(str(a_path)), load_file(str(b_path))
    assert a.keys() == b.keys()
    for k in a:
        assert R.rel_l2(a[k].float(), b[k].float()) <= tol, k


@pytest.mark.parametrize("arch", PLACED_ARCHS)
def test_split_layers_equal_one_device(tandem, cases, tmp_path, arch):
    """Layers on distinct device objects (cpu and cpu:0 here: the multi-device path, every
    activation crossing with .to()) give the reference's numbers and the one-device run's."""
    case = cases(arch)
    split, _ = check(tandem, case, tmp_path, "grad", extra=split_devices("cpu", "cpu:0"))
    one = tmp_path / "one.safetensors"
    assert run_debug(tandem, "grad", case, one).returncode == 0
    assert_same_outputs(split, one, tol=1e-6)


@pytest.mark.parametrize("arch", PLACED_ARCHS)
def test_offload_mode_equals_cpu_engine(tandem, cases, tmp_path, arch):
    """--experts gpu-offload (torch ops on the layer's device; here the CPU device) matches the
    reference and the CPU expert engine: logits, loss and every LoRA grad."""
    case = cases(arch)
    offload, _ = check(tandem, case, tmp_path, "grad", extra=["--experts", "gpu-offload"])
    engine = tmp_path / "engine.safetensors"
    assert run_debug(tandem, "grad", case, engine).returncode == 0
    assert_same_outputs(offload, engine)


def test_offload_mode_with_checkpointing_and_split(tandem, cases, tmp_path):
    check(tandem, cases("deepseek_v3", rslora=True, router_lora=True), tmp_path, "grad", adapter="adapter_per_expert",
          extra=["--experts", "gpu-offload", "--gradient-checkpointing"] + split_devices("cpu", "cpu:0"))


def test_offload_mode_resident_cache_with_checkpointing_and_split(tandem, cases, tmp_path):
    """--experts gpu-offload --gpu-experts 3: offload mode keeps the three most routed experts of every MoE layer on
    the layer's device and streams the others (two groups of pairs, outputs summed): matches the reference, every
    expert's LoRA grads included, with the recomputation and the layers on two device objects."""
    check(tandem, cases("deepseek_v3", rslora=True, router_lora=True), tmp_path, "grad", adapter="adapter_per_expert",
          extra=["--experts", "gpu-offload", "--gpu-experts", "3", "--gradient-checkpointing"]
          + split_devices("cpu", "cpu:0"))


@pytest.mark.parametrize("arch", PLACED_ARCHS)
def test_resident_experts_equal_cpu_engine(tandem, cases, tmp_path, arch):
    """--gpu-experts 2: the two most routed experts of every MoE layer computed with torch ops on the layer's device
    (here the CPU device), the other pairs by the CPU engine, outputs summed: matches the reference (every expert's
    LoRA grads, so a resident pair lost or counted twice fails) and the all-engine run."""
    case = cases(arch)
    resident, _ = check(tandem, case, tmp_path, "grad", extra=["--gpu-experts", "2"])
    engine = tmp_path / "engine.safetensors"
    assert run_debug(tandem, "grad", case, engine).returncode == 0
    assert_same_outputs(resident, engine)
    check(tandem, case, tmp_path, "forward", extra=["--gpu-experts", "2"])


def test_resident_experts_with_checkpointing_and_split(tandem, cases, tmp_path):
    check(tandem, cases("deepseek_v3", rslora=True, router_lora=True), tmp_path, "grad", adapter="adapter_per_expert",
          extra=["--gpu-experts", "3", "--gradient-checkpointing"] + split_devices("cpu", "cpu:0"))


@pytest.mark.parametrize("extra,expected", [
    (["--layer-devices", "cpu:0-7"], "outside"),
    (["--layer-devices", "cpu:1-0"], "not a layer range"),
    (["--layer-devices", "cpu:0-1,cpu:1-2"], "placed twice"),
    (["--layer-devices", "tpu:0-2"], "not a device"),
    (["--layer-devices", "cuda:7:0-2"], "not available"),
    (["--experts", "gpu"], "gpu-offload"),
])
def test_bad_placement_is_an_error(tandem, cases, tmp_path, extra, expected):
    result = run_debug(tandem, "grad", cases("qwen3_moe"), tmp_path / "o.safetensors", extra=extra)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert expected in result.stderr, result.stderr


@needs_cuda
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("arch", PLACED_ARCHS + ["deepseek_v3", "qwen2_moe", "llama"])
def test_split_layers_cuda(tandem, cases, tmp_path, arch, dtype):
    """cuda:0 + cuda:1 on a two-GPU machine, cuda:0 + cpu where only one GPU is available."""
    second = "cuda:1" if N_GPUS >= 2 else "cpu"
    check(tandem, cases(arch, dtype), tmp_path, "grad", dtype=dtype, extra=split_devices("cuda:0", second))


@needs_cuda
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v2", "deepseek_v3", "mixtral", "qwen2_moe"])
@pytest.mark.parametrize("resident", [[], ["--gpu-experts", "2"]], ids=["streamed", "resident_cache"])
def test_offload_mode_cuda(tandem, cases, tmp_path, arch, dtype, resident):
    check(tandem, cases(arch, dtype), tmp_path, "grad", dtype=dtype, device="cuda:0",
          extra=["--experts", "gpu-offload"] + resident)


@needs_cuda
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v2", "deepseek_v3", "mixtral", "qwen2_moe"])
def test_resident_experts_cuda(tandem, cases, tmp_path, arch, dtype):
    check(tandem, cases(arch, dtype), tmp_path, "grad", dtype=dtype, device="cuda:0", extra=["--gpu-experts", "2"])


# ---------------------------------------------------------------------------------------------
# Errors: non-zero exit (not a crash) and a message that names the culprit
# ---------------------------------------------------------------------------------------------

def copy_case(case, dst):
    shutil.copytree(case, dst)
    return dst


def assert_fails(result, *expected):
    assert 0 < result.returncode < 128, (result.returncode, result.stderr)   # an error, not a signal
    for text in expected:
        assert text in result.stderr, (text, result.stderr)


@pytest.fixture(scope="session")
def sharded_case(tmp_path_factory, cases):
    case = cases("qwen3_moe")
    root = tmp_path_factory.mktemp("sharded")
    shutil.copytree(case, root, dirs_exist_ok=True)
    shutil.rmtree(root / "model")
    R.make_tiny_model("qwen3_moe", root / "model", seed=0, max_shard_size="60KB")
    assert (root / "model" / "model.safetensors.index.json").exists()
    return root


def test_sharded_model_works(tandem, sharded_case, tmp_path):
    check(tandem, sharded_case, tmp_path, "grad")


def test_missing_shard_is_an_error(tandem, sharded_case, tmp_path):
    case = copy_case(sharded_case, tmp_path / "c")
    shard = sorted(f for f in os.listdir(case / "model") if f.endswith(".safetensors"))[-1]
    os.remove(case / "model" / shard)
    assert_fails(run_debug(tandem, "forward", case, tmp_path / "o.safetensors"), shard)


def _edit_safetensors(path, key, change):
    tensors = load_file(str(path))
    tensors[key] = change(tensors[key])
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_wrong_shape_in_model_is_an_error(tandem, cases, tmp_path):
    case = copy_case(cases("qwen3_moe"), tmp_path / "c")
    key = "model.layers.1.self_attn.q_proj.weight"
    _edit_safetensors(case / "model" / "model.safetensors", key, lambda t: t[:-1].contiguous())
    assert_fails(run_debug(tandem, "forward", case, tmp_path / "o.safetensors"), key)


def test_wrong_shape_in_adapter_is_an_error(tandem, cases, tmp_path):
    case = copy_case(cases("qwen3_moe"), tmp_path / "c")
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    _edit_safetensors(case / "adapter" / R.ADAPTER_FILE, key, lambda t: t[:-1].contiguous())
    assert_fails(run_debug(tandem, "forward", case, tmp_path / "o.safetensors"), key)


def test_wrong_shape_in_fused_expert_adapter_is_an_error(tandem, cases, tmp_path):
    case = copy_case(cases("qwen3_moe"), tmp_path / "c")
    key = "base_model.model.model.layers.2.mlp.experts.base_layer.lora_B.weight"
    _edit_safetensors(case / "adapter" / R.ADAPTER_FILE, key, lambda t: t[:, :-1].contiguous())
    assert_fails(run_debug(tandem, "forward", case, tmp_path / "o.safetensors"), key)


def test_unsupported_architecture_is_an_error(tandem, cases, tmp_path):
    case = copy_case(cases("llama"), tmp_path / "c")
    config = json.loads((case / "model" / "config.json").read_text())
    config["model_type"] = "gpt2"
    config["architectures"] = ["GPT2LMHeadModel"]
    (case / "model" / "config.json").write_text(json.dumps(config))
    assert_fails(run_debug(tandem, "forward", case, tmp_path / "o.safetensors"), "config.json", "model_type",
                 "gpt2")


def test_grad_requires_labels(tandem, cases, tmp_path):
    result = run_debug(tandem, "grad", cases("llama"), tmp_path / "o.safetensors", labels=False)
    assert_fails(result, "--labels")


def test_labels_shape_mismatch_is_an_error(tandem, cases, tmp_path):
    case = copy_case(cases("llama"), tmp_path / "c")
    labels = json.loads((case / "labels.json").read_text())
    labels[1] = labels[1][:-1]
    (case / "labels.json").write_text(json.dumps(labels))
    assert_fails(run_debug(tandem, "grad", case, tmp_path / "o.safetensors"), "labels.json")


# --- gradient checkpointing, chunked loss, adapter export (written after the CLI landed) -------------------

@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_gradient_checkpointing_and_small_loss_chunks_change_nothing(tandem, cases, tmp_path, arch):
    case = cases(arch)
    out = tmp_path / "ckpt.safetensors"
    cmd = [tandem, "debug", "grad", "--model", str(case / "model"), "--adapter", str(case / "adapter"),
           "--tokens", str(case / "tokens.json"), "--labels", str(case / "labels.json"), "--out", str(out),
           "--gradient-checkpointing", "--loss-chunk-tokens", "3"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    verdict = R.compare_case(case, out)
    assert verdict["ok"], verdict["failures"]


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "mixtral", "qwen2_moe"])
def test_exported_fused_adapter_loads_in_peft_with_the_same_logits(tandem, cases, tmp_path, arch):
    case = cases(arch)
    exported = tmp_path / "fused"
    result = subprocess.run([tandem, "debug", "export-adapter", "--model", str(case / "model"), "--adapter",
                             str(case / "adapter_per_expert"), "--out", str(exported), "--format", "fused"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    tokens = json.loads((case / "tokens.json").read_text())
    labels = json.loads((case / "labels.json").read_text())
    ours = R.reference_forward(case / "model", exported, tokens, labels, "fp32")
    ref = R.load_outputs(case / "reference.safetensors")
    mask = R.mask_from_lengths([len(t) for t in tokens], ref["logits"].shape[1])
    assert R.rel_l2(R.valid_positions(ours["logits"], mask), R.valid_positions(ref["logits"], mask)) < 1e-5
    # PEFT's own grads through our file, mapped back per expert, equal the reference grads too.
    expected = R.tandem_expected_grads(ours)
    for key, grad in ref["grads"].items():
        assert R.rel_l2(expected[key], grad) < 1e-4, key


def test_exported_per_expert_adapter_round_trips(tandem, cases, tmp_path):
    case = cases("deepseek_v3")
    exported = tmp_path / "per_expert"
    result = subprocess.run([tandem, "debug", "export-adapter", "--model", str(case / "model"), "--adapter",
                             str(case / "adapter"), "--out", str(exported), "--format", "per-expert"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    ours = load_file(str(exported / R.ADAPTER_FILE))
    theirs = load_file(str(case / "adapter_per_expert" / R.ADAPTER_FILE))
    assert set(ours) == set(theirs)
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-7, msg=key)
