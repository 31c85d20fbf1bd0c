#!/usr/bin/env python3
"""Write one parity case to a directory, to debug the C++ side by hand without rerunning transformers.

usage: make_fixture.py ARCH OUTDIR [--dtype fp32|bf16] [--rank N] [--alpha A] [--rslora] [--router-lora]

ARCH is one of reference.ARCHS (qwen3_moe, qwen3_moe_top1, qwen2_moe, deepseek_v2, deepseek_v3, mixtral, llama,
llama3, qwen2, qwen3). OUTDIR gets:
  model/                      tiny random HF model (config.json, model.safetensors)
  adapter/                    PEFT adapter, routed experts in PEFT 0.18.1's fused target_parameters form
  adapter_per_expert/         the same adapter with routed experts per expert (mlp.experts.E.{gate,up,down}_proj)
  tokens.json, labels.json    ragged rows (right padding is implied), labels -100 on the first token
  reference.safetensors       logits [B, L, V] fp32, loss (0-dim), and every LoRA grad under the exact name
                              `tandem debug grad` must write (routed experts per expert)
  reference_fp32.safetensors  (bf16 only) the fp32 run on the same bf16 weights: bf16 results are judged on it
  reference_fused_grads.safetensors   PEFT's own grads (routed experts in fused form)
  meta.json                   arch, dtype, rank/alpha, routing margin, experts used per layer, HF bf16 error
  README.txt                  the tandem commands and how to compare
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference as R  # noqa: E402

README = """\
Parity case {arch} ({dtype}). Positions beyond a row's length in logits are padding: ignore them.

  $TANDEM_BIN debug grad --model model --adapter adapter --tokens tokens.json --labels labels.json \\
      --out out.safetensors --dtype {dtype}
  $TANDEM_BIN debug grad --model model --adapter adapter_per_expert --tokens tokens.json --labels labels.json \\
      --out out_per_expert.safetensors --dtype {dtype}

Compare (from tests/parity):
  python -c "import reference as R; print(R.compare_case('{root}', '{root}/out.safetensors'))"
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arch", choices=sorted(R.ARCHS))
    p.add_argument("outdir")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--alpha", type=float, default=8)
    p.add_argument("--rslora", action="store_true")
    p.add_argument("--router-lora", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    alpha = int(args.alpha) if float(args.alpha).is_integer() else args.alpha
    root = R.build_case(args.arch, args.outdir, dtype=args.dtype, rank=args.rank, alpha=alpha, rslora=args.rslora,
                        router_lora=args.router_lora, seed=args.seed)
    (root / "README.txt").write_text(README.format(arch=args.arch, dtype=args.dtype, root=root.resolve()))
    meta = json.loads((root / "meta.json").read_text())
    print(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
