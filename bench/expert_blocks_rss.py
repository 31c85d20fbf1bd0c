#!/usr/bin/env python3
"""Peak host memory of routed experts kept as their GGUF blocks (issue 27), against their bytes in the file.

One Qwen3-30B-A3B-shaped MoE layer (E=128, H=2048, I=768, top-8) with random weights quantised by ggml the way
Q4_K_M stores them (gate/up Q4_K, down Q6_K) is written to a GGUF file; tests/tools/expert_layer_tool runs one
forward + backward of the expert layer on it (format blocks, LoRA r=1 on gate/up/down: its fp32 weights, grads
and their copy in the file are ~1 % of the experts; `nodequant`: nothing but the layer's own work) at 128
tokens (top-8 of 128 experts: every expert is routed to with probability 1 - (120/128)^128 > 99.9 %, while the
activations stay a few MB) in its own process. A run of the same
tool on a tiny layer is the baseline (the program, its libraries, the thread pool). Peak RSS is the tool's
own VmHWM (printed by it; wait4's ru_maxrss would carry this Python process's). Printed: the expert bytes
in the file, peak RSS, baseline, and (peak - baseline) / expert bytes. The mapped expert pages the routing
touches count in RSS; nothing else per weight may (no dequantised copy, no transposed copy).

  python bench/expert_blocks_rss.py --tool build/tests/tools/expert_layer_tool [--tokens 128] [--json OUT]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "gguf_support"))
import ggml_quantize  # noqa: E402


def write_layer(path, E, H, I, T, K, R, seed=0):
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "tandem-bench")
    writer.add_float32("test.lora_scale", 0.5)
    expert_bytes = 0
    for name, out, inp, qtype in (("gate", I, H, Q.Q4_K), ("up", I, H, Q.Q4_K), ("down", H, I, Q.Q6_K)):
        blocks = np.concatenate([
            ggml_quantize.quantize((rng.standard_normal((1, out, inp)) / np.sqrt(inp)).astype(np.float32), qtype)
            for _ in range(E)])
        expert_bytes += blocks.nbytes
        writer.add_tensor(name, blocks, raw_dtype=qtype)
        writer.add_tensor(name + ".lora_a", (rng.standard_normal((E, R, inp)) * 0.01).astype(np.float32))
        writer.add_tensor(name + ".lora_b", (rng.standard_normal((E, out, R)) * 0.01).astype(np.float32))
    writer.add_tensor("x", rng.standard_normal((T, H)).astype(np.float32))
    writer.add_tensor("dy", rng.standard_normal((T, H)).astype(np.float32))
    writer.add_tensor("ids", np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32))
    writer.add_tensor("weights", rng.uniform(0.1, 1.0, (T, K)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expert_bytes


def peak_rss_bytes(cmd):
    """The tool's own VmHWM, which it prints ("peak_rss N kB"): wait4's ru_maxrss would keep the high-water
    mark of this Python process, which the child was forked from."""
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {result.stderr[-2000:]}")
    for line in result.stderr.splitlines():
        if line.startswith("peak_rss"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("the tool printed no peak_rss line")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default=os.environ.get("TANDEM_EXPERT_LAYER_TOOL", "build/tests/tools/expert_layer_tool"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args()
    E, H, I, K, R = 128, 2048, 768, 8, 1
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        big = write_layer(tmp / "layer.gguf", E, H, I, args.tokens, K, R)
        write_layer(tmp / "tiny.gguf", 8, 256, 256, 4, 2, R)
        run = lambda f: peak_rss_bytes([args.tool, str(tmp / f), str(tmp / "out.gguf"), "blocks", "auto", "f32",
                                        "nodequant"])
        baseline = run("tiny.gguf")
        peak = run("layer.gguf")
    result = {"shape": "qwen3_30b (E=128, H=2048, I=768, top-8), one layer, gate/up Q4_K + down Q6_K",
              "tokens": args.tokens, "expert_bytes_in_file": big, "peak_rss_bytes": peak,
              "baseline_rss_bytes": baseline, "rss_over_file_bytes": (peak - baseline) / big}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
