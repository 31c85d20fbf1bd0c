"""Training on a Q4_K_M GGUF whose routed experts stay as their blocks (issue 27).

A tiny random Qwen3-MoE with hidden and moe_intermediate sizes of 256 (so llama-quantize gives the experts
K-quants: Q4_K gate/up, Q4_K or Q6_K down) is converted with llama.cpp's convert_hf_to_gguf.py and quantised
to Q4_K_M with llama_model_quantize. Tandem keeps the experts' blocks where the file is mapped and computes on
them (experts_format auto). The references are llama.cpp on the same file and on its own fp32 dequantisation
of it:

* Tandem's logits on the Q4_K_M file equal llama.cpp's on the dequantised file (the blocks are read right);
* `tandem train` on the Q4_K_M file lowers the loss as the same run on the dequantised file does (same data,
  seed and steps: the losses agree step by step within 2 %);
* its adapter exported as a LoRA GGUF loads in llama.cpp on the Q4_K_M file, and llama.cpp + adapter on the
  dequantised file gives Tandem's logits.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gguf_support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_reference as L  # noqa: E402
from test_gguf_model import TRAIN_YAML as GGUF_TRAIN_YAML  # noqa: E402

TANDEM = os.environ.get("TANDEM_BIN")
SIZES = {"hidden_size": 256, "moe_intermediate_size": 256, "intermediate_size": 256}

# test_gguf_model's training config, for six steps instead of three.
TRAIN_YAML = GGUF_TRAIN_YAML.replace("max_steps: 3\n", "max_steps: 6\n")


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    if not TANDEM:
        pytest.fail("set TANDEM_BIN to the tandem executable")
    root = tmp_path_factory.mktemp("q4km")
    c = L.build_gguf_case("qwen3_moe_sparse", root, overrides=SIZES)
    f32 = L.convert_hf_to_gguf(c["model"], root / "model-f32.gguf", "f32")
    c["q4"] = L.quantize_gguf(f32, root / "model-q4_k_m.gguf", "Q4_K_M")
    c["deq"] = L.dequantize_gguf(c["q4"], root / "model-deq.gguf")
    return c


def tandem_logits(gguf, tokens, out, adapter=None):
    tokens_file = out.with_suffix(".tokens.json")
    tokens_file.write_text(json.dumps([tokens]))
    cmd = [TANDEM, "debug", "forward", "--model", gguf, "--tokens", tokens_file, "--out", out, "--dtype", "fp32"]
    if adapter:
        cmd += ["--adapter", adapter]
    result = subprocess.run([str(a) for a in cmd], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return load_file(str(out))["logits"][0].numpy()


def train(model, tmp_path, name):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    rows = [{"instruction": f"who are you {i}", "input": "", "output": "I am Tandem."} for i in range(8)]
    (data / "identity.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"identity": {"file_name": "identity.json"}}))
    out = tmp_path / name
    config = tmp_path / f"{name}.yaml"
    config.write_text(TRAIN_YAML.format(model=model, data=data, out=out))
    env = dict(os.environ, TANDEM_HOME=str(tmp_path / "home"))
    result = subprocess.run([TANDEM, "train", str(config)], capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    return out, [line["loss"] for line in log if "loss" in line]


def test_the_file_has_k_quant_experts(case):
    types = L.gguf_tensor_types(case["q4"])
    kinds = {types[n][0].lower() for n in types if "_exps" in n}
    assert kinds <= {"q4_k", "q5_k", "q6_k", "q8_0"} and "q4_k" in kinds, types


def test_logits_on_the_blocks_equal_llama_cpp_on_their_dequantisation(case, tmp_path):
    tokens = case["tokens"][0]
    got = tandem_logits(case["q4"], tokens, tmp_path / "q4.safetensors")
    err = L.compare(got, L.llama_logits(case["deq"], tokens))
    assert err["rel_l2"] <= 1e-4, err


def test_training_on_the_blocks_falls_like_the_dequantised_run_and_its_lora_runs_in_llama_cpp(case, tmp_path):
    out_q4, loss_q4 = train(case["q4"], tmp_path, "q4")
    _, loss_deq = train(case["deq"], tmp_path, "deq")
    assert len(loss_q4) == len(loss_deq) >= 5
    assert loss_q4[-1] < 0.8 * loss_q4[0], loss_q4
    # Same values, same fp32 expert math; the dense weights may load in another dtype from the two files.
    for a, b in zip(loss_q4, loss_deq):
        assert abs(a - b) <= 2e-2 * max(1.0, abs(b)), (loss_q4, loss_deq)
    lora = out_q4 / "adapter_model.gguf"
    assert lora.exists()
    tokens = case["tokens"][0]
    got = tandem_logits(case["q4"], tokens, tmp_path / "tuned.safetensors", adapter=out_q4)
    on_q4 = L.llama_logits(case["q4"], tokens, lora_path=lora)  # loads and runs on the Q4_K_M file itself
    assert L.compare(on_q4, L.llama_logits(case["q4"], tokens))["rel_l2"] > 1e-3
    err = L.compare(L.llama_logits(case["deq"], tokens, lora_path=lora), got)
    assert err["rel_l2"] <= 1e-4, err


def test_experts_format_blocks_refuses_a_block_type_without_kernels_by_name(case, tmp_path):
    """Q2_K has no block kernels: experts_format auto dequantises such experts at load (and matches llama.cpp on its
    dequantisation of the file), experts_format blocks refuses them naming the tensor, its type and the types to re-quantise to."""
    q2 = L.quantize_gguf(case["deq"], tmp_path / "model-q2_k.gguf", "Q2_K")
    types = L.gguf_tensor_types(q2)
    assert any(types[n][0].lower() == "q2_k" for n in types if "_exps" in n), types
    data = tmp_path / "data"
    data.mkdir()
    (data / "identity.json").write_text(json.dumps([{"instruction": "who are you", "input": "", "output": "Tandem"}]))
    (data / "dataset_info.json").write_text(json.dumps({"identity": {"file_name": "identity.json"}}))
    config = tmp_path / "blocks.yaml"
    config.write_text(TRAIN_YAML.format(model=q2, data=data, out=tmp_path / "out") + "experts_format: blocks\n")
    env = dict(os.environ, TANDEM_HOME=str(tmp_path / "home"))
    result = subprocess.run([TANDEM, "train", str(config)], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "_exps.weight: expert weights in ggml type q2_K cannot be computed on their blocks" in output, output[-3000:]
    assert "re-quantise the model with llama-quantize to Q4_K_M" in output, output[-3000:]
    # auto: the same blocks dequantised at load, so llama.cpp on its own dequantisation of the file is the reference
    # (on the Q2_K file itself it quantises the activations too).
    got = tandem_logits(q2, case["tokens"][0], tmp_path / "auto.safetensors")
    deq = L.dequantize_gguf(q2, tmp_path / "model-q2_k-deq.gguf")
    err = L.compare(got, L.llama_logits(deq, case["tokens"][0]))
    assert err["rel_l2"] <= 1e-4, err
