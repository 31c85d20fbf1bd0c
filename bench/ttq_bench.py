#!/usr/bin/env python3
"""Time to quality (TTQ) of LoRA experts (issue 32): wall time and steps for `tandem train` to reach a fixed
validation loss on a domain whose routing is skewed, for four ways of spending the same extra memory.

    python bench/ttq_bench.py --tandem build/bin/tandem [--shape cpu|v2-lite] [--steps 120] [--out DIR]

  (a) base      expert + attention LoRA (lora_target: all, rank r)
  (b) le        (a) + LoRA experts sized to the budget B (lora_experts x le_dim)
  (c) rank      (a) at the higher rank whose extra LoRA parameters equal LE's (the same budget as rank)
  (d) resident  (a) + gpu_experts: the routed experts whose bytes equal LE's bytes, resident on the GPU.
                Resident experts change where experts compute, not the model: (d)'s loss per step is (a)'s,
                only its step time can differ. Without a GPU there is nothing to make resident (the bench
                still runs it and reports what happened).

Each configuration runs in its own process (`tandem train`), on the same model, data, seed and schedule, evaluating
on the held-out set every --eval-steps steps. The target is the lowest validation loss the baseline (a) reaches in
--steps steps and each of --targets; TTQ is the wall time (the sum of step times up to that step, evaluations
excluded, as every configuration evaluates alike) and the step at which a run first reaches it.

The model: a random Qwen3-MoE (--shape cpu: the demo's 4 layers x 16 experts top-4, hidden 256, trains in minutes
on 2 cores; --shape v2-lite: DeepSeek-V2-Lite's shapes (27 layers, 64 experts top-6, 2 shared, hidden 2048) with
--layers of them, bf16 on the GPU). The data: a synthetic "digits" domain (reverse a list of digits) chosen because
the router sends it to few experts; the routing share of the top experts is measured here with transformers and
printed. Writes DIR/result.json, DIR/ttq_curves.svg (the validation-loss curves) and the markdown table."""

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "resources" / "demo"


def make_model(out, shape, layers):
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, PreTrainedTokenizerFast, Qwen3MoeConfig, \
        Qwen3MoeForCausalLM
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / name, out / name)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    vocab = max(tok.get_vocab().values()) + 1
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(0)
    if shape == "cpu":
        config = Qwen3MoeConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
                                max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False,
                                eos_token_id=eos)
        model = Qwen3MoeForCausalLM(config)
    else:  # DeepSeek-V2-Lite's published shapes, `layers` of its 27 layers
        config = DeepseekV2Config(vocab_size=vocab, hidden_size=2048, intermediate_size=10944,
                                  moe_intermediate_size=1408, num_hidden_layers=layers, num_attention_heads=16,
                                  num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64,
                                  num_experts_per_tok=6, first_k_dense_replace=1, kv_lora_rank=512,
                                  q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                  topk_method="greedy", routed_scaling_factor=1.0, norm_topk_prob=False,
                                  max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=eos)
        model = DeepseekV2ForCausalLM(config)
    with torch.no_grad():  # wider than the 0.02 init, so the random model routes by content
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1 if shape == "cpu" else 0.02)
    model = model.to(torch.bfloat16) if shape != "cpu" else model
    model.save_pretrained(str(out))
    return config


WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def digits_domain(n, seed):
    """Reverse a list of digits: few distinct tokens, so few experts."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        ds = [str(rng.randrange(10)) for _ in range(rng.randrange(4, 9))]
        rows.append({"instruction": "reverse " + " ".join(ds), "input": "", "output": " ".join(reversed(ds))})
    return rows


def words_domain(n, seed):
    """Digits to number words: a wider vocabulary, for comparison of the routing skew."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        ds = [rng.randrange(10) for _ in range(rng.randrange(3, 7))]
        rows.append({"instruction": "spell " + " ".join(map(str, ds)), "input": "",
                     "output": " ".join(WORDS[d] for d in ds)})
    return rows


def routing_share(model_dir, rows, top):
    """Share of (token, slot) routing decisions taken by the `top` most used experts of each MoE layer
    (mean over layers), measured with transformers on the rows' text."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    counts = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(layer.mlp, "experts"):
            continue
        def hook(mod, inp, out, i=i):
            if isinstance(out, tuple):  # qwen3_moe's router: (logits, weights, ids)
                ids = out[2] if len(out) > 2 else out[1]
            else:  # a bare linear gate (deepseek_v2): its softmax top-k
                ids = out.float().softmax(-1).topk(top, dim=-1).indices
            counts.setdefault(i, torch.zeros(4096, dtype=torch.long)).index_add_(
                0, ids.flatten().long(), torch.ones(ids.numel(), dtype=torch.long))
        hooks.append(gate.register_forward_hook(hook))
    with torch.no_grad():
        for r in rows[:64]:
            ids = tok(r["instruction"] + " " + r["output"], return_tensors="pt").input_ids
            model(input_ids=ids)
    shares = []
    for c in counts.values():
        c = c[c > 0].sort(descending=True).values.double()
        shares.append(float(c[:top].sum() / c.sum()))
    return sum(shares) / len(shares)


def write_config(path, model_dir, data_dir, out_dir, args, **extra):
    lines = {"model_name_or_path": model_dir, "stage": "sft", "do_train": "true", "finetuning_type": "lora",
             "lora_target": "all", "lora_rank": args.rank, "dataset": "ttq", "dataset_dir": data_dir,
             "template": "qwen3_nothink", "cutoff_len": 64, "output_dir": out_dir, "overwrite_output_dir": "true",
             "logging_steps": 1, "save_steps": 100000, "per_device_train_batch_size": args.batch,
             "gradient_accumulation_steps": 1, "learning_rate": args.lr, "max_steps": args.steps,
             "num_train_epochs": 1000, "lr_scheduler_type": "constant", "max_grad_norm": 1.0, "seed": 42,
             "val_size": 64, "eval_strategy": "steps", "eval_steps": args.eval_steps,
             "per_device_eval_batch_size": 16, "bf16": "false" if args.shape == "cpu" else "true",
             "disable_gradient_checkpointing": "true" if args.shape == "cpu" else "false"}
    if args.shape == "cpu":
        lines["device"] = "cpu"
    # No resident experts unless (d) asks: gpu_experts' default (auto) would fill a big GPU with them in
    # every configuration.
    lines["gpu_experts"] = 0
    lines.update(extra)
    path.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))


def run_config(tandem, name, cfg, out_dir, home):
    env = dict(os.environ, TANDEM_HOME=str(home))
    t0 = time.time()
    r = subprocess.run([tandem, "train", str(cfg)], capture_output=True, text=True, env=env)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"{name} failed:\n{r.stderr[-3000:]}")
    steps, evals = {}, []
    for line in (out_dir / "trainer_log.jsonl").read_text().splitlines():
        j = json.loads(line)
        if "eval_loss" in j:
            evals.append((j["current_steps"], j["eval_loss"]))
        elif "step_s" in j:
            steps[j["current_steps"]] = j["step_s"]
    cum, total = {}, 0.0
    for s in sorted(steps):
        total += steps[s]
        cum[s] = total
    resident = [l for l in r.stdout.splitlines() + r.stderr.splitlines() if "resident" in l.lower()]
    le = [l for l in r.stdout.splitlines() if "lora_experts" in l]
    return {"name": name, "evals": evals, "train_s": cum, "process_wall_s": wall, "resident_note": resident[:2],
            "le_note": le[:1]}


def reach(run, target):
    for step, loss in run["evals"]:
        if loss <= target:
            return step, run["train_s"][step]
    return None, None


def svg_curves(runs, target, path):
    """The validation-loss curves as a small SVG (matplotlib is not in the venv)."""
    W, H, L, B = 640, 400, 60, 40
    xs = [s for r in runs for s, _ in r["evals"]]
    # Zoomed on the approach to the target: from the third evaluation down (the first ones, far above, are clipped).
    ys = [l for r in runs for _, l in r["evals"][2:]] + [target]
    x0, x1, y0, y1 = 0, max(xs), min(ys) * 0.98, max(ys) * 1.02
    X = lambda s: L + (W - L - 20) * (s - x0) / (x1 - x0)  # noqa: E731
    Y = lambda v: 20 + (H - B - 20) * (y1 - v) / (y1 - y0)  # noqa: E731
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - 20}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="20" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">step</text>',
           f'<text x="14" y="{H / 2}" transform="rotate(-90 14 {H / 2})" text-anchor="middle">validation loss'
           f'</text>']
    for k in range(5):
        v = y0 + (y1 - y0) * k / 4
        out.append(f'<text x="{L - 4}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        s = x0 + (x1 - x0) * k / 4
        out.append(f'<text x="{X(s):.1f}" y="{H - B + 14}" text-anchor="middle">{s:.0f}</text>')
    out.append(f'<line x1="{L}" y1="{Y(target):.1f}" x2="{W - 20}" y2="{Y(target):.1f}" stroke="gray" '
               f'stroke-dasharray="4 3"/><text x="{W - 22}" y="{Y(target) - 4:.1f}" text-anchor="end" '
               f'fill="gray">target {target:.3f}</text>')
    out.append(f'<clipPath id="plot"><rect x="{L}" y="20" width="{W - L - 20}" height="{H - B - 20}"/></clipPath>')
    for i, r in enumerate(runs):
        pts = " ".join(f"{X(s):.1f},{Y(l):.1f}" for s, l in r["evals"])
        out.append(f'<polyline clip-path="url(#plot)" fill="none" stroke="{colors[i % 4]}" stroke-width="2" points="{pts}"/>')
        out.append(f'<text x="{W - 230}" y="{40 + 16 * i}" fill="{colors[i % 4]}">{r["label"]}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--shape", choices=["cpu", "v2-lite"], default="cpu")
    ap.add_argument("--layers", type=int, default=4, help="v2-lite: decoder layers built")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--eval-steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--le-paths", type=int, default=2)
    ap.add_argument("--le-dim", type=int, default=64)
    ap.add_argument("--targets", default="1.2,1.0,0.9",
                    help="validation-loss targets (comma-separated) besides (a)'s best")
    ap.add_argument("--report-only", action="store_true", help="re-render DIR/result.json's table and plot")
    ap.add_argument("--configs", default="base,le,rank,resident")
    ap.add_argument("--out", default="bench_ttq")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        result = json.loads((out / "result.json").read_text())
        report(result["runs"], [float(t) for t in args.targets.split(",") if t], result, out)
        return
    model_dir = out / "model"
    config = make_model(model_dir, args.shape, args.layers)
    rows = {"digits": digits_domain(2000, 0), "words": words_domain(2000, 0)}
    n_experts = getattr(config, "num_experts", None) or config.n_routed_experts
    top_k = config.num_experts_per_tok
    shares = {name: routing_share(model_dir, r, top_k) for name, r in rows.items()}
    domain = max(shares, key=shares.get)  # the most skewed one
    data_dir = out / "data"
    data_dir.mkdir(exist_ok=True)
    (data_dir / "ttq.json").write_text(json.dumps(rows[domain]))
    (data_dir / "dataset_info.json").write_text(json.dumps({"ttq": {"file_name": "ttq.json"}}))

    hidden = config.hidden_size
    moe_layers = sum(1 for i in range(config.num_hidden_layers)
                     if args.shape == "cpu" or i >= config.first_k_dense_replace)
    le_params = moe_layers * args.le_paths * 3 * hidden * args.le_dim
    budget_bytes = 16 * le_params  # fp32 weight, grad and two AdamW moments
    home = out / "home"
    runs = []
    base_adapter_params = None
    for name in args.configs.split(","):
        extra, label = {}, name
        if name == "base":
            label = f"(a) LoRA r={args.rank}"
        elif name == "le":
            extra = {"lora_experts": args.le_paths, "le_dim": args.le_dim}
            label = f"(b) + LE {args.le_paths}x{args.le_dim}"
        elif name == "rank":
            per_rank = base_adapter_params / args.rank
            rank = args.rank + max(1, round(le_params / per_rank))
            extra = {"lora_rank": rank, "lora_alpha": 2 * rank}
            label = f"(c) LoRA r={rank}"
        elif name == "resident":
            width = config.moe_intermediate_size
            expert_bytes = 3 * hidden * width * (4 if args.shape == "cpu" else 2)
            k = max(1, round(budget_bytes / (moe_layers * expert_bytes)))
            extra = {"gpu_experts": min(k, n_experts)}
            label = f"(d) {extra['gpu_experts']} resident experts/layer"
        run_dir = out / name
        cfg = out / f"{name}.yaml"
        write_config(cfg, model_dir, data_dir, run_dir, args, **extra)
        print(f"running {label} ...", flush=True)
        r = run_config(args.tandem, name, cfg, run_dir, home)
        r["label"], r["settings"] = label, extra
        if name == "base":
            from safetensors import safe_open
            with safe_open(str(run_dir / "adapter_model.safetensors"), "pt") as f:
                base_adapter_params = sum(f.get_tensor(k).numel() for k in f.keys())
        runs.append(r)
    result = {"shape": args.shape, "domain": domain, "routing_top_k_share": shares, "experts": n_experts,
              "top_k": top_k, "uniform_share": top_k / n_experts, "le_params": le_params,
              "budget_bytes": budget_bytes, "runs": runs}
    report(runs, [float(t) for t in args.targets.split(",") if t], result, out)


def report(runs, targets, result, out):
    """The markdown table (steps and train seconds to each target, ratio to (a)) and the SVG curves."""
    for r in runs:  # JSON turns the step keys into strings
        r["train_s"] = {int(k): v for k, v in r["train_s"].items()}
    baseline = next(r for r in runs if r["name"] == "base")
    targets = [min(l for _, l in baseline["evals"])] + targets
    head = "| configuration | s/step | best val loss |" + "".join(
        f" to {t:.4g}{' ((a) best)' if i == 0 else ''}: steps, s (vs (a)) |" for i, t in enumerate(targets))
    rows = [head, "|---|---|---|" + "---|" * len(targets)]
    for r in runs:
        per_step = r["train_s"][max(r["train_s"])] / max(r["train_s"])
        cells = []
        for t in targets:
            step, sec = reach(r, t)
            _, base_sec = reach(baseline, t)
            cells.append("not reached" if step is None else
                         f"{step}, {sec:.1f} ({sec / base_sec:.2f}x)" if base_sec else f"{step}, {sec:.1f}")
        rows.append(f"| {r['label']} | {per_step:.3f} | {min(l for _, l in r['evals']):.4f} | " +
                    " | ".join(cells) + " |")
    table = "\n".join(rows)
    svg_curves(runs, targets[0], out / "ttq_curves.svg")
    result.update({"targets": targets, "table": table})
    (out / "result.json").write_text(json.dumps(result, indent=2))
    if "domain" in result:
        share = result["routing_top_k_share"][result["domain"]]
        print(f"domain {result['domain']}: the top-{result['top_k']} experts of each layer take {share:.0%} of the "
              f"routing (uniform: {result['uniform_share']:.0%}; all domains: {result['routing_top_k_share']})")
    print(table)


if __name__ == "__main__":
    main()
