"""llama.cpp as the GGUF reference: convert HF dirs and PEFT adapters to GGUF, quantize, tokenize, run logits.

Everything goes through the project venv (scripts/setup.sh): llama-cpp-python 0.3.36 (the binding and the llama.cpp
it vendors, built for this CPU) and that same sdist's convert_hf_to_gguf.py / convert_lora_to_gguf.py / conversion/ /
gguf-py, copied to <venv>/share/llama.cpp. The converters run in a subprocess with the venv's python and the vendored
gguf-py first on sys.path (the converters need it: it is newer than PyPI's gguf 0.19.0 and names tensors/keys that
0.19.0 lacks). docs/gguf_llama_cpp.md has the format facts behind the choices below.

Typical use (tests/parity/reference.py makes the tiny HF models and PEFT adapters):

    case = build_gguf_case("qwen3_moe_sparse", tmp / "case")                  # reference.build_case + tokenizer
    f32 = convert_hf_to_gguf(case["model"], tmp / "m.gguf")                   # every tensor f32
    q4 = quantize_gguf(f32, tmp / "m.q4_k_m.gguf", "Q4_K_M")
    logits = llama_logits(f32, case["tokens"][0])                             # np.float32 [len, vocab]
    lora = convert_peft_to_gguf_lora(case["adapter"], case["model"], tmp / "lora.gguf")
    tuned = llama_logits(f32, case["tokens"][0], lora_path=lora)              # ~ hf_logits(model, tokens, adapter)

reference.py's qwen3_moe / qwen2_moe fixtures have a dense layer 0, which neither the converter nor llama.cpp's
qwen2moe/qwen3moe support; EXTRA_ARCHS has all-sparse variants. llama.cpp matches transformers to ~5e-7 rel-L2 on the
f32 conversions of every supported arch except deepseek_v2's group_limited_greedy routing (see the facts doc).

Tokenizers. The converter wants tokenizer files next to config.json and refuses BPE tokenizers whose pre-tokenizer
it does not recognise: it hashes the token ids of a fixed text and looks the hash up (conversion/base.py
get_vocab_base_pre), and our seeded fixture tokenizers (tests/parity/tokenizer_fixtures.py, resources/demo) hash to
nothing it knows. We import the converter as a module and replace TextModel.get_vocab_base_pre by one that returns
the llama.cpp pre-tokenizer whose regexes are the tokenizer.json's Split regexes (see PRE_TOKENIZERS): "qwen2" for
the Qwen2/2.5/3 split, "llama-bpe" for Llama-3's, "deepseek-v3" for DeepSeek-V3's three splits, "gpt-2" for the plain
GPT-2 ByteLevel regex. That is exactly what the hash would pick for the real families' tokenizers, and it keeps the
choice tied to what llama.cpp will actually run (src/llama-vocab.cpp llm_tokenizer_bpe).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PARITY = HERE.parent / "parity"

VENV = Path(os.environ.get("TANDEM_VENV") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
            / "tandem" / "venv")
# The vendored llama.cpp python tree (convert_*.py, conversion/, gguf-py/); TANDEM_LLAMA_CPP_DIR overrides.
LLAMA_CPP_DIR = Path(os.environ.get("TANDEM_LLAMA_CPP_DIR") or VENV / "share" / "llama.cpp")
PYTHON = str(VENV / "bin" / "python") if (VENV / "bin" / "python").exists() else sys.executable

# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------

# tokenizer.ggml.pre name -> the Split regexes of tokenizer.json's pre_tokenizer that it stands for (the HF side of
# the regexes llama.cpp hard-codes per pre type in src/llama-vocab.cpp llm_tokenizer_bpe). "gpt-2" is the
# ByteLevel(use_regex=True) pre-tokenizer with no Split.
def _pre_tokenizers():
    sys.path.insert(0, str(PARITY))
    try:
        import tokenizer_fixtures as T
    finally:
        sys.path.remove(str(PARITY))
    return {"qwen2": [T.QWEN2_PATTERN], "llama-bpe": [T.LLAMA3_PATTERN], "deepseek-v3": list(T.DEEPSEEK_V3_PATTERNS)}


PRE_TOKENIZERS = _pre_tokenizers()

# HF model_type -> tokenizer_fixtures family used by write_tokenizer() when none is given.
DEFAULT_FAMILY = {"qwen2": "qwen2", "qwen3": "qwen2", "qwen2_moe": "qwen2", "qwen3_moe": "qwen2",
                  "llama": "llama3", "mixtral": "llama3", "deepseek_v2": "deepseek_v3", "deepseek_v3": "deepseek_v3"}


def detect_tokenizer_pre(tokenizer_json):
    """tokenizer.json (path or parsed dict) -> the llama.cpp tokenizer.ggml.pre name whose regexes it uses, or None.

    Only byte-level BPE tokenizers get a name (SentencePiece-style BPE with byte_fallback converts to
    tokenizer.ggml.model "llama" and has no pre-tokenizer)."""
    data = tokenizer_json if isinstance(tokenizer_json, dict) else json.loads(Path(tokenizer_json).read_text())
    pre = data.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    splits = [p["pattern"].get("Regex") for p in parts if p.get("type") == "Split"]
    byte_level = [p for p in parts if p.get("type") == "ByteLevel"]
    if not splits and byte_level and byte_level[0].get("use_regex", True):
        return "gpt-2"
    for name, patterns in PRE_TOKENIZERS.items():
        if splits == patterns:
            return name
    return None


def _byte_level_alphabet():
    """bytes_to_unicode() of GPT-2: byte -> the printable character byte-level BPE uses for it."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def shrink_bpe(data, n_regular):
    """A byte-level BPE tokenizer.json dict cut to `n_regular` regular tokens (+ its added tokens), consistently.

    Keeps the alphabet (all 256 byte characters if n_regular leaves room for them and some merges, else only the
    bytes of printable ASCII, tab, LF and CR), then the merges in rank order whose two parts are kept, renumbers the
    ids (alphabet first, merges in rank order, added tokens after) and fixes the post-processor's special-token ids.
    The result is a valid BPE of its own: HF tokenizers and llama.cpp tokenize it the same way; with the ASCII-only
    alphabet, text with other bytes cannot be tokenized (llama.cpp throws), which conversion and logits never need.
    """
    data = json.loads(json.dumps(data))
    vocab = data["model"]["vocab"]
    merges = [m.split(" ") if isinstance(m, str) else list(m) for m in data["model"]["merges"]]
    alphabet = _byte_level_alphabet()
    if n_regular >= 256 + 16:
        keep_chars = [alphabet[b] for b in range(256)]
    else:
        keep_chars = [alphabet[b] for b in list(range(0x20, 0x7F)) + [0x09, 0x0A, 0x0D]]
    keep_chars = sorted((c for c in keep_chars if c in vocab), key=lambda c: vocab[c])
    if len(keep_chars) > n_regular:
        raise ValueError(f"{n_regular} regular tokens cannot hold the {len(keep_chars)}-character alphabet")
    kept = {c: i for i, c in enumerate(keep_chars)}
    new_merges = []
    for a, b in merges:
        if len(kept) >= n_regular:
            break
        if a in kept and b in kept and (a + b) in vocab and (a + b) not in kept:
            kept[a + b] = len(kept)
            new_merges.append(f"{a} {b}")
    data["model"]["vocab"] = kept
    data["model"]["merges"] = new_merges
    remap = {}
    for i, tok in enumerate(data.get("added_tokens", [])):
        remap[tok["id"]] = len(kept) + i
        tok["id"] = len(kept) + i

    def fix(node):
        if isinstance(node, dict):
            if "ids" in node and isinstance(node["ids"], list):
                node["ids"] = [remap.get(i, i) for i in node["ids"]]
            for v in node.values():
                fix(v)
        elif isinstance(node, list):
            for v in node:
                fix(v)
    fix(data.get("post_processor"))
    return data


def write_tokenizer(model_dir, family=None, source=None):
    """Write tokenizer.json + tokenizer_config.json into the HF dir `model_dir`, sized to its config vocab_size.

    family: a tests/parity/tokenizer_fixtures.py family ("qwen2", "llama3", "deepseek_v3", "gpt2"; default
      DEFAULT_FAMILY[model_type]), or source: a directory with a tokenizer.json/tokenizer_config.json to take instead
      (e.g. resources/demo). The converter needs every token id < vocab_size, so the tokenizer is cut with
      shrink_bpe() to vocab_size minus its added tokens (the converter pads a smaller vocab with [PADi] tokens).
    Returns the llama.cpp pre-tokenizer name it corresponds to (detect_tokenizer_pre)."""
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    if source is not None:
        data = json.loads((Path(source) / "tokenizer.json").read_text(encoding="utf-8"))
        tok_cfg = json.loads((Path(source) / "tokenizer_config.json").read_text(encoding="utf-8"))
    else:
        sys.path.insert(0, str(PARITY))
        try:
            import tokenizer_fixtures as T
        finally:
            sys.path.remove(str(PARITY))
        family = family or DEFAULT_FAMILY[cfg["model_type"]]
        if family == "llama2":
            raise ValueError("the SentencePiece-style llama2 family cannot be shrunk; use llama3 (byte-level BPE)")
        data, tok_cfg = T.FAMILIES[family]()
    # transformers 5.17's AutoTokenizer (which the converter uses) only takes a dict special token in the serialized
    # AddedToken form that published tokenizer_config.json files use ({"__type": "AddedToken", "content": ...}).
    for key, value in list(tok_cfg.items()):
        if key.endswith("_token") and isinstance(value, dict) and "__type" not in value:
            tok_cfg[key] = {"__type": "AddedToken", **value}
    n_added = len(data.get("added_tokens", []))
    n_regular = cfg["vocab_size"] - n_added
    if len(data["model"]["vocab"]) > n_regular:
        data = shrink_bpe(data, n_regular)
    (model_dir / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, ensure_ascii=False), encoding="utf-8")
    return detect_tokenizer_pre(data)


# ---------------------------------------------------------------------------------------------
# Fixtures llama.cpp can load
# ---------------------------------------------------------------------------------------------

# Variants of reference.ARCHS that llama.cpp can represent. llama.cpp's qwen2moe / qwen3moe graphs have no dense
# layers (every block loads ffn_gate_inp + ffn_*_exps, src/models/qwen{2,3}moe.cpp), so mlp_only_layers=[0] cannot
# load; these make every layer sparse.
EXTRA_ARCHS = {
    "qwen3_moe_sparse": ("qwen3_moe", {"mlp_only_layers": []}),
    "qwen2_moe_sparse": ("qwen2_moe", {"mlp_only_layers": []}),
}


def _reference():
    sys.path.insert(0, str(PARITY))
    try:
        import reference as R
    finally:
        sys.path.remove(str(PARITY))
    return R


@contextlib.contextmanager
def _patched_archs(R, vocab_size, arch=None, overrides=None):
    saved_archs, saved_common = dict(R.ARCHS), dict(R.COMMON)
    for name, (base, extra) in EXTRA_ARCHS.items():
        model_type, base_overrides = saved_archs[base]
        R.ARCHS[name] = (model_type, {**base_overrides, **extra})
    if overrides:
        model_type, base_overrides = R.ARCHS[arch]
        R.ARCHS[arch] = (model_type, {**base_overrides, **overrides})
    if vocab_size is not None:
        R.COMMON["vocab_size"] = vocab_size
    try:
        yield
    finally:
        R.ARCHS.clear()
        R.ARCHS.update(saved_archs)
        R.COMMON.clear()
        R.COMMON.update(saved_common)


def build_gguf_case(arch, root, vocab_size=None, family=None, tokenizer_source=None, overrides=None, **case_kwargs):
    """reference.build_case(arch, root, ...) plus a tokenizer in root/model (write_tokenizer).

    arch: a reference.ARCHS name or an EXTRA_ARCHS one; overrides: config fields to change on top of it (e.g.
    hidden_size / moe_intermediate_size multiples of 256 so that every tensor takes a K-quant, see
    docs/gguf_llama_cpp.md); vocab_size overrides reference.COMMON's 160 (>= 272 keeps the full 256-byte alphabet
    in the tokenizer). Returns {"root", "model", "adapter", "adapter_per_expert", "tokens" (list of rows),
    "pre" (tokenizer.ggml.pre the converter will write)}."""
    R = _reference()
    root = Path(root)
    with _patched_archs(R, vocab_size, arch, overrides):
        R.build_case(arch, root, **case_kwargs)
    pre = write_tokenizer(root / "model", family=family, source=tokenizer_source)
    return {"root": root, "model": root / "model", "adapter": root / "adapter",
            "adapter_per_expert": root / "adapter_per_expert",
            "tokens": json.loads((root / "tokens.json").read_text()), "pre": pre}


# ---------------------------------------------------------------------------------------------
# HF -> GGUF
# ---------------------------------------------------------------------------------------------

_DRIVER = r'''
import json, sys
from pathlib import Path
llama_dir, mode, pre, fixes = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
sys.argv = [sys.argv[0]] + sys.argv[5:]
sys.path[:0] = [str(Path(llama_dir) / "gguf-py"), llama_dir]
import gguf
import conversion.base as B

_orig_pre = B.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    return pre if pre else _orig_pre(self, tokenizer)
B.TextModel.get_vocab_base_pre = get_vocab_base_pre

if fixes:
    _orig_load = B.ModelBase.load_hparams
    def load_hparams(dir_model, is_mistral_format):
        h = _orig_load(dir_model, is_mistral_format)
        for k, v in fixes.get("hparams", {}).items():
            h.setdefault(k, v)
        return h
    B.ModelBase.load_hparams = staticmethod(load_hparams)
    if fixes.get("q_lora_rank_zero"):
        import conversion.deepseek as D
        _orig_params = D.DeepseekV2Model.set_gguf_parameters
        def set_gguf_parameters(self):
            _orig_params(self)
            if self.hparams.get("q_lora_rank") is None:
                self.gguf_writer.add_q_lora_rank(0)
        D.DeepseekV2Model.set_gguf_parameters = set_gguf_parameters

if mode == "hf":
    import convert_hf_to_gguf
    convert_hf_to_gguf.main()
else:
    import runpy
    runpy.run_path(str(Path(llama_dir) / "convert_lora_to_gguf.py"), run_name="__main__")
'''


def hf_fixes(model_dir):
    """What convert_hf_to_gguf needs added for a transformers-5.17-saved dir to mean in llama.cpp what it means in HF.

    deepseek_v3: scoring_func "sigmoid" (HF's DeepseekV3 router always uses sigmoid and its config class drops the
      key; without it the converter writes no expert_gating_func and llama.cpp's deepseek2 falls back to softmax,
      src/models/deepseek2.cpp load_arch_hparams).
    deepseek_v2 / v3 with q_lora_rank None: deepseek2.attention.q_lora_rank = 0 (llama.cpp requires the key unless
      the layer count is one of DeepSeek-V2-Lite's, 26/27, or 48 with vocab 128256; 0 selects the plain attn_q path).
    Returns the dict passed to the driver ({} when nothing is needed)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    fixes = {}
    if cfg.get("model_type") == "deepseek_v3" and "scoring_func" not in cfg:
        fixes.setdefault("hparams", {})["scoring_func"] = "sigmoid"
    if cfg.get("model_type") in ("deepseek_v2", "deepseek_v3") and cfg.get("q_lora_rank") is None:
        fixes["q_lora_rank_zero"] = True
    return fixes


def _run_converter(mode, pre, fixes, args, timeout):
    if not (LLAMA_CPP_DIR / "convert_hf_to_gguf.py").exists():
        raise FileNotFoundError(f"{LLAMA_CPP_DIR}: llama.cpp's converters are missing (run scripts/setup.sh)")
    env = dict(os.environ, NO_LOCAL_GGUF="1")  # we put gguf-py on sys.path ourselves, first
    env.pop("PYTHONPATH", None)
    r = subprocess.run([PYTHON, "-c", _DRIVER, str(LLAMA_CPP_DIR), mode, pre or "", json.dumps(fixes), *args],
                       capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp {mode} converter failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return r.stderr


def convert_hf_to_gguf(model_dir, out_path, outtype="f32", tokenizer_pre="auto", fixes="auto", timeout=600):
    """Convert the HF dir `model_dir` (config.json, *.safetensors, tokenizer.json + tokenizer_config.json) to GGUF
    with llama.cpp's convert_hf_to_gguf.py. Returns out_path (Path).

    outtype: "f32" | "f16" | "bf16" | "q8_0" | "auto" (the converter's own --outtype; 1-D tensors stay f32).
    tokenizer_pre: the tokenizer.ggml.pre to write for a byte-level BPE tokenizer: "auto" = detect_tokenizer_pre of
      model_dir/tokenizer.json (falling back to the converter's hash lookup when it matches none), None = the
      converter's hash lookup only (fails on our fixtures), or a llama.cpp name ("qwen2", "llama-bpe", ...).
    fixes: "auto" = hf_fixes(model_dir), or a dict like it ({} for the converter exactly as shipped)."""
    model_dir, out_path = Path(model_dir), Path(out_path)
    if tokenizer_pre == "auto":
        tj = model_dir / "tokenizer.json"
        tokenizer_pre = detect_tokenizer_pre(tj) if tj.exists() else None
    if fixes == "auto":
        fixes = hf_fixes(model_dir)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _run_converter("hf", tokenizer_pre, fixes, [str(model_dir), "--outfile", str(out_path), "--outtype", outtype],
                   timeout)
    return out_path


# ---------------------------------------------------------------------------------------------
# PEFT -> GGUF LoRA
# ---------------------------------------------------------------------------------------------

def peft_fused_to_per_expert(adapter_dir, model_dir, out_dir):
    """Rewrite a PEFT 0.18.1 adapter with routed experts in the fused target_parameters form (reference.py,
    docs/peft_formats.md) into the per-expert form convert_lora_to_gguf.py understands (mlp.experts.E.{gate,up,down}
    _proj LoRA pairs, rank r, one alpha). Returns out_dir. Adapters without fused experts are copied unchanged."""
    from safetensors.torch import load_file, save_file
    R = _reference()
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    state = load_file(str(adapter_dir / R.ADAPTER_FILE))
    out_dir.mkdir(parents=True, exist_ok=True)
    if "mlp.experts.gate_up_proj" not in (cfg.get("target_parameters") or []):
        save_file(state, str(out_dir / R.ADAPTER_FILE), metadata={"format": "pt"})
        (out_dir / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
        return out_dir
    mcfg = json.loads((Path(model_dir) / "config.json").read_text())
    E = mcfg.get("num_experts") or mcfg.get("n_routed_experts") or mcfg.get("num_local_experts")
    inter = mcfg["moe_intermediate_size"] if "moe_intermediate_size" in mcfg else mcfg["intermediate_size"]
    r = cfg["r"]
    flat = {k: v for k, v in state.items() if ".mlp.experts." not in k}
    layers = sorted({int(k.split(".layers.")[1].split(".")[0]) for k in state if ".mlp.experts." in k})
    for layer in layers:
        k = R.fused_keys(layer)
        per = R.fused_to_per_expert(state[k["gu_A"]], state[k["gu_B"]], state[k["dn_A"]], state[k["dn_B"]], E, r, inter)
        for (e, proj), (A, B) in per.items():
            flat[R.expert_key(layer, e, proj, "A")] = A.contiguous()
            flat[R.expert_key(layer, e, proj, "B")] = B.contiguous()
    save_file(flat, str(out_dir / R.ADAPTER_FILE), metadata={"format": "pt"})
    cfg["target_modules"] = sorted(set(cfg["target_modules"]) | {"gate_proj", "up_proj", "down_proj"})
    cfg["target_parameters"] = [p for p in cfg["target_parameters"] if p not in R.EXPERT_PARAMS] or None
    cfg["rank_pattern"], cfg["alpha_pattern"] = {}, {}
    (out_dir / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return out_dir


# transformers 5.x names Mixtral's experts and router like Qwen's in memory (mlp.experts.E.{gate,up,down}_proj,
# mlp.gate), so PEFT adapters use those names, while the checkpoint and llama.cpp's converter use
# block_sparse_moe.experts.E.{w1,w3,w2} and block_sparse_moe.gate (conversion/llama.py LlamaModel.modify_tensors).
_CHECKPOINT_NAMES = {
    "mixtral": [(r"\.mlp\.experts\.(\d+)\.gate_proj\.", r".block_sparse_moe.experts.\1.w1."),
                (r"\.mlp\.experts\.(\d+)\.up_proj\.", r".block_sparse_moe.experts.\1.w3."),
                (r"\.mlp\.experts\.(\d+)\.down_proj\.", r".block_sparse_moe.experts.\1.w2."),
                (r"\.mlp\.gate\.", r".block_sparse_moe.gate.")],
}


def converter_ready_adapter(adapter_dir, base_model_dir, out_dir):
    """The PEFT adapter `adapter_dir` rewritten into out_dir in the form convert_lora_to_gguf.py can map: routed
    experts per expert (peft_fused_to_per_expert) and, for Mixtral, the checkpoint's tensor names. Returns out_dir."""
    import re
    from safetensors.torch import load_file, save_file
    R = _reference()
    out_dir = peft_fused_to_per_expert(adapter_dir, base_model_dir, Path(out_dir))
    model_type = json.loads((Path(base_model_dir) / "config.json").read_text())["model_type"]
    if model_type in _CHECKPOINT_NAMES:
        state = load_file(str(out_dir / R.ADAPTER_FILE))
        renamed = {}
        for k, v in state.items():
            for pat, rep in _CHECKPOINT_NAMES[model_type]:
                k = re.sub(pat, rep, k)
            renamed[k] = v
        save_file(renamed, str(out_dir / R.ADAPTER_FILE), metadata={"format": "pt"})
    return out_dir


def convert_peft_to_gguf_lora(adapter_dir, base_model_dir, out_path, outtype="f32", timeout=600):
    """Convert the PEFT LoRA dir `adapter_dir` (adapter_config.json + adapter_model.safetensors) for the HF dir
    `base_model_dir` to a llama.cpp LoRA GGUF with convert_lora_to_gguf.py (--base: only config.json is read).
    Returns out_path.

    The adapter goes through converter_ready_adapter() first (fused PEFT experts -> per expert, Mixtral names).
    llama.cpp applies one adapter.lora.alpha per file with scale = alpha / rank (rank = each lora_b's ne[0]), so
    rsLoRA and alpha_pattern cannot be represented: refused here rather than silently converted to another scaling.
    Other target_parameters (the router's mlp.gate.weight) are refused too (PEFT saves them like module LoRAs, but
    that path is unverified)."""
    adapter_dir, out_path = Path(adapter_dir), Path(out_path)
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    if cfg.get("use_rslora"):
        raise NotImplementedError("rsLoRA (alpha/sqrt(r)) has no llama.cpp GGUF representation (scale = alpha/r)")
    extra_alpha = {k: v for k, v in (cfg.get("alpha_pattern") or {}).items() if k != "mlp.experts.gate_up_proj"}
    if extra_alpha:
        raise NotImplementedError(f"alpha_pattern {extra_alpha}: llama.cpp has a single alpha per adapter")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = converter_ready_adapter(adapter_dir, base_model_dir, Path(tmp) / "adapter")
        if json.loads((src / "adapter_config.json").read_text()).get("target_parameters"):
            raise NotImplementedError("target_parameters other than the routed experts are not converted")
        _run_converter("lora", None, {}, [str(src), "--base", str(base_model_dir), "--outfile", str(out_path),
                                          "--outtype", outtype], timeout)
    return out_path


# ---------------------------------------------------------------------------------------------
# Quantization, inspection
# ---------------------------------------------------------------------------------------------

_LOG_CALLBACK = None


def _llama_cpp():
    """llama_cpp with llama.cpp's log reduced to errors (TANDEM_LLAMA_VERBOSE=1 keeps everything).

    llama-cpp-python 0.3.36's own callback maps ggml levels with an old numbering (WARN=3 is taken for ERROR), so
    quantization warnings get through its verbose=False; we install a callback that passes GGML_LOG_LEVEL_ERROR (4)
    only."""
    global _LOG_CALLBACK
    import llama_cpp
    if _LOG_CALLBACK is None and os.environ.get("TANDEM_LLAMA_VERBOSE") != "1":
        import llama_cpp._logger  # noqa: F401  (installs its callback on first import; ours replaces it)

        @llama_cpp.llama_log_callback
        def _log(level, text, user_data):
            if level == 4:
                sys.stderr.write(text.decode("utf-8", errors="replace"))

        _LOG_CALLBACK = _log
        llama_cpp.llama_log_set(_LOG_CALLBACK, None)
    return llama_cpp


def quantize_gguf(in_path, out_path, ftype, nthread=2):
    """llama.cpp's llama_model_quantize(in_path -> out_path). ftype: a LLAMA_FTYPE_MOSTLY_* suffix, e.g. "Q8_0",
    "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K" (or the int). Tensors whose row size (ne[0]) is not a multiple of the type's
    block size fall back per tensor (llama-quant.cpp: K-quants need 256, Q4_0/Q8_0 need 32); gguf_tensor_types()
    shows what each tensor became. Returns out_path."""
    llama_cpp = _llama_cpp()
    code = ftype if isinstance(ftype, int) else getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = code
    params.nthread = nthread
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    rc = llama_cpp.llama_model_quantize(str(in_path).encode(), str(out_path).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({in_path}, {ftype}) returned {rc}")
    return out_path


def dequantize_gguf(in_path, out_path, nthread=2):
    """llama.cpp's own dequantization of a (quantized) GGUF: llama_model_quantize to ALL_F32 with allow_requantize,
    i.e. ggml's to_float for every block type. Every tensor of out_path is F32 (same names, same ne). Measured
    bit-identical to gguf-py's gguf.quants.dequantize for Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 / Q5_0 / Q5_1. Returns
    out_path."""
    llama_cpp = _llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.nthread = nthread
    params.allow_requantize = True
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    rc = llama_cpp.llama_model_quantize(str(in_path).encode(), str(out_path).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({in_path} -> F32) returned {rc}")
    return out_path


def gguf_tensors_f32(path):
    """{tensor name: np.float32 array in torch order (ne reversed)} of a GGUF file, quantized blocks dequantized
    by gguf-py (gguf.quants.dequantize)."""
    gguf = _gguf_reader()
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        out[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
            tuple(int(x) for x in reversed(t.shape)))
    return out


def _gguf_reader():
    """PyPI's gguf (0.19.0) reader, or the vendored gguf-py's when that is the one on sys.path."""
    import gguf
    return gguf


def gguf_tensor_types(path):
    """{tensor name: (ggml type name, ne tuple)} of a GGUF file (ne in ggml order, fastest dimension first)."""
    gguf = _gguf_reader()
    r = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape)) for t in r.tensors}


def gguf_metadata(path):
    """{key: value} of a GGUF file's metadata (strings decoded, arrays as lists; token lists included)."""
    gguf = _gguf_reader()
    r = gguf.GGUFReader(str(path))
    out = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = field.contents()
    return out


# ---------------------------------------------------------------------------------------------
# Running llama.cpp
# ---------------------------------------------------------------------------------------------

def _open(gguf_path, n_ctx=512, lora_path=None, lora_scale=1.0, vocab_only=False, n_batch=None):
    llama_cpp = _llama_cpp()
    n_batch = n_batch or n_ctx
    return llama_cpp.Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                           logits_all=True, n_threads=2, n_threads_batch=2, seed=0, use_mmap=False,
                           n_gpu_layers=0, flash_attn=False, offload_kqv=False,
                           type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                           lora_path=str(lora_path) if lora_path else None, lora_scale=lora_scale,
                           vocab_only=vocab_only, verbose=os.environ.get("TANDEM_LLAMA_VERBOSE") == "1")


def llama_logits(gguf_path, tokens, lora_path=None, lora_scale=1.0):
    """Logits of llama.cpp for every position of one sequence: np.float32 [len(tokens), n_vocab].

    tokens: list of ints (no BOS is added). The context is len(tokens) (rounded up to 32), one batch, f32 KV cache
    (type_k/type_v F32, no flash attention, no mmap), 2 threads. lora_path: a LoRA GGUF (convert_peft_to_gguf_lora)
    applied with lora_scale (llama.cpp scale = lora_scale * alpha / rank)."""
    tokens = [int(t) for t in tokens]
    n_ctx = max(32, (len(tokens) + 31) // 32 * 32)
    llm = _open(gguf_path, n_ctx=n_ctx, lora_path=lora_path, lora_scale=lora_scale)
    try:
        llm.eval(tokens)
        return np.array(llm.scores[:len(tokens)], dtype=np.float32, copy=True)
    finally:
        llm.close()


def llama_tokenize(gguf_path, text, add_bos, special=True):
    """llama.cpp's tokenization of `text` (str) with the GGUF's vocab: list of ints.

    add_bos: llama_tokenize's add_special: add what the vocab asks for (BOS iff tokenizer.ggml.add_bos_token, or the
    pre-type default, e.g. true for llama-bpe; EOS iff add_eos_token), i.e. HF's add_special_tokens=True; False adds
    nothing. special: parse special/control tokens in the text (as HF tokenizers do for added tokens); False treats
    them as plain text. Note llama.cpp does not apply the tokenizer.json normalizer (Qwen's NFC): compare on
    NFC-normalized text."""
    llm = _open(gguf_path, n_ctx=64, vocab_only=True)
    try:
        return list(llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))
    finally:
        llm.close()


def llama_detokenize(gguf_path, tokens, special=True):
    """llama.cpp's detokenization (bytes -> str with errors='replace')."""
    llm = _open(gguf_path, n_ctx=64, vocab_only=True)
    try:
        return llm.detokenize([int(t) for t in tokens], special=special).decode("utf-8", errors="replace")
    finally:
        llm.close()


# ---------------------------------------------------------------------------------------------
# The transformers side
# ---------------------------------------------------------------------------------------------

def hf_logits(model_dir, tokens, adapter_dir=None):
    """transformers (+ peft) fp32 logits of one sequence, eager attention/experts as in reference.py:
    np.float32 [len(tokens), vocab]."""
    import torch
    R = _reference()
    model = R.load_reference(model_dir, adapter_dir, "fp32")
    model.eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([list(tokens)]), use_cache=False)
    return out.logits[0].float().numpy()


def compare(got, ref):
    """{"max_abs", "rel_l2"} of two logits arrays."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return {"max_abs": float(np.abs(got - ref).max()),
            "rel_l2": float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))}
