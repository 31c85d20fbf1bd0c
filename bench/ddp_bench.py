#!/usr/bin/env python3
"""Data-parallel training (issue 33): two ranks of `tandem launch` on one host with batch B each, against
one `tandem train` process with batch 2B, the same steps on a DeepSeek-V2-shaped model (random weights).

    python bench/ddp_bench.py --tandem build/bin/tandem [--shape tiny-v2|v2-lite] [--layers N]
        [--batch B] [--steps S] [--cutoff L] [--bf16] [--out result.json]

- tiny-v2 (default): V2's architecture (MLA, shared + routed experts) scaled down, fp32: runs on a laptop
  CPU in a minute; the two runs' losses agree to ~1e-6.
- v2-lite: DeepSeek-V2-Lite's published shape (bench/e2e_train_bench.py's CONFIGS), its first --layers
  decoder layers (default 8: two ranks each hold their own experts, and 27 layers twice do not fit a
  128 GiB host). On a one-GPU machine both ranks place their dense parts on cuda:0; NCCL wants one GPU
  per rank, so the job carries gradients through Gloo, which the ranks' logs say.

Each run is its own process (or processes); the baseline runs first. Tokens/s is the median of the
logged per-step figure over the steps after the first (the 2-rank figure counts both ranks' tokens).
Prints one JSON object: both runs' losses, tokens/s, wall time, the largest relative loss difference and
the 2-rank / 1-rank tokens/s ratio.
"""

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
from e2e_train_bench import CONFIGS  # noqa: E402  (the published V2-Lite config)

PRESET = REPO / "presets" / "training" / "demo_lora_sft.yaml"

TINY_V2 = {"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 16,
           "num_experts_per_tok": 4, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32,
           "v_head_dim": 32, "vocab_size": 1024, "max_position_embeddings": 4096, "rope_scaling": None,
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(shape, layers, out):
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    config = dict(CONFIGS["v2-lite"])
    if shape == "tiny-v2":
        config.update(TINY_V2)
    elif layers > 0:
        config["num_hidden_layers"] = layers
    dtype = torch.float32 if config.get("torch_dtype") == "float32" else torch.bfloat16
    config.pop("torch_dtype", None)
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    model = DeepseekV2ForCausalLM(DeepseekV2Config(**config))
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the demo's (Qwen-style chat tokens)
        shutil.copy(REPO / "resources" / "demo" / name, out / name)
    return sum(p.numel() for p in model.parameters())


def make_dataset(out, rows, words_per_row):
    rng = random.Random(0)
    vocab = [w for w in ("tandem expert router layer token batch rank gradient adapter matrix tensor memory "
                         "host device step loss curve train shard node ring reduce").split()]
    data = [{"instruction": " ".join(rng.choice(vocab) for _ in range(words_per_row // 4)), "input": "",
             "output": " ".join(rng.choice(vocab) for _ in range(words_per_row))} for _ in range(rows)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(data))
    (out / "dataset_info.json").write_text(json.dumps({"bench": {"file_name": "bench.json"}}))


def train_args(args, model, data, output_dir, batch, extra=()):
    settings = {"model_name_or_path": model, "dataset": "bench", "dataset_dir": data, "output_dir": output_dir,
                "template": "qwen3_nothink", "cutoff_len": args.cutoff, "per_device_train_batch_size": batch,
                "max_steps": args.steps, "save_steps": 1000000, "logging_steps": 1, "lora_target": "all",
                "lora_dropout": 0, "num_train_epochs": 1000, "warmup_ratio": 0, "overwrite_output_dir": "true",
                "plot_loss": "false", "bf16": "true" if args.bf16 else "false", "ddp_timeout": 600}
    return ["train", str(PRESET), *[f"{k}={v}" for k, v in settings.items()], *args.set, *extra]


def run(cmd, work):
    env = dict(os.environ, TANDEM_HOME=str(work / "home"))
    start = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.time() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd[:6]))} ... failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return wall, result.stdout + result.stderr


def summary(output_dir, wall, text):
    lines = [json.loads(line) for line in (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    notes = [line for line in text.splitlines() if line.startswith("process group: rank 0")]
    return {"losses": [s["loss"] for s in steps],
            "tokens_per_s": statistics.median(s["tokens_per_s"] for s in steps[1:]) if len(steps) > 1 else 0,
            "wall_s": wall, "process_group": notes[0] if notes else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--shape", choices=["tiny-v2", "v2-lite"], default="tiny-v2")
    parser.add_argument("--layers", type=int, default=8, help="v2-lite: first N decoder layers (0: all 27)")
    parser.add_argument("--batch", type=int, default=2, help="per rank; the one-process baseline takes twice")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--cutoff", type=int, default=256)
    parser.add_argument("--bf16", action="store_true", help="train in bf16 (default: fp32)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a training setting for both runs (e.g. gpu_experts=0)")
    parser.add_argument("--workdir", help="keep the model and data here (default: a temp dir)")
    parser.add_argument("--out")
    args = parser.parse_args()

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ddp_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / (f"model_v2-lite_{args.layers}l" if args.shape == "v2-lite" else "model_tiny-v2")
    data = work / "data"
    if not (model / "config.json").exists():
        params = make_model(args.shape, args.layers, model)
        print(f"built {model}: {params / 1e9:.2f} B parameters", file=sys.stderr)
    make_dataset(data, rows=16 * args.batch * args.steps, words_per_row=args.cutoff)

    one_dir, two_dir = work / "one_rank", work / "two_ranks"
    wall, text = run([args.tandem, *train_args(args, model, data, one_dir, 2 * args.batch)], work)
    one = summary(one_dir, wall, text)
    launch = [args.tandem, "launch", "--nproc-per-node", "2", "--master", f"127.0.0.1:{free_port()}", "--"]
    # The host's cores split between the two ranks' expert engines, as the one process has them all.
    threads = [f"expert_threads={max(1, (os.cpu_count() or 2) // 2)}"]
    wall, text = run([*launch, *train_args(args, model, data, two_dir, args.batch, threads)], work)
    two = summary(two_dir, wall, text)

    rel = max(abs(a - b) / abs(a) for a, b in zip(one["losses"], two["losses"]))
    result = {"shape": args.shape, "layers": args.layers if args.shape == "v2-lite" else TINY_V2["num_hidden_layers"],
              "batch_per_rank": args.batch, "global_batch": 2 * args.batch, "cutoff_len": args.cutoff,
              "steps": args.steps, "dtype": "bf16" if args.bf16 else "fp32",
              "one_rank_batch_2b": one, "two_ranks_batch_b": two, "max_rel_loss_diff": rel,
              "tokens_per_s_ratio_two_over_one": two["tokens_per_s"] / one["tokens_per_s"]}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
