#!/usr/bin/env python3
"""4-bit expert layers against bf16 (issue 27): forward + backward tokens/s of the expert layer at the
Qwen3-30B-A3B shape (E=128, H=2048, I=768, top-8), each format in its own process of `bench experts`
(tandem_bench_experts), and the ratios to the bf16 baseline measured in the same run.

Formats: bf16 on the best bf16 backend this CPU has (amx_bf16 / avx512_bf16 / ...: the baseline), and on the
fp32 backend that also runs the blocks (avx512 / avx2: same kernels, so the ratio isolates the format), then
int4 (quantised at creation) and the GGUF block types (random tables; speed does not depend on the values).

  python bench/expert_blocks_bench.py --bench build/bin/tandem_bench_experts [--tokens 128,2048]
      [--dtypes int4,q4_k,q4_0,q8_0,q6_k] [--threads N] [--repeats 3] [--json OUT]
      [--bf16-backends amx_bf16,avx512_bf16] [--block-backends amx_blocks,avx512_bf16_blocks,avx512,avx2]
      [--no-fp32-baseline]

Prints a markdown table (tok/s, ratios, CPU ms of forward and backward) after the JSON rows.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(bench, dtype, backend, tokens, threads, repeats):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [bench, "experts", "--shapes", "qwen3_30b", "--tokens", tokens, "--routing", "uniform",
               "--task-split", "auto",
               "--dtypes", dtype, "--repeats", str(repeats), "--json", out.name]
        if backend:
            cmd += ["--backends", backend]
        if threads:
            cmd += ["--threads", str(threads)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {result.stderr[-2000:]}")
        return json.loads(Path(out.name).read_text())["cases"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/bin/tandem_bench_experts")
    ap.add_argument("--tokens", default="128,2048")
    ap.add_argument("--dtypes", default="int4,q4_k,q4_0,q8_0,q6_k")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--bf16-backends", default="amx_bf16,avx512_bf16",
                    help="the baseline's backends (the fastest one's tok/s is the baseline)")
    ap.add_argument("--block-backends", default="amx_blocks,avx512_bf16_blocks,avx512,avx2")
    ap.add_argument("--no-fp32-baseline", action="store_true",
                    help="skip bf16 on avx512 (the fp32 backend's own ratio)")
    args = ap.parse_args()
    cases = []
    baseline = {}
    # The libtorch loop is not run (--backends always given): it is the e2e baseline, not this one's.
    runs = [("bf16", args.bf16_backends)] + ([] if args.no_fp32_baseline else [("bf16", "avx512")])
    runs += [(d, args.block_backends) for d in args.dtypes.split(",")]
    for dtype, backend in runs:
        try:
            got = run(args.bench, dtype, backend, args.tokens, args.threads, args.repeats)
        except RuntimeError as e:
            print(f"skipped {dtype}/{backend}: {e}", file=sys.stderr)
            continue
        for c in got:
            if c["backend"] == "libtorch_loop":
                continue
            cases.append(c)
            best = baseline.get(c["tokens"])
            if dtype == "bf16" and "bf16" in c["backend"] and (not best or c["tokens_per_s"] > best["tokens_per_s"]):
                baseline[c["tokens"]] = c  # the faster of amx_bf16 / avx512_bf16
            print(f'{c["dtype"]:>8} {c["backend"]:>12} {c["tokens"]:>5} tokens: {c["tokens_per_s"]:10.1f} tok/s',
                  file=sys.stderr)
    rows = []
    for c in cases:
        base = baseline.get(c["tokens"])
        fp32_base = next((b for b in cases if b["dtype"] == "bf16" and b["backend"] == c["backend"]
                          and b["tokens"] == c["tokens"]), None)
        rows.append({"dtype": c["dtype"], "backend": c["backend"], "tokens": c["tokens"],
                     "tokens_per_s": c["tokens_per_s"],
                     "vs_best_bf16": c["tokens_per_s"] / base["tokens_per_s"] if base else None,
                     "best_bf16_backend": base["backend"] if base else None,
                     "vs_bf16_same_backend": c["tokens_per_s"] / fp32_base["tokens_per_s"] if fp32_base else None,
                     "fwd_cpu_ms": c.get("fwd_cpu_ms"), "bwd_cpu_ms": c.get("bwd_cpu_ms")})
    print(json.dumps(rows, indent=2))
    print("\n| format | backend | tokens | tok/s | vs best bf16 | CPU ms fwd / bwd |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        ratio = f'{r["vs_best_bf16"]:.2f}' if r["vs_best_bf16"] else "—"
        cpu = (f'{r["fwd_cpu_ms"]:.1f} / {r["bwd_cpu_ms"]:.1f}' if r["fwd_cpu_ms"] is not None else "—")
        print(f'| {r["dtype"]} | {r["backend"]} | {r["tokens"]} | {r["tokens_per_s"]:.1f} | {ratio} | {cpu} |')
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
