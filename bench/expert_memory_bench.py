#!/usr/bin/env python3
"""Peak host memory of Tandem holding a Q4_K_M model's routed experts, against their bytes in the file (issue 27:
target <= 1.1x).

A Qwen3-30B-A3B-shaped model (hidden 2048, moe_intermediate 768, 128 experts top-8, 32 heads / 4 KV heads of 128,
as the real one) with random weights is made with transformers, converted by llama.cpp's convert_hf_to_gguf.py and
quantised to Q4_K_M by llama.cpp's llama_model_quantize (the venv's llama-cpp-python): experts gate/up Q4_K, down
Q4_K or Q6_K, as llama-quantize does for the real model. Only --layers decoder layers (default 2, not 48) and a small
vocabulary are built: the routed experts of each layer are the real model's (~392 MB per layer in Q4_K_M), and a
whole model's ratio is the per-layer one, since nothing per layer but the experts grows with them.

Measured: `tandem debug forward` on --tokens tokens (every layer's router sends them across its experts; a random
router spreads top-8 of 128 so that all experts are used), each run in its own process, peak RSS = the tandem
process's own VmHWM (os.wait4's ru_maxrss of that child, started from a small helper process so that it does not
inherit this Python's high-water mark). The baseline is the same model with 8 experts per layer instead of 128
(everything else identical), run the same way; the ratio is

    (peak RSS(128 experts) - peak RSS(8 experts)) / (expert bytes in the file(128) - expert bytes in the file(8))

i.e. the host memory each byte of routed experts in the file costs, with the program, the dense weights and the
activations cancelled out. The mapped expert pages the forward touches count in RSS; a dequantised or transposed
copy of the experts, or a staging buffer per weight, would push the ratio to 2 and above. So that a ratio near 1 is
not an artefact of experts never read, the helper also samples the process's RssFile (mapped file pages resident)
and the bench prints which share of the extra experts' bytes was resident (`expert_pages_touched`).

  python bench/expert_memory_bench.py --tandem build/bin/tandem [--layers 2] [--tokens 512] [--json OUT]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "gguf_support"))
import llama_reference as L  # noqa: E402

# Qwen3-30B-A3B's config.json, but for the layer count and the vocabulary.
QWEN3_30B_A3B = dict(hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144, num_experts=128,
                     num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                     norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=1024,
                     max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     output_router_logits=False, use_cache=False)

# Runs argv[1:] as a child and prints its ru_maxrss (KiB): this helper is a fresh small process, so the child's
# high-water mark starts from the helper's few MB, not from the bench's.
PEAK_HELPER = r'''
import os, sys, time
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
rss_file = 0  # the largest RssFile seen (mapped file pages resident), sampled every 50 ms
while True:
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if done:
        break
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssFile:"):
                rss_file = max(rss_file, int(line.split()[1]))
    except OSError:
        pass
    time.sleep(0.05)
print("peak_rss_kib", usage.ru_maxrss, "rss_file_kib", rss_file, "status", os.waitstatus_to_exitcode(status),
      file=sys.stderr)
'''


def make_gguf(work, experts, layers, seed=0):
    """HF model (bf16, random) -> llama.cpp converter -> Q4_K_M, made once per work dir. Returns (gguf path, expert
    bytes in the file, the experts' (tensor, type) pairs)."""
    q4 = work / f"qwen3_30b_a3b_L{layers}_e{experts}-q4_k_m.gguf"
    if not q4.exists():
        build_gguf(work, experts, layers, q4, seed)
    reader = L._gguf_reader().GGUFReader(str(q4))
    expert_bytes = sum(int(t.n_bytes) for t in reader.tensors if "_exps" in t.name)
    types = sorted({(t.name.split(".")[-2], t.tensor_type.name) for t in reader.tensors if "_exps" in t.name})
    return q4, expert_bytes, types


def build_gguf(work, experts, layers, q4, seed):
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = work / f"hf_e{experts}"
    cfg = dict(QWEN3_30B_A3B, num_experts=experts, num_experts_per_tok=min(8, experts), num_hidden_layers=layers)
    config = AutoConfig.for_model("qwen3_moe", **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)  # tokens far apart, so routing differs per token
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)  # routers: spread top-8 over all experts
            else:
                p.normal_(0.0, 0.02)
    model.save_pretrained(str(model_dir))
    del model
    L.write_tokenizer(model_dir, family="qwen2")
    bf16 = L.convert_hf_to_gguf(model_dir, work / f"e{experts}-bf16.gguf", "bf16", timeout=3600)
    L.quantize_gguf(bf16, q4, "Q4_K_M")
    bf16.unlink()
    shutil.rmtree(model_dir)


def peak_rss_bytes(cmd):
    """(peak RSS, largest mapped-file RSS seen) of `cmd` in bytes, each run in its own process."""
    result = subprocess.run([sys.executable, "-c", PEAK_HELPER, *map(str, cmd)], capture_output=True, text=True)
    lines = [line for line in result.stderr.splitlines() if line.startswith("peak_rss_kib")]
    if not lines or not lines[-1].endswith("status 0"):
        raise RuntimeError(f"{cmd} failed: {result.stderr[-3000:]}")
    fields = lines[-1].split()
    return int(fields[1]) * 1024, int(fields[3]) * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default=os.environ.get("TANDEM_BIN", str(REPO / "build" / "bin" / "tandem")))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--workdir", help="where the GGUF files are made and kept for the next run (default: a temporary "
                    "directory, removed at the end)")
    ap.add_argument("--json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tokens = work / "tokens.json"
        tokens.write_text(json.dumps([[(i * 7919 + 13) % 1000 + 1 for i in range(args.tokens)]]))
        runs = {}
        for experts in (8, 128):
            gguf, expert_bytes, types = make_gguf(work, experts, args.layers)
            cmd = [args.tandem, "debug", "forward", "--model", gguf, "--tokens", tokens,
                   "--out", work / "out.safetensors", "--dtype", "bf16"]
            peak, rss_file = peak_rss_bytes(cmd)
            runs[experts] = {"expert_bytes_in_file": expert_bytes, "file_bytes": gguf.stat().st_size,
                             "expert_types": types, "peak_rss_bytes": peak, "max_rss_file_bytes": rss_file}
    big, base = runs[128], runs[8]
    ratio = (big["peak_rss_bytes"] - base["peak_rss_bytes"]) / (big["expert_bytes_in_file"] - base["expert_bytes_in_file"])
    result = {"shape": f"qwen3_30b_a3b experts (E=128, H=2048, I=768, top-8), {args.layers} layers, Q4_K_M",
              "tokens": args.tokens, "runs": {str(k): v for k, v in runs.items()},
              "rss_per_expert_byte_in_file": ratio, "target": 1.1,
              # Which share of the extra experts' file pages the forward touched (sampled): near 1 when the routing
              # used every expert, so that the ratio above is not low because pages were never read.
              "expert_pages_touched": (big["max_rss_file_bytes"] - base["max_rss_file_bytes"])
              / (big["expert_bytes_in_file"] - base["expert_bytes_in_file"])}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
