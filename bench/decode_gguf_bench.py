#!/usr/bin/env python3
"""CPU decode tokens/s of Tandem vs llama.cpp (llama-cpp-python) on the same Q4_K_M GGUF (issue 27, item 5).

    python bench/decode_gguf_bench.py [--tandem build/bin/tandem] [--dtype bf16|fp32] [--threads N]
                                      [--prompt 64] [--new 32] [--repeats 3] [--workdir DIR] [--json OUT]

1. Writes a random-weight Qwen3-MoE (CONFIG below: every layer sparse, as llama.cpp's qwen3moe needs; hidden and
   expert sizes multiples of 256 so every expert tensor takes a K-quant) with transformers, a Qwen2-style
   tokenizer (tests/gguf_support/llama_reference.py write_tokenizer), converts it with llama.cpp's own
   convert_hf_to_gguf.py (the copy the venv vendors) and quantises it with llama.cpp's llama_model_quantize to
   Q4_K_M: both sides read that one file.
2. Times, interleaved, `--repeats` times each, greedy decoding of one `--prompt`-token random prompt (token ids,
   no BOS) to exactly `--new` tokens, each run in its own process:
   * llama.cpp: a worker process of this script, llama_cpp.Llama(n_threads=n_threads_batch=T, no mmap, no GPU),
     prompt evaluated in one batch, then `--new` greedy steps (argmax of the last logits, one token per eval);
     prefill = eval of the prompt to its first token, decode = first to last new token.
   * Tandem: `tandem debug generate --model X.gguf --dtype D --threads T`, its own prefill and decode seconds;
     the routed experts stay as Q4_K / Q6_K blocks (experts_format auto on a GGUF) on its CPU expert engine;
     decode steps after the prompt run engine/model/decode_session_cpu.h (plain C++, fp32 between the kernels).
   decode tokens/s = (new - 1) / decode seconds; the ratio Tandem / llama.cpp (> 1: Tandem faster). Also CPU
   milliseconds per decode token on each side (llama.cpp: process_time around its decode loop; Tandem: its
   process's rusage minus a one-token run's) and their ratio, decode_cpu_ratio (> 1: Tandem spends less), the
   figure to read on a shared box: wall time there measures the other processes as much as the code.
3. Prints one JSON object: medians, ratios, and how many generated tokens agree (llama.cpp multiplies int8-
   quantised activations, Tandem bf16 or fp32 ones: greedy paths may part after a while; reported, not hidden).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gguf_support"))

CONFIG = dict(hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512, num_hidden_layers=4,
              num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=8192,
              max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
              output_router_logits=False)


# MARGINS. With every weight random (std 0.02) the logits are flat: std ~0.65 with top-2 margins of 0-0.25 over
# 8192 tokens, under the ~2.5 % (relative L2) that int8-quantised activations (llama.cpp) or bf16 rounding
# (Tandem) move them, so greedy paths parted at near-ties within a few tokens whatever the code did
# (docs/benchmarks.md, "decode4"). The embeddings are scaled up EMBED_SCALE times (the layers see them through
# RMSNorm, so they compute as before) and lm_head reads them back in a fixed permuted order: each position's
# logits then have one token several logits ahead (a bigram chain the layers' outputs perturb but do not
# decide), and "same greedy tokens" tells a step that computes the model from one that does not.
EMBED_SCALE = 8.0


def make_gguf(work):
    """The Q4_K_M GGUF of a random Qwen3-MoE (cached in `work`)."""
    import llama_reference as L
    out = work / "model.margins.q4_k_m.gguf"
    if out.exists():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    model_dir = work / "hf"
    config = AutoConfig.for_model("qwen3_moe", **CONFIG)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # std 0.02 everywhere, norms around 1
            p.copy_(torch.randn_like(p) * 0.02 + (1.0 if p.dim() == 1 else 0.0))
        # Clear logit margins (MARGINS): lm_head row i is the embedding of token perm[i], so the final hidden
        # state, where the current token's (scaled-up) embedding is a large part next to the layers' outputs,
        # points at one next token, perm⁻¹(current), well ahead of the rest.
        embed = model.model.embed_tokens.weight
        embed.mul_(EMBED_SCALE)
        perm = torch.randperm(CONFIG["vocab_size"], generator=torch.Generator().manual_seed(2))
        model.lm_head.weight.copy_(embed[perm] / EMBED_SCALE)
    model.save_pretrained(str(model_dir))
    L.write_tokenizer(model_dir, family="qwen2")
    f32 = L.convert_hf_to_gguf(model_dir, work / "model.f32.gguf")
    L.quantize_gguf(f32, out, "Q4_K_M", nthread=os.cpu_count() or 2)
    f32.unlink()
    return out


def llama_worker(gguf, threads):
    """Reads {"prompt": [...], "new": N} lines, answers {"prefill_s", "decode_s", "tokens"} lines."""
    import numpy as np
    import llama_reference as L
    llama_cpp = L._llama_cpp()
    # logits_all: llama-cpp-python 0.3.36 fills `scores` only then (one row per token: small next to a decode step).
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, seed=0, use_mmap=False, n_gpu_layers=0, logits_all=True,
                          verbose=False)

    def run(prompt, new):
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        tokens = [int(np.argmax(llm.scores[llm.n_tokens - 1]))]
        first, first_cpu = time.perf_counter(), time.process_time()
        while len(tokens) < new:
            llm.eval([tokens[-1]])
            tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        last, last_cpu = time.perf_counter(), time.process_time()
        return {"prefill_s": first - start, "decode_s": last - first, "decode_cpu_s": last_cpu - first_cpu,
                "tokens": tokens}

    run(list(range(1, 9)), 2)  # warm-up
    print(json.dumps({"llama_cpp": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(run(request["prompt"], request["new"])), flush=True)


class LlamaWorker:
    def __init__(self, gguf, threads):
        self.proc = subprocess.Popen([sys.executable, __file__, "--llama-worker", str(gguf), "--threads",
                                      str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.proc.stdout.readline())

    def run(self, prompt, new):
        self.proc.stdin.write(json.dumps({"prompt": prompt, "new": new}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def rusage_cpu(cmd):
    """The JSON `cmd` prints and its process's CPU seconds (rusage: user + system)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"tandem failed: {' '.join(cmd)}\n{stderr[-3000:]}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return json.loads(stdout), usage.ru_utime + usage.ru_stime


def tandem_times(tandem, gguf, prompt_file, new, dtype, threads):
    """Tandem's own prefill / decode seconds and decode CPU seconds (`decode_cpu_s`: the process's CPU time over
    its decode loop, all threads, as llama.cpp's process_time around its loop). A binary that does not report it
    (older than this bench) gets the difference of its process CPU time (rusage) with a one-token run's (load
    and prefill): the same quantity, noisier by the two processes' start-up."""
    cmd = [tandem, "debug", "generate", "--model", str(gguf), "--tokens", str(prompt_file), "--dtype", dtype,
           "--threads", str(threads), "--max-new-tokens"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out, after = rusage_cpu(cmd + [str(new)])
    timing = out["timing"][0]
    decode_cpu = timing.get("decode_cpu_s", -1)
    if decode_cpu < 0:
        _, after_one = rusage_cpu(cmd + ["1"])
        cpu_new = after - (before.ru_utime + before.ru_stime)
        decode_cpu = cpu_new - (after_one - after)
    return {"prefill_s": timing["prefill_s"], "decode_s": timing["decode_s"], "decode_cpu_s": decode_cpu,
            "tokens": out["base"][0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", default=str(REPO / "build" / "bin" / "tandem"))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--llama-worker", metavar="GGUF", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_worker:
        return llama_worker(args.llama_worker, args.threads)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tandem_decode_gguf_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    gguf = make_gguf(work)
    import random
    rng = random.Random(1)
    prompt = [rng.randrange(1, CONFIG["vocab_size"] - 64) for _ in range(args.prompt)]
    prompt_file = work / "prompt.json"
    prompt_file.write_text(json.dumps([prompt]))

    llama = LlamaWorker(gguf, args.threads)
    llama_runs, tandem_runs = [], []
    for _ in range(args.repeats):
        llama_runs.append(llama.run(prompt, args.new))
        tandem_runs.append(tandem_times(args.tandem, gguf, prompt_file, args.new, args.dtype, args.threads))
    llama.close()

    def summary(runs):
        prefill = statistics.median(r["prefill_s"] for r in runs)
        decode = statistics.median(r["decode_s"] for r in runs)
        return {"prefill_s": round(prefill, 4), "decode_s": round(decode, 4),
                "prefill_tokens_per_s": round(args.prompt / prefill, 1),
                "decode_tokens_per_s": round((args.new - 1) / decode, 2),
                "decode_s_all": [round(r["decode_s"], 4) for r in runs],
                # CPU milliseconds per decode token (median): less sensitive to other processes than wall time
                "decode_cpu_ms_per_token": round(1e3 * statistics.median(r["decode_cpu_s"] for r in runs)
                                                 / (args.new - 1), 3)}

    ours, theirs = summary(tandem_runs), summary(llama_runs)
    a, b = tandem_runs[0]["tokens"], llama_runs[0]["tokens"]
    agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    result = {
        "model": {"type": "qwen3_moe", "file": "Q4_K_M (llama.cpp convert_hf_to_gguf + llama_model_quantize)",
                  "gguf_bytes": gguf.stat().st_size,
                  **{k: CONFIG[k] for k in ("hidden_size", "num_hidden_layers", "num_experts", "num_experts_per_tok",
                                            "moe_intermediate_size", "vocab_size")}},
        "dtype": args.dtype, "threads": args.threads, "prompt_tokens": args.prompt, "new_tokens": args.new,
        "repeats": args.repeats, "llama_cpp": {**llama.info, **theirs}, "tandem": ours,
        "decode_ratio": round(ours["decode_tokens_per_s"] / theirs["decode_tokens_per_s"], 3),
        "prefill_ratio": round(ours["prefill_tokens_per_s"] / theirs["prefill_tokens_per_s"], 3),
        # llama.cpp's CPU time per decode token over Tandem's (> 1: Tandem spends less CPU per token)
        "decode_cpu_ratio": round(theirs["decode_cpu_ms_per_token"] / ours["decode_cpu_ms_per_token"], 3),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "same_first_tokens": agree,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
