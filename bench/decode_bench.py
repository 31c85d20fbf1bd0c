#!/usr/bin/env python3
"""Decode and prefill tokens/s of Tandem vs transformers `generate` on the CPU, same run (docs/benchmarks.md).

    python bench/decode_bench.py [--tandem build/bin/tandem] [--dtype bf16|fp32] [--threads N]
                                 [--prompt 128] [--new 64] [--repeats 3] [--workdir DIR]

1. Writes a random-weight Qwen3-MoE-shaped model (config below, ~200 M parameters: 6 layers, 32 experts
   top-4, GQA 12/4 heads) with transformers' save_pretrained, so both sides load the same safetensors.
2. Times, interleaved, `--repeats` times each, greedy decoding of one `--prompt`-token random prompt to
   exactly `--new` tokens (no eos on either side):
   * transformers: `model.generate(do_sample=False, max_new_tokens=N)` with its KV cache, after
     torch.set_num_threads(threads); prefill = time of generate(max_new_tokens=1),
     decode tokens/s = (N - 1) / (time(N) - time(1)). Default experts implementation of transformers 5.
   * Tandem: `tandem debug generate --threads T` (libtorch intra-op threads = T; the expert engine's pool
     is the process-wide pool, one worker per core, and the machine has T = nproc cores). It reports its own
     prefill seconds and decode seconds (from the first decode step to the last token, sampling included).
3. Prints one JSON object: medians and the ratios Tandem / transformers (> 1: Tandem faster). With fp32 the
   generated ids of both sides are compared too (they should agree; a difference is reported, not hidden).
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

REPO = Path(__file__).resolve().parents[1]
hf_logging.set_verbosity_error()

CONFIG = dict(hidden_size=768, intermediate_size=2048, moe_intermediate_size=384, num_hidden_layers=6,
              num_attention_heads=12, num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=16384,
              max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
              output_router_logits=False)


def make_model(model_dir, dtype):
    config = AutoConfig.for_model("qwen3_moe", **CONFIG)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # std 0.02 everywhere, norms around 1: logits with clear argmaxes
            p.copy_(torch.randn_like(p) * 0.02 + (1.0 if p.dim() == 1 else 0.0))
    model.to(dtype).save_pretrained(str(model_dir))
    return sum(p.numel() for p in model.parameters())


def hf_times(model, prompt, new_tokens):
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)

    def gen(n):
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, use_cache=True)
        return time.perf_counter() - start, out[0, len(prompt):].tolist()

    t1, _ = gen(1)
    tn, tokens = gen(new_tokens)
    return {"prefill_s": t1, "decode_s": tn - t1, "tokens": tokens}


def tandem_times(tandem, model_dir, prompt_file, new_tokens, dtype, threads):
    cmd = [tandem, "debug", "generate", "--model", str(model_dir), "--tokens", str(prompt_file),
           "--max-new-tokens", str(new_tokens), "--dtype", dtype, "--threads", str(threads)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"tandem failed: {run.stderr}")
    out = json.loads(run.stdout)
    timing = out["timing"][0]
    return {"prefill_s": timing["prefill_s"], "decode_s": timing["decode_s"], "tokens": out["base"][0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default=str(REPO / "build" / "bin" / "tandem"))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tandem_decode_bench_"))
    model_dir = work / f"model_{args.dtype}"
    params = make_model(model_dir, dtype) if not (model_dir / "config.json").exists() else None
    prompt = torch.randint(1, CONFIG["vocab_size"], (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    prompt_file = work / "prompt.json"
    prompt_file.write_text(json.dumps([prompt]))

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    hf_runs, tandem_runs = [], []
    with torch.inference_mode():
        hf_times(model, prompt[:8], 2)  # warm-up: first-call allocations and lazy init
        for _ in range(args.repeats):
            hf_runs.append(hf_times(model, prompt, args.new))
            tandem_runs.append(tandem_times(args.tandem, model_dir, prompt_file, args.new, args.dtype, args.threads))

    def summary(runs, name):
        prefill = statistics.median(r["prefill_s"] for r in runs)
        decode = statistics.median(r["decode_s"] for r in runs)
        return {"side": name, "prefill_s": round(prefill, 4), "decode_s": round(decode, 4),
                "prefill_tokens_per_s": round(args.prompt / prefill, 1),
                "decode_tokens_per_s": round((args.new - 1) / decode, 2)}

    hf = summary(hf_runs, "transformers")
    ours = summary(tandem_runs, "tandem")
    result = {
        "model": {"type": "qwen3_moe", **{k: CONFIG[k] for k in ("hidden_size", "num_hidden_layers", "num_experts",
                                                                  "num_experts_per_tok", "moe_intermediate_size",
                                                                  "vocab_size")},
                  "parameters": params},
        "dtype": args.dtype, "threads": args.threads, "prompt_tokens": args.prompt, "new_tokens": args.new,
        "repeats": args.repeats, "transformers": hf, "tandem": ours,
        "decode_ratio": round(ours["decode_tokens_per_s"] / hf["decode_tokens_per_s"], 2),
        "prefill_ratio": round(ours["prefill_tokens_per_s"] / hf["prefill_tokens_per_s"], 2),
        "same_tokens": hf_runs[0]["tokens"] == tandem_runs[0]["tokens"],
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
