#!/usr/bin/env python3
"""Decode and prefill tokens/s of Tandem vs transformers `generate` on the CPU, same run (docs/benchmarks.md).

    python bench/decode_bench.py [--tandem build/bin/tandem] [--dtype bf16|fp32] [--threads N]
                                 [--prompt 128] [--new 64] [--repeats 3] [--workdir DIR]
                                 [--hf-env NAME=VAR=VALUE,VAR=VALUE ...] [--tandem-env NAME=VAR=VALUE,...]

1. Writes a random-weight Qwen3-MoE-shaped model (config below, ~200 M parameters: 6 layers, 32 experts
   top-4, GQA 12/4 heads) with transformers' save_pretrained, so both sides load the same safetensors.
2. Times, interleaved, `--repeats` times each, greedy decoding of one `--prompt`-token random prompt to
   exactly `--new` tokens (no eos on either side):
   * transformers, once per `--hf-env` environment, each in its own worker process (libgomp reads its
     environment only when it loads): `model.generate(do_sample=False, max_new_tokens=N)` with its KV cache,
     after torch.set_num_threads(threads), timed through a streamer: prefill = call start to the first new
     token, decode = first to last new token, decode tokens/s = (N - 1) / decode. Default attention and
     experts implementations. The default environments: `default` (OMP_WAIT_POLICY and GOMP_SPINCOUNT unset:
     libgomp's workers spin ~300 000 times before they sleep), `passive` (OMP_WAIT_POLICY=PASSIVE) and
     `tandem_env` (OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=2000, what `tandem` sets for itself).
   * Tandem: `tandem debug generate --threads T` with OMP_WAIT_POLICY and GOMP_SPINCOUNT removed from its
     environment, i.e. tandem's default (it sets PASSIVE + GOMP_SPINCOUNT=2000 for itself,
     engine/core/process_tuning.h), or once per `--tandem-env` environment (same form as --hf-env). libtorch intra-op threads = T; the expert engine's pool is the
     process-wide pool, one worker per core, and the machine has T = nproc cores. It reports its own prefill
     seconds and decode seconds (from the first decode step to the last token, sampling included).
3. Prints one JSON object: medians per side and environment, the ratios Tandem / transformers for every
   transformers environment (> 1: Tandem faster), and `decode_ratio_vs_best`: Tandem against the fastest
   transformers environment of the run. With fp32 the generated ids of both sides are compared too (they should agree; a difference
   is reported, not hidden).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer
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


class _Clock(BaseStreamer):
    """generate() hands the streamer the prompt, then each new token as it is produced."""

    def __init__(self):
        self.stamps = []

    def put(self, value):
        self.stamps.append(time.perf_counter())

    def end(self):
        pass


def hf_times(model, prompt, new_tokens):
    """One generate call: prefill = start to first new token, decode = first to last new token."""
    ids = torch.tensor([prompt])
    clock = _Clock()
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True, streamer=clock)
    first, last = clock.stamps[1], clock.stamps[-1]  # stamps[0]: the prompt
    return {"prefill_s": first - start, "decode_s": last - first, "tokens": out[0, len(prompt):].tolist()}


OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
HF_ENVS = ["default=", "passive=OMP_WAIT_POLICY=PASSIVE",
           "tandem_env=OMP_WAIT_POLICY=PASSIVE,GOMP_SPINCOUNT=2000"]


def parse_env(spec):
    """'NAME=VAR=VALUE,VAR=VALUE' -> (NAME, {VAR: VALUE}); 'NAME=' is the environment without them."""
    name, _, assignments = spec.partition("=")
    return name, dict(a.split("=", 1) for a in assignments.split(",") if a)


def environment(extra):
    """This process's environment without the OpenMP wait variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(extra)
    return env


class HfWorker:
    """transformers in its own process with its own OpenMP environment, timing one generate per request."""

    def __init__(self, name, extra, args, model_dir):
        self.name, self.extra = name, extra
        cmd = [sys.executable, __file__, "--hf-worker", str(model_dir), "--dtype", args.dtype,
               "--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=environment(extra))
        self.info = self._read()

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the transformers worker '{self.name}' died (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self, prompt, new_tokens):
        self.proc.stdin.write(json.dumps({"prompt": prompt, "new": new_tokens}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def hf_worker(model_dir, dtype, threads):
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.inference_mode():
        hf_times(model, list(range(1, 9)), 2)  # warm-up: first-call allocations and lazy init
        print(json.dumps({"parameters": sum(p.numel() for p in model.parameters()),
                          "experts_implementation": getattr(model.config, "experts_implementation", None) or "default",
                          "environment": {k: os.environ.get(k, "(unset)") for k in OMP_VARS}}), flush=True)
        for line in sys.stdin:
            request = json.loads(line)
            print(json.dumps(hf_times(model, request["prompt"], request["new"])), flush=True)


def tandem_times(tandem, model_dir, prompt_file, new_tokens, dtype, threads, extra_env):
    cmd = [tandem, "debug", "generate", "--model", str(model_dir), "--tokens", str(prompt_file),
           "--max-new-tokens", str(new_tokens), "--dtype", dtype, "--threads", str(threads)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=environment(extra_env))
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
    ap.add_argument("--hf-env", action="append", default=None,
                    help="NAME=VAR=VALUE,... a transformers environment (repeatable); default: " + " ".join(HF_ENVS))
    ap.add_argument("--tandem-env", action="append", default=None,
                    help="NAME=VAR=VALUE,... an environment for tandem (repeatable); default: 'default=' (its own "
                         "settings)")
    ap.add_argument("--hf-worker", metavar="MODEL_DIR", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_worker:
        return hf_worker(args.hf_worker, args.dtype, args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tandem_decode_bench_"))
    model_dir = work / f"model_{args.dtype}"
    if not (model_dir / "config.json").exists():
        make_model(model_dir, dtype)
    prompt = torch.randint(1, CONFIG["vocab_size"], (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    prompt_file = work / "prompt.json"
    prompt_file.write_text(json.dumps([prompt]))

    workers = [HfWorker(*parse_env(spec), args, model_dir) for spec in (args.hf_env or HF_ENVS)]
    tandem_envs = [parse_env(spec) for spec in (args.tandem_env or ["default="])]
    hf_runs = {w.name: [] for w in workers}
    tandem_runs = {name: [] for name, _ in tandem_envs}
    for _ in range(args.repeats):
        for w in workers:
            hf_runs[w.name].append(w.run(prompt, args.new))
        for name, extra in tandem_envs:
            tandem_runs[name].append(tandem_times(args.tandem, model_dir, prompt_file, args.new, args.dtype,
                                                  args.threads, extra))
    for w in workers:
        w.close()

    def summary(runs):
        prefill = statistics.median(r["prefill_s"] for r in runs)
        decode = statistics.median(r["decode_s"] for r in runs)
        return {"prefill_s": round(prefill, 4), "decode_s": round(decode, 4),
                "prefill_tokens_per_s": round(args.prompt / prefill, 1),
                "decode_tokens_per_s": round((args.new - 1) / decode, 2),
                "decode_s_all": [round(r["decode_s"], 4) for r in runs]}

    hf = {w.name: {"environment": w.info["environment"], **summary(hf_runs[w.name])} for w in workers}
    best = max(hf, key=lambda name: hf[name]["decode_tokens_per_s"])
    first = next(iter(tandem_runs.values()))[0]["tokens"]
    ours = {}
    for name, extra in tandem_envs:
        side = {"environment": extra or "its default (it sets OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=2000)",
                **summary(tandem_runs[name])}
        side["decode_ratio"] = {h: round(side["decode_tokens_per_s"] / hf[h]["decode_tokens_per_s"], 2) for h in hf}
        side["prefill_ratio"] = {h: round(side["prefill_tokens_per_s"] / hf[h]["prefill_tokens_per_s"], 2) for h in hf}
        side["decode_ratio_vs_best"] = side["decode_ratio"][best]
        ours[name] = side
    result = {
        "model": {"type": "qwen3_moe", **{k: CONFIG[k] for k in ("hidden_size", "num_hidden_layers", "num_experts",
                                                                  "num_experts_per_tok", "moe_intermediate_size",
                                                                  "vocab_size")},
                  "parameters": workers[0].info["parameters"]},
        "dtype": args.dtype, "threads": args.threads, "prompt_tokens": args.prompt, "new_tokens": args.new,
        "repeats": args.repeats, "tandem": ours, "transformers": hf, "best_transformers_environment": best,
        "same_tokens": {h: hf_runs[h][0]["tokens"] == first for h in hf},
        "torch": torch.__version__,
        "experts_implementation": workers[0].info["experts_implementation"],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
