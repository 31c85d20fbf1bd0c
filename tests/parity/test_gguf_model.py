"""GGUF models against llama.cpp (llama-cpp-python) and transformers.

Each case is a tiny random HF model (tests/parity/reference.py) converted with llama.cpp's own
convert_hf_to_gguf.py and quantized with its llama_model_quantize (tests/gguf_support/llama_reference.py).
Tandem reads the GGUF file; the references are llama.cpp on the same file and transformers (+ peft) on the
HF directory it came from:

* logits of the f32 GGUF equal llama.cpp's and transformers';
* logits of a quantized GGUF (a mix of Q8_0 / Q5_x / Q4_0 / F16 blocks at these sizes, and K-quants where
  rows allow) equal llama.cpp's on the f32 GGUF that llama.cpp dequantized from it;
* a PEFT adapter exported with `tandem export` loads in llama.cpp and gives transformers + peft's logits;
* `tandem train` on a GGUF model writes adapter_model.gguf, and llama.cpp with it gives Tandem's logits;
* the tokenizer rebuilt from the metadata encodes as the HF tokenizer.json does;
* `tandem inspect` counts the HF model's parameters.
"""
import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "gguf_support")]

import reference as R  # noqa: E402
import llama_reference as L  # noqa: E402
import tokenizer_fixtures  # noqa: E402

TANDEM = os.environ.get("TANDEM_BIN")
TOKENIZE_TOOL = os.environ.get("TANDEM_TOKENIZE_TOOL")
FP32_REL = 1e-4

# Architectures as llama.cpp can hold them: every qwen MoE layer sparse (llama.cpp has no dense layer in
# qwen2moe/qwen3moe), DeepSeek-V2 with plain top-k (llama.cpp ranks expert groups by DeepSeek-V3's rule).
ARCHS = {
    "qwen3_moe_sparse": {},
    "qwen2_moe_sparse": {},
    "mixtral": {},
    "deepseek_v3": {},
    "deepseek_v2": {"topk_method": "greedy", "n_group": 1, "topk_group": 1},
    "llama": {},
    "llama3": {},  # Llama-3.1 rope scaling (the file has per-frequency divisors, rope_freqs.weight) and tied embeddings
    "qwen2": {},
    "qwen3": {},
}
QUANTIZED = {"qwen3_moe_sparse": "Q4_K_M", "mixtral": "Q8_0", "deepseek_v3": "Q4_0", "qwen2_moe_sparse": "Q5_K_M"}
# llama.cpp runs no LoRA on DeepSeek's MLA projections and kv_b_proj has no GGUF LoRA form (docs/gguf.md).
DEEPSEEK_LORA_TARGETS = ["o_proj", "gate_proj", "up_proj", "down_proj"]


def run(cmd, timeout=600):
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd[:3]} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    if not TANDEM:
        pytest.fail("set TANDEM_BIN to the tandem executable")
    built = {}

    def get(arch):
        if arch not in built:
            root = tmp_path_factory.mktemp(arch)
            case = L.build_gguf_case(arch, root, overrides=ARCHS[arch] or None)
            case["gguf"] = L.convert_hf_to_gguf(case["model"], root / "model-f32.gguf", "f32")
            built[arch] = case
        return built[arch]

    return get


def tandem_logits(gguf, tokens, out, adapter=None, extra=()):
    """`tandem debug forward` logits [len(tokens), vocab] of one unpadded row."""
    tokens_file = out.with_suffix(".tokens.json")
    tokens_file.write_text(json.dumps([tokens]))
    cmd = [TANDEM, "debug", "forward", "--model", gguf, "--tokens", tokens_file, "--out", out, "--dtype", "fp32", *extra]
    if adapter:
        cmd += ["--adapter", adapter]
    run(cmd)
    return load_file(str(out))["logits"][0].numpy()


def assert_close(got, ref, rel=FP32_REL, what=""):
    err = L.compare(got, ref)
    assert err["rel_l2"] <= rel, f"{what}: {err}"


@pytest.mark.parametrize("arch", list(ARCHS))
def test_f32_gguf_logits_equal_llama_cpp_and_transformers(cases, tmp_path, arch):
    case = cases(arch)
    tokens = case["tokens"][0]
    got = tandem_logits(case["gguf"], tokens, tmp_path / "out.safetensors")
    assert_close(got, L.llama_logits(case["gguf"], tokens), what="against llama.cpp")
    assert_close(got, L.hf_logits(case["model"], tokens), what="against transformers")


@pytest.mark.parametrize("arch", list(QUANTIZED))
def test_quantized_gguf_equals_llama_cpp_on_its_own_dequantization(cases, tmp_path, arch):
    case = cases(arch)
    quantized = L.quantize_gguf(case["gguf"], tmp_path / "model-q.gguf", QUANTIZED[arch])
    types = {t for t, _ in L.gguf_tensor_types(quantized).values()}
    assert len(types - {"F32", "F16"}) >= 1, types  # some tensors really are in blocks
    dequantized = L.dequantize_gguf(quantized, tmp_path / "model-deq.gguf")
    tokens = case["tokens"][0]
    got = tandem_logits(quantized, tokens, tmp_path / "out.safetensors")
    assert_close(got, L.llama_logits(dequantized, tokens), what=f"{QUANTIZED[arch]} against llama.cpp's dequantization")
    # and the blocks matter: the f32 model's logits are measurably different
    assert L.compare(got, L.llama_logits(case["gguf"], tokens))["rel_l2"] > 10 * FP32_REL


@pytest.mark.parametrize("arch", list(ARCHS))
def test_exported_lora_loads_in_llama_cpp_and_equals_peft(cases, tmp_path, arch):
    case = cases(arch)
    adapter = case["adapter"]  # PEFT 0.18.1's fused expert form, Tandem reads it
    if arch.startswith("deepseek"):
        adapter = R.make_adapter(case["model"], tmp_path / "adapter", targets=DEEPSEEK_LORA_TARGETS)["fused"]
    lora = tmp_path / "lora.gguf"
    run([TANDEM, "export", "--adapter", adapter, "--model", case["gguf"], "--out", lora])
    tokens = case["tokens"][0]
    with_lora = L.llama_logits(case["gguf"], tokens, lora_path=lora)
    assert_close(with_lora, L.hf_logits(case["model"], tokens, adapter_dir=adapter), what="llama.cpp + LoRA vs peft")
    assert L.compare(with_lora, L.llama_logits(case["gguf"], tokens))["rel_l2"] > 1e-2  # the adapter does something
    # And back: Tandem reads the LoRA GGUF and gives llama.cpp's logits with it.
    got = tandem_logits(case["gguf"], tokens, tmp_path / "gguf_lora.safetensors", adapter=lora)
    assert_close(got, with_lora, what="Tandem + the LoRA GGUF vs llama.cpp + it")
    meta = L.gguf_metadata(lora)
    assert meta["general.type"] == "adapter" and meta["adapter.type"] == "lora"
    if not arch.startswith("deepseek"):
        # llama.cpp's own convert_lora_to_gguf.py writes the same tensors under the same names
        theirs = L.gguf_tensors_f32(L.convert_peft_to_gguf_lora(adapter, case["model"], tmp_path / "theirs.gguf"))
        ours = L.gguf_tensors_f32(lora)
        assert sorted(ours) == sorted(theirs)
        for name, value in theirs.items():
            assert ours[name].shape == value.shape, name
            np.testing.assert_allclose(ours[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
        assert meta["adapter.lora.alpha"] == pytest.approx(L.gguf_metadata(tmp_path / "theirs.gguf")["adapter.lora.alpha"])
        # A LoRA GGUF that llama.cpp's own converter wrote reads the same.
        got = tandem_logits(case["gguf"], tokens, tmp_path / "theirs.safetensors", adapter=tmp_path / "theirs.gguf")
        assert_close(got, with_lora, what="Tandem + llama.cpp's converted LoRA vs llama.cpp + ours")


def test_a_lora_gguf_applies_only_to_its_gguf_model(cases, tmp_path):
    case = cases("qwen3_moe_sparse")
    lora = tmp_path / "lora.gguf"
    run([TANDEM, "export", "--adapter", case["adapter"], "--model", case["gguf"], "--out", lora])
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps([case["tokens"][0]]))
    result = subprocess.run([TANDEM, "debug", "forward", "--model", str(case["model"]), "--tokens", str(tokens),
                             "--out", str(tmp_path / "out.safetensors"), "--adapter", str(lora)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "llama.cpp LoRA" in result.stderr, result.stderr
    llama = cases("llama")
    result = subprocess.run([TANDEM, "debug", "forward", "--model", str(llama["gguf"]), "--tokens", str(tokens),
                             "--out", str(tmp_path / "out.safetensors"), "--adapter", str(lora)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "is a LoRA for qwen3moe" in result.stderr, result.stderr


def test_export_refuses_what_llama_cpp_cannot_apply(cases, tmp_path):
    case = cases("deepseek_v3")
    result = subprocess.run([TANDEM, "export", "--adapter", str(case["adapter"]), "--model", str(case["gguf"]),
                             "--out", str(tmp_path / "lora.gguf")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "kv_b_proj" in result.stderr and "lora_target" in result.stderr, result.stderr
    assert not (tmp_path / "lora.gguf").exists()


TRAIN_YAML = """\
model_name_or_path: {model}
stage: sft
do_train: true
finetuning_type: lora
lora_target: all
lora_rank: 4
lora_alpha: 8
dataset: identity
dataset_dir: {data}
template: qwen3_nothink
cutoff_len: 64
max_samples: 8
output_dir: {out}
overwrite_output_dir: true
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
learning_rate: 1.0e-2
num_train_epochs: 1
max_steps: 3
logging_steps: 1
save_steps: 100
seed: 1
"""


def test_training_on_a_gguf_model_writes_a_lora_llama_cpp_runs(cases, tmp_path):
    case = cases("qwen3_moe_sparse")
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"instruction": f"who are you {i}", "input": "", "output": "I am Tandem."} for i in range(8)]
    (data / "identity.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"identity": {"file_name": "identity.json"}}))
    out = tmp_path / "out"
    config = tmp_path / "train.yaml"
    config.write_text(TRAIN_YAML.format(model=case["gguf"], data=data, out=out))
    env = dict(os.environ, TANDEM_HOME=str(tmp_path / "home"))
    result = subprocess.run([TANDEM, "train", str(config)], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lora = out / "adapter_model.gguf"
    assert lora.exists() and "llama.cpp LoRA written" in result.stdout + result.stderr
    tokens = case["tokens"][0]
    got = tandem_logits(case["gguf"], tokens, tmp_path / "tuned.safetensors", adapter=out)
    assert_close(L.llama_logits(case["gguf"], tokens, lora_path=lora), got, what="llama.cpp + trained LoRA vs Tandem")
    assert L.compare(got, L.llama_logits(case["gguf"], tokens))["rel_l2"] > 1e-3  # training moved the model


@pytest.mark.parametrize("arch", ["qwen3_moe_sparse", "llama", "deepseek_v3"])
def test_tokenizer_from_metadata_encodes_as_the_hf_tokenizer(cases, tmp_path, arch):
    from tokenizers import Tokenizer

    case = cases(arch)
    hf = Tokenizer.from_file(str(case["model"] / "tokenizer.json"))
    # llama.cpp skips Qwen's NFC normalizer; on NFC text all three must agree.
    texts = [unicodedata.normalize("NFC", t) for t in tokenizer_fixtures.test_strings(120, seed=7)]
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps(t) + "\n" for t in texts))
    run([TOKENIZE_TOOL, case["gguf"], lines, tmp_path / "out.jsonl"])
    ours = [json.loads(line)["ids"] for line in (tmp_path / "out.jsonl").read_text().split("\n") if line]
    for text, ids in zip(texts, ours):
        assert ids == hf.encode(text, add_special_tokens=False).ids, repr(text)
    # llama.cpp's BPE and Unicode tables are its own and differ from tokenizers' on some non-ASCII text; on
    # ASCII (every regex branch, contractions, digits, code) it must agree too.
    ascii_texts = [(t, ids) for t, ids in zip(texts, ours) if t.isascii()]
    assert len(ascii_texts) >= 10
    for text, ids in ascii_texts:
        assert ids == L.llama_tokenize(case["gguf"], text, add_bos=False, special=False), repr(text)


def test_inspect_counts_the_hf_models_parameters(cases):
    case = cases("qwen3_moe_sparse")
    from_gguf = json.loads(run([TANDEM, "inspect", case["gguf"], "--json"]).stdout)
    from_hf = json.loads(run([TANDEM, "inspect", case["model"], "--json"]).stdout)
    assert from_gguf["parameters"] == from_hf["parameters"]
    assert from_gguf["architecture"] == from_hf["architecture"]


def test_bad_gguf_files_are_refused_with_what_to_do(cases, tmp_path):
    case = cases("qwen3_moe_sparse")
    data = Path(case["gguf"]).read_bytes()
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    for path in (truncated,):
        result = subprocess.run([TANDEM, "inspect", str(path)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 1, result.stderr
        assert "cut.gguf" in result.stderr and "error:" in result.stderr, result.stderr


def test_sentencepiece_vocab_encodes_as_sentencepiece_and_llama_cpp(tmp_path):
    """Mixtral / Llama-2 GGUFs carry a SentencePiece vocabulary (tokenizer.ggml.model "llama", no merges)."""
    import random

    import sentencepiece as spm

    rng = random.Random(3)
    words = tokenizer_fixtures.WORDS["en"] + tokenizer_fixtures.WORDS["de"] + tokenizer_fixtures.WORDS["ru"]
    (tmp_path / "corpus.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)))
    # As Llama-2's tokenizer.model: BPE with byte fallback, no normalization, whitespace kept, digits split.
    spm.SentencePieceTrainer.train(input=str(tmp_path / "corpus.txt"), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=500, model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, split_digits=True, num_threads=2, minloglevel=2)
    case = L.build_gguf_case("mixtral", tmp_path / "case", vocab_size=500)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (case["model"] / name).unlink(missing_ok=True)
    (case["model"] / "tokenizer.model").write_bytes((tmp_path / "sp.model").read_bytes())
    (case["model"] / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>"}))
    gguf = L.convert_hf_to_gguf(case["model"], tmp_path / "model.gguf", "f32")
    assert L.gguf_metadata(gguf)["tokenizer.ggml.model"] == "llama"

    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    texts = [" ".join(rng.choice(words + ["  ", "\n", "1234", "日本", "😀"]) for _ in range(rng.randint(1, 10)))
             for _ in range(150)] + tokenizer_fixtures.test_strings(50, seed=3)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(t) + "\n" for t in texts)
                                       + json.dumps({"text": "hello", "add_special_tokens": True}) + "\n")
    run([TOKENIZE_TOOL, gguf, tmp_path / "in.jsonl", tmp_path / "out.jsonl"])
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().split("\n") if line]
    for text, line in zip(texts, out):
        assert line["ids"] == sp.encode(text), repr(text)
        assert line["decoded"] == text, repr(text)
    for text, line in list(zip(texts, out))[:60]:
        assert line["ids"] == L.llama_tokenize(gguf, text, add_bos=False, special=False), repr(text)
    assert out[-1]["ids"] == [sp.bos_id()] + sp.encode("hello")  # add_bos_token from the metadata
