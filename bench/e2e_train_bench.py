#!/usr/bin/env python3
"""End-to-end LoRA SFT step on a GPU machine: Tandem co-computation vs Tandem offload mode vs
transformers + PEFT fully on the GPU, one run, random weights of real model shapes (see
docs/benchmarks.md).

    python bench/e2e_train_bench.py --bench build/bin/tandem_e2e_bench [--models v2-lite,qwen3-30b-a3b]
        [--layers 0] [--tokens 2048[,16384,65536,...]] [--steps 3] [--gpu-cap-gib 24] [--gradient-checkpointing]
        [--offload-checkpoints] [--moe-token-chunk 0]
        [--modes co,resident,offload,offload-resident,offload-serial,offload-resident-serial,offload-int4,
                 offload-resident-int4,auto,hf] [--experts-format auto|bf16|int8|int4] [--int4-format int4]
        [--gpu-experts auto|N] [--weights-cache DIR]
        [--out result.json [--append]]

Per model shape (config.json written below from the published configs; weights built in memory):
1. Tandem, routed experts on the CPU expert engine, dense parts on cuda:0, capped at --gpu-cap-gib
   of GPU memory (a 24 GB card) through libtorch's caching allocator (tandem_e2e_bench process).
1b. (resident) the same with --gpu-experts routed experts per MoE layer resident on the GPU (auto:
   the memory planner fills the capped GPU after the dense parts), computed there while the CPU
   engine computes the rest; the JSON has the planner's bytes for the GPU ("planner") beside the
   allocator's peak.
2. Tandem offload mode (experts streamed from pinned host memory per layer, forward and
   backward), same cap (another process).
2b. (offload-resident) offload mode with a resident cache: --gpu-experts routed experts per MoE
   layer stay on the GPU (auto: the planner's count), only the others are streamed.
2c. (offload-serial, offload-resident-serial) the same two without the streamer's look-ahead: each
   layer's experts are copied when it runs, not while the layer before computes.
3. transformers + PEFT, whole model on the GPU, uncapped (the upper bound), in this process.
All three: bf16 weights, LoRA r=8 alpha=16 on the attention projections, one sequence of --tokens
tokens (labels = inputs), AdamW, grad clip 1.0; tokens/s over the steps after the first (warm-up);
peak GPU memory from torch's caching allocator (max allocated, and reserved), peak host RSS of the
Tandem process (random weights, packs and all). --layers N builds the
first N decoder layers of the real shape (0: all).

Prints one JSON object with the three results per model and the ratios the issue sets targets for:
co/offload tokens/s (target >= 5) and Tandem co-computation GPU memory / HF+PEFT's (target <= 0.2).

Long sequences (issue 29): --tokens takes a list (2048,16384,65536,131072); each length of each mode
is its own process, and the JSON gets, per model, "by_tokens": {length: {mode: result}} and
"sequence": {length: {mode: {tokens_per_s, peak_allocated_bytes, peak_reserved_bytes,
predicted_gpu_peak_bytes, predicted_allocator_bytes, predicted_reserved_bytes,
predicted_over_allocated, predicted_over_reserved, expandable_segments, ...}}}: the caching
allocator's peak beside the memory planner's predicted peak for the same GPU, length and settings
(the planner runs inside tandem_e2e_bench, so both see the same options). The planner's allocated
figure leaves out the CUDA context and its allocator cache margin; its reserved figure adds the
margin. Long runs (offloaded checkpoints, or 8192+ tokens) use expandable segments, as training
does.

Full depth in several device calls (issue 28): a 48-layer model takes minutes to build per process;
--weights-cache DIR makes the first process write the random weights there and the later ones map
them (no generation, and the weights live in the page cache, not in the process), and --append adds
each call's modes to --out, so one model's modes can be spread over calls of a few minutes each.
"""

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The published config.json files (deepseek-ai/DeepSeek-V2-Lite, Qwen/Qwen3-30B-A3B), trimmed to
# what the models read.
CONFIGS = {
    "v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 102400,
        "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
        "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
        "num_experts_per_tok": 6, "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": False,
        "scoring_func": "softmax", "hidden_act": "silu", "max_position_embeddings": 163840,
        "initializer_range": 0.02, "rms_norm_eps": 1e-06, "bos_token_id": 100000, "eos_token_id": 100001,
        "tie_word_embeddings": False, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "bfloat16",
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "decoder_sparse_step": 1,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
        "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_sliding_window": False, "vocab_size": 151936,
    },
}
ATTENTION_TARGETS = {"v2-lite": ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
                     "qwen3-30b-a3b": ["q_proj", "k_proj", "v_proj", "o_proj"]}
GIB = 1 << 30


def run_tandem(bench, config_dir, experts, args, targets, gpu_experts="0", trace=None, stream_ahead=True,
               experts_format=None):
    cmd = [bench, "--config", str(config_dir), "--experts", experts, "--device", "cuda:0", "--gpu-experts", gpu_experts,
           "--tokens", str(args.tokens), "--steps", str(args.steps), "--gpu-cap-gib", str(args.gpu_cap_gib),
           "--lora-rank", "8", "--lora-alpha", "16", "--lora-target", ",".join(targets),
           "--embedding-std", str(args.embedding_std)]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    cmd += weights_cache_flags(config_dir, args, experts_format or args.experts_format,
                               "resident" if experts == "cpu" and gpu_experts != "0" else experts)
    cmd += long_sequence_flags(args)
    if args.more_tokens:
        cmd += ["--more-tokens", args.more_tokens]
    if trace:
        cmd += ["--trace", str(trace)]
    if experts == "gpu-offload":
        cmd += ["--stream-ahead", "true" if stream_ahead else "false"]
    cmd += ["--experts-format", experts_format or args.experts_format]
    cmd += busy_trace_args(args)
    if experts in ("cpu", "auto"):
        cmd += ["--experts-wt-policy", args.experts_wt_policy]
    if args.gradient_checkpointing:
        cmd += ["--gradient-checkpointing"]
        if experts in ("cpu", "auto") and not args.recompute_experts:
            cmd += ["--keep-expert-forward"]  # what `tandem train` does when the host has the RAM
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-2000:], "command": " ".join(cmd)}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["command"] = " ".join(cmd)
    result["wall_s"] = time.time() - start
    gpu = result.get("gpu_memory", {}).get("cuda:0", {})
    result["peak_gpu_gib"] = gpu.get("peak_allocated_bytes", 0) / GIB
    result["peak_gpu_reserved_gib"] = gpu.get("peak_reserved_bytes", 0) / GIB
    result["peak_host_rss_gib"] = result.get("peak_host_rss_bytes", 0) / GIB
    routing = result.get("routing", [])
    if routing:  # means over the MoE layers of the first step's routing
        result["routing_mean"] = {key: sum(layer[key] for layer in routing) / len(routing)
                                  for key in ("experts_routed", "top8_pair_share", "cpu_pair_share")}
    return result


def run_hf(name, args, targets):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_dict = dict(CONFIGS[name])
    if args.layers:
        cfg_dict["num_hidden_layers"] = args.layers
    config = AutoConfig.for_model(**cfg_dict)
    torch.manual_seed(0)
    start = time.time()
    with torch.device("cuda:0"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if args.embedding_std > 0:
        with torch.no_grad():
            model.get_input_embeddings().weight.normal_(0.0, args.embedding_std)
    build_s = time.time() - start
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0))
    if args.gradient_checkpointing:  # what LLaMA-Factory turns on by default
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(config.vocab_size, (1, args.tokens), device="cuda:0")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    steps, timed = [], 0.0
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.time()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.time() - t0
        steps.append({"step_s": dt, "loss": float(loss), "grad_norm": float(norm)})
        if step > 0:
            timed += dt
    result = {"layers": config.num_hidden_layers, "build_s": build_s, "steps": steps,
              "gradient_checkpointing": args.gradient_checkpointing,
              "tokens_per_s": args.tokens * (args.steps - 1) / timed if args.steps > 1 else 0.0,
              "peak_gpu_gib": torch.cuda.max_memory_allocated() / GIB,
              "peak_gpu_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
              "lora_parameters": sum(p.numel() for p in params),
              "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                           "peft": __import__("peft").__version__}}
    del model, optimizer, params, loss
    gc.collect()
    torch.cuda.empty_cache()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="the tandem_e2e_bench executable")
    parser.add_argument("--models", default="v2-lite,qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers of the real shape (0: all)")
    parser.add_argument("--tokens", default="2048",
                        help="sequence length, or a comma list of them (each its own process per mode)")
    parser.add_argument("--offload-checkpoints", action="store_true",
                        help="Tandem: checkpointed layers' inputs in pinned host memory (implies checkpointing)")
    parser.add_argument("--moe-token-chunk", type=int, default=0,
                        help="Tandem: tokens per MoE router / expert pass (0: auto)")
    parser.add_argument("--more-tokens", default="",
                        help="Tandem: then these lengths (comma list) on the same model in the same process, each "
                             "with its own allocator peak and planner prediction (under more_tokens in the JSON)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gpu-cap-gib", type=float, default=24.0)
    parser.add_argument("--modes", default="co,resident,offload,hf",
                        help="co: experts on the CPU engine; resident: co with --gpu-experts of them on the GPU; "
                             "offload: streamed per layer; offload-resident: offload with --gpu-experts of them "
                             "resident on the GPU; offload-serial, offload-resident-serial: the same without the "
                             "next layer's copy ahead; auto: per step each expert resident (--gpu-experts of "
                             "them), streamed or on the CPU engine (experts_mode: auto); offload-int4, "
                             "offload-resident-int4: offload and offload-resident with the experts in --int4-format "
                             "(compare with --experts-format int8's offload); hf: transformers + PEFT")
    parser.add_argument("--gpu-experts", default="auto",
                        help="resident and offload-resident modes: routed experts per MoE layer on the GPU, N or auto (the memory planner's "
                             "count for the capped GPU)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute each layer in backward, in all three set-ups")
    parser.add_argument("--recompute-experts", action="store_true",
                        help="with checkpointing, recompute the CPU experts too instead of keeping their forward")
    parser.add_argument("--experts-format", default="auto", choices=["auto", "bf16", "int8", "int4"],
                        help="the frozen routed experts' weights in every Tandem set-up: int8 is the CPU engine's "
                             "per-row int8, int4 its Tandem int4 tables (group 32, symmetric), also held by the "
                             "resident experts and streamed by offload mode")
    parser.add_argument("--int4-format", default="int4",
                        choices=["int4", "int4:g64", "int4:g128", "int4:asym", "int4:g64:asym", "int4:g128:asym"],
                        help="offload-int4 / offload-resident-int4: the int4 groups they stream")
    parser.add_argument("--experts-wt-policy", default="persistent", choices=["persistent", "on_demand", "background"],
                        help="co-computation: when the CPU engine builds the experts' transposed packs for backward")
    parser.add_argument("--embedding-std", type=float, default=0.0,
                        help="std of the random token embeddings (0: 0.02 like every weight, where the random "
                             "routers send most tokens to a few experts; 4: routing spread like a trained, "
                             "load-balanced router's; the JSON's routing fields say which it was)")
    parser.add_argument("--trace-dir", help="also profile one more step per Tandem mode and write its Chrome trace "
                                            "here as MODEL_MODE.json (open in https://ui.perfetto.dev)")
    parser.add_argument("--busy-trace", action="store_true",
                        help="per Tandem mode, one more step under the profiler: the GPU's and the copy engine's "
                             "busy time beside the CPU expert engine's (issue 28's trace)")
    parser.add_argument("--weights-cache",
                        help="Tandem: a directory for the random weights, one subdirectory per model and depth: the "
                             "first process writes them (a 48-layer Qwen3-30B-A3B: 61 GB, V2-Lite: 31 GB; with "
                             "--experts-format int8 the experts as int8 rows: 31 and 16 GB), the later ones (in this "
                             "call and later calls) load them from the mapped file instead of generating them "
                             "(int8: not resident mode, which generates). Delete it when done")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--append", action="store_true",
                        help="add to --out's results (modes measured by earlier calls, e.g. one model's modes over "
                             "several device calls) instead of starting afresh; the ratios cover them all")
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODE_KEYS)
    if unknown:
        parser.error(f"unknown --modes {sorted(unknown)}; choose from {list(MODE_KEYS)}")
    lengths = [int(t) for t in str(args.tokens).split(",")]
    results = {}
    if args.append and args.out and Path(args.out).exists():
        results = json.loads(Path(args.out).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            config_dir = Path(tmp) / name
            config_dir.mkdir()
            (config_dir / "config.json").write_text(json.dumps(CONFIGS[name]))
            r = results.setdefault(name, {})
            if len(lengths) > 1:
                run_lengths(r, name, config_dir, modes, lengths, args, results)
                continue
            args.tokens = lengths[0]
            for mode in modes:  # in the order given; each result is saved as soon as it is in
                r[MODE_KEYS[mode]] = run_mode(mode, name, config_dir, args)
                r.update(ratios(r))
                r.update(cost_model_check(r))
                print(json.dumps({name: {MODE_KEYS[mode]: r[MODE_KEYS[mode]]}}), file=sys.stderr, flush=True)
                save(results, args.out)
    print(json.dumps(results, indent=1))


def weights_cache_flags(config_dir, args, experts_format="auto", mode=""):
    """Issue 28: with --weights-cache, one directory per model, depth and embedding std: the first Tandem
    process writes its random weights there, the later ones (this call's and later calls') map them."""
    if not getattr(args, "weights_cache", None):
        return []
    depth = args.layers or json.loads((Path(config_dir) / "config.json").read_text())["num_hidden_layers"]
    name = f"{Path(config_dir).name}-{depth}l-std{args.embedding_std:g}"
    if experts_format == "int8":
        # The experts as int8 rows (half the bf16 file: Qwen3 at 48 layers 31 GB, not 61). Loaded as
        # f32 views that the engine packs and frees layer by layer; resident mode keeps its views until
        # its first call, which in f32 would be twice the bf16 model: it generates its own instead.
        if mode == "resident":
            return []
        name += "-int8"
    return ["--weights-dir", str(Path(args.weights_cache) / name)]


def long_sequence_flags(args):
    """tandem_e2e_bench's flags for issue 29's settings."""
    flags = []
    if getattr(args, "offload_checkpoints", False):
        flags.append("--offload-checkpoints")
    if getattr(args, "moe_token_chunk", 0):
        flags += ["--moe-token-chunk", str(args.moe_token_chunk)]
    return flags


def run_lengths(r, name, config_dir, modes, lengths, args, results):
    """Issue 29: every mode at every length (shortest first, each its own process), with the
    allocator's peak against the planner's prediction per length in r["sequence"]."""
    for tokens in sorted(lengths):
        at = argparse.Namespace(**vars(args))
        at.tokens = tokens
        by_mode = r.setdefault("by_tokens", {}).setdefault(str(tokens), {})
        for mode in modes:
            by_mode[MODE_KEYS[mode]] = run_mode(mode, name, config_dir, at)
            by_mode.update(ratios(by_mode))
            summary = sequence_summary(by_mode[MODE_KEYS[mode]])
            r.setdefault("sequence", {}).setdefault(str(tokens), {})[MODE_KEYS[mode]] = summary
            print(json.dumps({name: {str(tokens): {MODE_KEYS[mode]: summary}}}), file=sys.stderr, flush=True)
            save(results, args.out)


def sequence_summary(result):
    """One length of one mode: tokens/s, the allocator's peak, the planner's prediction, their ratio."""
    if "error" in result:
        return {"error": result["error"][-500:]}
    seq = dict(result.get("sequence", {}))
    if "tokens_per_s" in result:  # transformers + PEFT has no planner
        seq["tokens_per_s"] = result["tokens_per_s"]
    seq.setdefault("peak_allocated_bytes", int(result.get("peak_gpu_gib", 0) * GIB))
    seq.setdefault("peak_reserved_bytes", int(result.get("peak_gpu_reserved_gib", 0) * GIB))
    seq["peak_host_rss_bytes"] = result.get("peak_host_rss_bytes", 0)
    seq["losses"] = [s.get("loss") for s in result.get("steps", [])]
    return seq


MODE_KEYS = {"co": "tandem_co", "resident": "tandem_resident", "offload": "tandem_offload",
             "offload-resident": "tandem_offload_resident", "offload-serial": "tandem_offload_serial",
             "offload-resident-serial": "tandem_offload_resident_serial", "hf": "hf_peft",
             "auto": "tandem_auto", "offload-int4": "tandem_offload_int4",
             "offload-resident-int4": "tandem_offload_resident_int4"}


def run_mode(mode, name, config_dir, args):
    targets = ATTENTION_TARGETS[name]
    trace = Path(args.trace_dir) / f"{name}_{mode}.json" if args.trace_dir else None
    if mode == "co":
        return run_tandem(args.bench, config_dir, "cpu", args, targets, trace=trace)
    if mode == "resident":
        return run_tandem(args.bench, config_dir, "cpu", args, targets, gpu_experts=args.gpu_experts, trace=trace)
    if mode in ("offload", "offload-serial"):
        return run_tandem(args.bench, config_dir, "gpu-offload", args, targets, trace=trace,
                          stream_ahead=mode == "offload")
    if mode in ("offload-int4", "offload-resident-int4"):  # issue 27: 4-bit experts streamed
        return run_tandem(args.bench, config_dir, "gpu-offload", args, targets,
                          gpu_experts=args.gpu_experts if mode == "offload-resident-int4" else "0", trace=trace,
                          experts_format=args.int4_format)
    if mode == "auto":  # per step each expert resident (--gpu-experts of them), streamed or on the CPU
        return run_tandem(args.bench, config_dir, "auto", args, targets, gpu_experts=args.gpu_experts, trace=trace)
    if mode in ("offload-resident", "offload-resident-serial"):
        return run_tandem(args.bench, config_dir, "gpu-offload", args, targets, gpu_experts=args.gpu_experts,
                          trace=trace, stream_ahead=mode == "offload-resident")
    try:
        return run_hf(name, args, targets)
    except Exception as e:  # noqa: BLE001 - an OOM or a missing architecture is a result too
        return {"error": f"{type(e).__name__}: {e}"[:2000]}


def busy_trace_args(args):
    return ["--busy-trace"] if getattr(args, "busy_trace", False) else []


# Which of the cost model's modes each Tandem set-up runs.
COST_MODEL_MODES = {"tandem_co": "co", "tandem_resident": "resident", "tandem_offload": "offload",
                    "tandem_offload_int4": "offload", "tandem_offload_resident": "offload-resident",
                    "tandem_auto": "split"}


def cost_model_check(r):
    """Issue 28: per Tandem set-up, the cost model's predicted tokens/s for its mode against the measured
    (the target: within 15 %), the measured step over the model's lower bound (target: <= 1.25), and the
    busy time of each resource in the traced step."""
    out = {}
    for key, mode in COST_MODEL_MODES.items():
        result = r.get(key, {})
        cost = result.get("cost_model")
        if not cost or mode not in cost.get("modes", {}) or not result.get("tokens_per_s"):
            continue
        predicted = cost["modes"][mode]["tokens_per_s"]
        out.setdefault("cost_model_check", {})[key] = {
            "predicted_tokens_per_s": predicted,
            "measured_tokens_per_s": result["tokens_per_s"],
            "predicted_over_measured": predicted / result["tokens_per_s"],
            "step_over_lower_bound": cost.get("step_over_lower_bound"),
            "lower_bound_tokens_per_s": 1e3 * result["tokens"] / cost["lower_bound_ms"],
            "busy_ms": result.get("busy_trace", {}).get("busy_ms"),
        }
    return out


def ratios(r):
    """The targets' ratios between the set-ups measured so far."""
    co, off, hf = r.get("tandem_co", {}), r.get("tandem_offload", {}), r.get("hf_peft", {})
    res, cached = r.get("tandem_resident", {}), r.get("tandem_offload_resident", {})
    off_serial, cached_serial = r.get("tandem_offload_serial", {}), r.get("tandem_offload_resident_serial", {})
    out = {}
    for key, a, b, field in (("co_over_offload_tokens_per_s", co, off, "tokens_per_s"),
                             ("co_gpu_memory_over_hf", co, hf, "peak_gpu_gib"),
                             ("resident_over_offload_tokens_per_s", res, off, "tokens_per_s"),
                             ("resident_over_co_tokens_per_s", res, co, "tokens_per_s"),
                             ("resident_gpu_memory_over_hf", res, hf, "peak_gpu_gib"),
                             ("offload_resident_over_offload_tokens_per_s", cached, off, "tokens_per_s"),
                             ("offload_resident_over_resident_tokens_per_s", cached, res, "tokens_per_s"),
                             ("offload_over_offload_serial_tokens_per_s", off, off_serial, "tokens_per_s"),
                             ("offload_resident_over_offload_resident_serial_tokens_per_s", cached, cached_serial,
                              "tokens_per_s"),
                             # issue 27: 4-bit streamed over the --experts-format (int8) offload mode
                             ("offload_int4_over_offload_tokens_per_s", r.get("tandem_offload_int4", {}), off,
                              "tokens_per_s"),
                             ("offload_resident_int4_over_offload_resident_tokens_per_s",
                              r.get("tandem_offload_resident_int4", {}), cached, "tokens_per_s")):
        if a.get(field) and b.get(field):
            out[key] = a[field] / b[field]
    auto = r.get("tandem_auto", {})
    fixed = [r[k]["tokens_per_s"] for k in ("tandem_co", "tandem_resident", "tandem_offload", "tandem_offload_resident")
             if r.get(k, {}).get("tokens_per_s")]
    if auto.get("tokens_per_s") and fixed:
        out["auto_over_best_fixed_tokens_per_s"] = auto["tokens_per_s"] / max(fixed)
    return out


def save(results, path):
    """Writes the JSON so far (a run cut short by a time limit keeps what it measured)."""
    if not path:
        return
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    main()
