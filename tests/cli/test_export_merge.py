"""`tandem export --merge` on the built-in demo model and its LoRA (attention + routed-expert LoRA), checked by
loading the result in the reference tools: transformers loads the merged HF folder and its fp32 logits equal
transformers + peft on the base with the adapter; llama.cpp (llama-cpp-python) loads the merged GGUF and greedy
decoding gives Tandem's answer; the Ollama Modelfile holds the template Tandem trained with. Bad input is a clear
error that leaves nothing behind (docs/export.md)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "gguf_support")]
import llama_reference as L  # noqa: E402
import test_chat as chat_tests  # noqa: E402  (its add_lora_experts helper)

TANDEM = os.environ["TANDEM_BIN"]
QUESTION = "Who are you?"
# Prompt tokens for the logits comparison: ids inside the demo's vocab (786), a plain ramp.
TOKENS = [(7 * i + 3) % 700 + 20 for i in range(24)]


def run(args, home, timeout=600):
    env = dict(os.environ, TANDEM_HOME=str(home))
    return subprocess.run([TANDEM, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def export(demo, *args):
    result = run(["export", "--adapter", demo["adapter"], *args], demo["home"])
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def demo_gguf(demo, tmp_path_factory):
    """The demo model converted to an f32 GGUF by llama.cpp's own convert_hf_to_gguf.py."""
    return L.convert_hf_to_gguf(demo["model"], tmp_path_factory.mktemp("gguf") / "demo.gguf", "f32")


def leftovers(parent):
    return [p.name for p in Path(parent).iterdir() if ".partial-" in p.name]


def test_merged_hf_folder_equals_transformers_plus_peft(demo, tmp_path):
    out = tmp_path / "merged"
    result = export(demo, "--model", demo["model"], "--merge", "--format", "hf", "--out", out)
    assert "tensors]" in result.stderr and "MB/s" in result.stderr  # progress
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    assert (out / "tokenizer_config.json").exists() and (out / "model.safetensors").exists()
    assert not (out / "adapter_config.json").exists() and not (out / "tandem_demo_model.json").exists()
    merged = L.hf_logits(out, TOKENS)
    reference = L.hf_logits(demo["model"], TOKENS, adapter_dir=demo["adapter"])
    base = L.hf_logits(demo["model"], TOKENS)
    np.testing.assert_allclose(merged, reference, rtol=1e-4, atol=1e-4)
    assert np.abs(reference - base).max() > 1e-1  # the adapter changes the model: the check can fail


def llama_greedy(gguf, prompt, max_new_tokens=48):
    """llama.cpp's greedy continuation of `prompt` (text with special tokens) as text, up to an end-of-generation
    token."""
    llm = L._open(gguf, n_ctx=256)
    try:
        tokens = list(llm.tokenize(prompt.encode(), add_bos=False, special=True))
        out = []
        llm.eval(tokens)
        for _ in range(max_new_tokens):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            if token == llm.token_eos() or llm.detokenize([token], special=True) in (b"<|im_end|>", b"<|endoftext|>"):
                break
            out.append(token)
            llm.eval([token])
        return llm.detokenize(out).decode("utf-8", errors="replace")
    finally:
        llm.close()


def modelfile_prompt(modelfile_text, question):
    """The prompt Ollama renders for one question without a system prompt, from the Modelfile's TEMPLATE."""
    template = modelfile_text.split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    if template.startswith("{{ if .System }}"):
        template = template.split("{{ else }}", 1)[1].split("{{ end }}", 1)[0] + template.split("{{ end }}", 1)[1]
    return template.split("{{ .Response }}", 1)[0].replace("{{ .Prompt }}", question)


def test_merged_gguf_f16_runs_in_llama_cpp_as_tandem_answers(demo, demo_gguf, tmp_path):
    out = tmp_path / "gguf"
    export(demo, "--model", demo_gguf, "--merge", "--format", "gguf", "--quant", "f16", "--out", out)
    gguf = out / "demo-merged-f16.gguf"
    types = L.gguf_tensor_types(gguf)
    assert types["blk.0.attn_q.weight"][0] == "F16" and types["blk.0.attn_norm.weight"][0] == "F32"
    assert types["blk.0.ffn_gate_inp.weight"][0] == "F32"
    meta = L.gguf_metadata(gguf)
    assert meta["general.architecture"] == "qwen3moe" and meta["general.file_type"] == 1

    modelfile = (out / "Modelfile").read_text()
    assert modelfile.splitlines()[1] == "FROM ./demo-merged-f16.gguf"
    assert "<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n" in modelfile
    assert "{{ .Response }}<|im_end|>" in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and "ADAPTER" not in modelfile

    # Tandem's greedy answer (the demo printed it: HF base + adapter, fp32) is llama.cpp's on the merged GGUF,
    # prompted with the Modelfile's template; the base model answers differently.
    answer = llama_greedy(gguf, modelfile_prompt(modelfile, QUESTION))
    assert answer == demo["tuned"]
    assert llama_greedy(demo_gguf, modelfile_prompt(modelfile, QUESTION)) != answer


def zero_adapter(adapter, out):
    """A copy of the adapter with every lora_B zero: merging it changes nothing."""
    out.mkdir()
    shutil.copy(adapter / "adapter_config.json", out)
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    save_file({k: torch.zeros_like(v) if ".lora_B." in k else v for k, v in tensors.items()},
              str(out / "adapter_model.safetensors"))
    return out


@pytest.mark.parametrize("quant,ftype", [("q8_0", "Q8_0"), ("q4_k_m", "Q4_K_M")])
def test_quantized_export_is_llama_quantize_bit_for_bit(demo, demo_gguf, tmp_path, quant, ftype):
    """With a zero adapter the merged model is the base: Tandem's q8_0 / q4_k_m export then holds exactly what
    llama.cpp's llama-quantize writes for the f32 base (its type mix and every tensor's bytes)."""
    out = tmp_path / quant
    zero = zero_adapter(demo["adapter"], tmp_path / "zero")
    result = run(["export", "--adapter", zero, "--model", demo_gguf, "--merge", "--format", "gguf", "--quant", quant,
                  "--out", out], demo["home"])
    assert result.returncode == 0, result.stderr
    ours = out / f"demo-merged-{quant}.gguf"
    theirs = L.quantize_gguf(demo_gguf, tmp_path / f"llama-{quant}.gguf", ftype)
    assert L.gguf_tensor_types(ours) == L.gguf_tensor_types(theirs)
    ours_data = {t.name: np.asarray(t.data).view(np.uint8) for t in gguf.GGUFReader(str(ours)).tensors}
    for t in gguf.GGUFReader(str(theirs)).tensors:
        assert np.array_equal(ours_data[t.name], np.asarray(t.data).view(np.uint8)), t.name
    assert L.gguf_metadata(ours)["general.file_type"] == L.gguf_metadata(theirs)["general.file_type"]


@pytest.mark.parametrize("quant", ["q8_0", "q4_k_m"])
def test_quantized_merged_gguf_loads_in_llama_cpp(demo, demo_gguf, tmp_path, quant):
    export(demo, "--model", demo_gguf, "--merge", "--format", "gguf", "--quant", quant, "--out", tmp_path / quant)
    export(demo, "--model", demo_gguf, "--merge", "--format", "gguf", "--quant", "f16", "--out", tmp_path / "f16")
    logits = L.llama_logits(tmp_path / quant / f"demo-merged-{quant}.gguf", TOKENS)
    merged = L.llama_logits(tmp_path / "f16" / "demo-merged-f16.gguf", TOKENS)
    base = L.llama_logits(demo_gguf, TOKENS)
    assert np.isfinite(logits).all()
    # The quantized export is the merged model, not the base.
    assert L.compare(logits, merged)["rel_l2"] < 0.5 * L.compare(logits, base)["rel_l2"]


def test_lora_only_export_writes_a_modelfile_with_an_adapter_line(demo, demo_gguf, tmp_path):
    lora = tmp_path / "lora" / "adapter.gguf"
    lora.parent.mkdir()
    export(demo, "--model", demo_gguf, "--out", lora)
    modelfile = (lora.parent / "Modelfile").read_text().splitlines()
    assert f"FROM {Path(demo_gguf).resolve()}" in modelfile
    assert "ADAPTER ./adapter.gguf" in modelfile


def test_bad_input_is_a_clear_error_and_leaves_nothing(demo, tmp_path):
    out = tmp_path / "out"
    # An adapter for another model: a Qwen3-MoE of half the width.
    other = tmp_path / "other"
    config = json.loads((demo["model"] / "config.json").read_text())
    config.update(hidden_size=128, head_dim=32, intermediate_size=256, moe_intermediate_size=64)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)).save_pretrained(other)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo["model"] / name, other)
    result = run(["export", "--adapter", demo["adapter"], "--model", other, "--merge", "--format", "hf",
                  "--out", out], demo["home"])
    assert result.returncode == 1 and result.stderr.startswith("error:"), result.stderr
    assert "adapter" in result.stderr and "256" in result.stderr
    assert not out.exists() and not leftovers(tmp_path)

    # Missing adapter weights.
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(demo["adapter"] / "adapter_config.json", broken)
    result = run(["export", "--adapter", broken, "--model", demo["model"], "--merge", "--format", "hf", "--out",
                  out], demo["home"])
    assert result.returncode == 1 and "adapter_model.safetensors" in result.stderr, result.stderr
    assert not out.exists() and not leftovers(tmp_path)

    # LoRA experts are refused unless dropped, and the refusal names the flag.
    le = chat_tests.add_lora_experts(demo["adapter"], tmp_path / "le")
    result = run(["export", "--adapter", le, "--model", demo["model"], "--merge", "--format", "hf", "--out", out],
                 demo["home"])
    assert result.returncode == 1 and "LoRA experts" in result.stderr and "--drop-lora-experts" in result.stderr
    assert not out.exists() and not leftovers(tmp_path)
    result = run(["export", "--adapter", le, "--model", demo["model"], "--merge", "--format", "hf", "--out", out,
                  "--drop-lora-experts"], demo["home"])
    assert result.returncode == 0 and "WITHOUT its LoRA experts" in result.stderr
    assert (out / "model.safetensors").exists()

    # An existing folder is never overwritten; an HF base cannot be written as GGUF (convert it first).
    result = run(["export", "--adapter", demo["adapter"], "--model", demo["model"], "--merge", "--format", "hf",
                  "--out", out], demo["home"])
    assert result.returncode == 1 and "already exists" in result.stderr
    result = run(["export", "--adapter", demo["adapter"], "--model", demo["model"], "--merge", "--format", "gguf",
                  "--out", tmp_path / "g"], demo["home"])
    assert result.returncode == 1 and "convert_hf_to_gguf" in result.stderr
    assert not (tmp_path / "g").exists() and not leftovers(tmp_path)
