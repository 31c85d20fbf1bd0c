"""Reference side of Tandem's parity tests: tiny models, PEFT adapters and HF transformers + peft outputs.

Everything here runs on the CPU with the project venv (torch, transformers 5.17, peft 0.18.1). See
docs/peft_formats.md for the adapter formats this module writes and the math behind them.

Vocabulary used below (all per routed expert e of one MoE layer, HF orientation `y = x @ W.T`):
  H   hidden size, I moe_intermediate_size, E experts, r the per-expert LoRA rank, s the LoRA scaling.
  per-expert LoRA ("Tandem form"): gate: A_g [r, H], B_g [I, r]; up: A_u [r, H], B_u [I, r];
                                   down: A_d [r, I], B_d [H, r];   delta W = s * B @ A.
  fused LoRA ("PEFT 0.18.1 target_parameters form") on the 3-D parameters
      mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I].
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()
hf_logging.disable_progress_bar()

PAD_ID = 0
IGNORE = -100

# ---------------------------------------------------------------------------------------------
# Tiny architectures
# ---------------------------------------------------------------------------------------------

COMMON = dict(hidden_size=64, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=160, max_position_embeddings=128, rms_norm_eps=1e-6,
              attention_dropout=0.0, tie_word_embeddings=False, use_cache=False)

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}

# name -> (model_type, config overrides). moe_intermediate_size 24 makes 2I (48) != H (64), so the
# orientation of every expert tensor is unambiguous.
ARCHS = {
    # top-4 of 8, normalised top-k, layer 0 dense (mlp_only_layers)
    "qwen3_moe": ("qwen3_moe", dict(moe_intermediate_size=24, num_experts=8, num_experts_per_tok=4, head_dim=16,
                                    mlp_only_layers=[0], decoder_sparse_step=1, norm_topk_prob=True,
                                    output_router_logits=False)),
    # top-1 of 16, un-normalised, only layer 1 sparse (decoder_sparse_step=2): most experts get no token
    "qwen3_moe_top1": ("qwen3_moe", dict(moe_intermediate_size=24, num_experts=16, num_experts_per_tok=1,
                                         head_dim=16, mlp_only_layers=[], decoder_sparse_step=2,
                                         norm_topk_prob=False, output_router_logits=False)),
    # shared expert with a sigmoid gate, norm_topk_prob False, qkv bias
    "qwen2_moe": ("qwen2_moe", dict(moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2,
                                    shared_expert_intermediate_size=40, mlp_only_layers=[0],
                                    decoder_sparse_step=1, norm_topk_prob=False, qkv_bias=True,
                                    output_router_logits=False)),
    # MLA without q compression, group_limited_greedy, routed_scaling_factor 1.5, yarn + mscale_all_dim
    "deepseek_v2": ("deepseek_v2", dict(moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=2,
                                        n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=None, num_key_value_heads=4,
                                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                        topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                        routed_scaling_factor=1.5, rope_parameters=dict(YARN),
                                        rope_interleave=True)),
    # MLA with q compression, sigmoid routing + e_score_correction_bias, groups, norm_topk, scale 2.5, yarn
    "deepseek_v3": ("deepseek_v3", dict(moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=2,
                                        n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32, num_key_value_heads=4,
                                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                        n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
                                        rope_parameters=dict(YARN), rope_interleave=True)),
    "mixtral": ("mixtral", dict(intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                                output_router_logits=False)),
    "llama": ("llama", dict(head_dim=16)),
    # llama3 rope scaling and tied embeddings
    "llama3": ("llama", dict(head_dim=16, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 16})),
    "qwen2": ("qwen2", dict(head_dim=16)),  # q/k/v bias
    "qwen3": ("qwen3", dict(head_dim=16)),  # q/k norm
}
MOE_ARCHS = [a for a in ARCHS if ARCHS[a][0] in ("qwen3_moe", "qwen2_moe", "deepseek_v2", "deepseek_v3", "mixtral")]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, torch.float32: torch.float32,
          torch.bfloat16: torch.bfloat16}


def _dtype(dtype):
    return DTYPES[dtype]


def _seeded(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def build_config(arch):
    model_type, overrides = ARCHS[arch]
    kwargs = dict(COMMON)
    kwargs.update(overrides)
    return AutoConfig.for_model(model_type, **kwargs)


def _load_model(model_dir, dtype):
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=_dtype(dtype), attn_implementation="eager",
                                                experts_implementation="eager")


ROUTER_STD = 0.4


@torch.no_grad()
def reinit_(model, seed):
    """Re-initialise every parameter (and DeepSeek-V3's e_score_correction_bias) from one generator.

    HF init leaves norms at 1, biases/routers/e_score_correction_bias at 0; random values exercise every path.
    """
    g = _seeded(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif name.endswith(".bias"):
            value = 0.05 * torch.randn(p.shape, generator=g)
        elif "embed_tokens" in name:
            value = 0.5 * torch.randn(p.shape, generator=g)
        elif name.endswith("mlp.gate.weight"):  # routers: wider score gaps, fewer near-ties
            value = ROUTER_STD * torch.randn(p.shape, generator=g)
        else:  # matrices, 3-D expert tensors, routers: std 0.1 keeps logits well away from flat
            value = 0.1 * torch.randn(p.shape, generator=g)
        p.copy_(value.to(p.dtype))
    for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
        if name.endswith("e_score_correction_bias"):
            b.copy_((0.05 * torch.randn(b.shape, generator=g)).to(b.dtype))


def make_tiny_model(arch, out_dir, seed=0, dtype="fp32", **save_kwargs):
    """Write a tiny random `arch` model (config.json + safetensors) to out_dir; returns the directory."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = build_config(arch)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    reinit_(model, seed)
    model = model.to(_dtype(dtype))
    model.save_pretrained(str(out_dir), **save_kwargs)
    return out_dir


# ---------------------------------------------------------------------------------------------
# Adapters
# ---------------------------------------------------------------------------------------------

EXPERT_PARAMS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
ADAPTER_FILE = "adapter_model.safetensors"


def all_linear_targets(model):
    """Leaf names of the modules PEFT's `all-linear` picks (every nn.Linear except the output embedding)."""
    out = model.get_output_embeddings()
    names = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not out:
            names.add(name.rsplit(".", 1)[-1])
    return sorted(names)


def lora_scaling(alpha, rank, rslora):
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def fused_gate_up_alpha(alpha, rslora):
    """alpha for the fused rank-2r gate_up_proj adapter that keeps the per-expert scaling alpha/r (or alpha/sqrt r)."""
    return alpha * math.sqrt(2.0) if rslora else 2 * alpha


def peft_name(param_name):
    """In-memory PEFT parameter name -> the name PEFT saves (drops the adapter name `default`)."""
    return re.sub(r"\.(lora_[AB])\.default\.", r".\1.", param_name)


def moe_layers(model):
    """[(layer index, experts module)] of the (unwrapped) HF model."""
    out = []
    for i, layer in enumerate(model.model.layers):
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:
            while hasattr(experts, "base_layer"):
                experts = experts.base_layer
            out.append((i, experts))
    return out


def expert_key(layer, expert, proj, ab, prefix="base_model.model.model.layers"):
    return f"{prefix}.{layer}.mlp.experts.{expert}.{proj}.lora_{ab}.weight"


# ----- per-expert <-> PEFT 0.18.1 fused layout (see docs/peft_formats.md section 2) -----------

def per_expert_to_fused(per, num_experts, r, inter, hidden):
    """per[(e, proj)] = (A, B) with standard shapes -> the four fused PEFT tensors of one layer.

    PEFT 0.18.1's ParamWrapper reads a 3-D parameter as [E, in, out] although HF uses it as [E, out, in]:
    for gate_up_proj [E, 2I, H] it builds lora_A = Linear(2I -> E*R), lora_B = Linear(E*R -> H) and
        delta[e] = scaling * (Bf.reshape(H, R, E)[:, :, e] @ Af.reshape(E, R, 2I)[e]).T      # [2I, H]
    i.e. PEFT's lora_A plays the role of the standard B^T and PEFT's lora_B the standard A^T. Note the two
    different expert strides: lora_A rows are expert-major (e*R + j), lora_B columns rank-major (j*E + e).
    """
    R = 2 * r
    gu_A = torch.zeros(num_experts * R, 2 * inter)    # PEFT lora_A of gate_up_proj
    gu_B = torch.zeros(hidden, R * num_experts)       # PEFT lora_B of gate_up_proj
    dn_A = torch.zeros(num_experts * r, hidden)       # PEFT lora_A of down_proj  ([E, H, I]: in=H, out=I)
    dn_B = torch.zeros(inter, r * num_experts)        # PEFT lora_B of down_proj
    for e in range(num_experts):
        Ag, Bg = per[(e, "gate_proj")]
        Au, Bu = per[(e, "up_proj")]
        Ad, Bd = per[(e, "down_proj")]
        # P_e = diag(B_g^T, B_u^T)  [2r, 2I];  Q_e = [A_g^T, A_u^T]  [H, 2r]
        gu_A[e * R: e * R + r, :inter] = Bg.T
        gu_A[e * R + r: (e + 1) * R, inter:] = Bu.T
        for j in range(r):
            gu_B[:, j * num_experts + e] = Ag[j]
            gu_B[:, (r + j) * num_experts + e] = Au[j]
        # down: P_e = B_d^T [r, H]; Q_e = A_d^T [I, r]
        dn_A[e * r:(e + 1) * r, :] = Bd.T
        for j in range(r):
            dn_B[:, j * num_experts + e] = Ad[j]
    return gu_A, gu_B, dn_A, dn_B


def fused_to_per_expert(gu_A, gu_B, dn_A, dn_B, num_experts, r, inter):
    """Inverse of per_expert_to_fused (reads the diagonal blocks; also maps gradients, which are linear)."""
    R = 2 * r
    hidden = gu_B.shape[0]
    P = gu_A.reshape(num_experts, R, 2 * inter)
    Q = gu_B.reshape(hidden, R, num_experts)
    Pd = dn_A.reshape(num_experts, r, hidden)
    Qd = dn_B.reshape(inter, r, num_experts)
    per = {}
    for e in range(num_experts):
        per[(e, "gate_proj")] = (Q[:, :r, e].T.contiguous(), P[e, :r, :inter].T.contiguous())
        per[(e, "up_proj")] = (Q[:, r:, e].T.contiguous(), P[e, r:, inter:].T.contiguous())
        per[(e, "down_proj")] = (Qd[:, :, e].T.contiguous(), Pd[e].T.contiguous())
    return per


def fused_keys(layer, prefix="base_model.model.model.layers"):
    """PEFT's saved names for the nested ParamWrappers: gate_up_proj is the inner one (base_layer)."""
    base = f"{prefix}.{layer}.mlp.experts"
    return {"gu_A": f"{base}.base_layer.lora_A.weight", "gu_B": f"{base}.base_layer.lora_B.weight",
            "dn_A": f"{base}.lora_A.weight", "dn_B": f"{base}.lora_B.weight"}


def _random_lora(g, r, fan_in, fan_out, std_a, std_b):
    return std_a * torch.randn(r, fan_in, generator=g), std_b * torch.randn(fan_out, r, generator=g)


def make_adapter(model_dir, out_dir, targets="all-linear", rank=4, alpha=8, rslora=False, seed=1,
                 expert_lora=True, router_lora=False, per_expert_dir=None, std_a=0.2, std_b=0.2):
    """Write a PEFT LoRA adapter dir with non-zero random A and B for `model_dir`.

    targets: "all-linear" (resolved to leaf names, as PEFT would) or a list of module leaf names.
    expert_lora: routed experts through the fused target_parameters form, built from random per-expert
      rank-`rank` gate/up/down LoRAs (gate_up_proj gets rank 2r via rank_pattern and the alpha that keeps the
      per-expert scaling via alpha_pattern).
    router_lora: also LoRA on the router weight (`mlp.gate.weight`, a 2-D target parameter).
    per_expert_dir: if given, also write the same adapter in per-expert form (routed experts as
      `...mlp.experts.E.{gate,up,down}_proj.lora_{A,B}.weight`, rank r, alpha, no target_parameters) there.
    Returns {"fused": out_dir, "per_expert": per_expert_dir or None, "per": {(layer, e, proj): (A, B)}}.
    """
    from peft import LoraConfig, get_peft_model

    out_dir = Path(out_dir)
    model = _load_model(model_dir, "fp32")
    if targets == "all-linear":
        targets = all_linear_targets(model)
    layers = moe_layers(model) if (expert_lora or router_lora) else []
    target_parameters = []
    if expert_lora and layers:
        target_parameters += EXPERT_PARAMS
    if router_lora and layers:
        target_parameters.append("mlp.gate.weight")
    rank_pattern, alpha_pattern = {}, {}
    if expert_lora and layers:
        rank_pattern["mlp.experts.gate_up_proj"] = 2 * rank
        alpha_pattern["mlp.experts.gate_up_proj"] = fused_gate_up_alpha(alpha, rslora)
    config = LoraConfig(r=rank, lora_alpha=alpha, use_rslora=rslora, lora_dropout=0.0, bias="none",
                        target_modules=list(targets), target_parameters=target_parameters or None,
                        rank_pattern=rank_pattern, alpha_pattern=alpha_pattern, init_lora_weights=True)
    pm = get_peft_model(model, config)

    g = _seeded(seed)
    state = {}
    per_all = {}
    with torch.no_grad():
        # ordinary modules (and the 2-D router ParamWrapper): standard orientation, A [r, in], B [out, r]
        for name, p in sorted(pm.named_parameters(), key=lambda kv: kv[0]):
            if ".lora_" not in name or ".mlp.experts." in name:
                continue
            std = std_a if ".lora_A." in name else std_b
            p.copy_(std * torch.randn(p.shape, generator=g))
        for layer, experts in layers:
            if not expert_lora:
                continue
            E, I, H = experts.num_experts, experts.intermediate_dim, experts.hidden_dim
            per = {}
            for e in range(E):
                per[(e, "gate_proj")] = _random_lora(g, rank, H, I, std_a, std_b)
                per[(e, "up_proj")] = _random_lora(g, rank, H, I, std_a, std_b)
                per[(e, "down_proj")] = _random_lora(g, rank, I, H, std_a, std_b)
            gu_A, gu_B, dn_A, dn_B = per_expert_to_fused(per, E, rank, I, H)
            wrapper = pm.base_model.model.model.layers[layer].mlp.experts     # outer ParamWrapper: down_proj
            assert wrapper.parameter_name == "down_proj" and wrapper.base_layer.parameter_name == "gate_up_proj"
            wrapper.lora_A["default"].weight.copy_(dn_A)
            wrapper.lora_B["default"].weight.copy_(dn_B)
            wrapper.base_layer.lora_A["default"].weight.copy_(gu_A)
            wrapper.base_layer.lora_B["default"].weight.copy_(gu_B)
            for (e, proj), ab in per.items():
                per_all[(layer, e, proj)] = ab
    pm.save_pretrained(str(out_dir))
    state = load_file(str(out_dir / ADAPTER_FILE))

    if per_expert_dir is not None:
        per_expert_dir = Path(per_expert_dir)
        per_expert_dir.mkdir(parents=True, exist_ok=True)
        flat = {k: v for k, v in state.items() if ".mlp.experts." not in k}
        for (layer, e, proj), (A, B) in per_all.items():
            flat[expert_key(layer, e, proj, "A")] = A.contiguous()
            flat[expert_key(layer, e, proj, "B")] = B.contiguous()
        save_file(flat, str(per_expert_dir / ADAPTER_FILE), metadata={"format": "pt"})
        cfg = json.loads((out_dir / "adapter_config.json").read_text())
        cfg["target_modules"] = sorted(set(cfg["target_modules"]) | ({"gate_proj", "up_proj", "down_proj"}
                                                                    if per_all else set()))
        cfg["target_parameters"] = ["mlp.gate.weight"] if router_lora and layers else None
        cfg["rank_pattern"], cfg["alpha_pattern"] = {}, {}
        (per_expert_dir / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return {"fused": out_dir, "per_expert": per_expert_dir, "per": per_all}


def read_adapter_config(adapter_dir):
    return json.loads((Path(adapter_dir) / "adapter_config.json").read_text())


# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------

def make_batch(vocab_size, lengths, seed=2, ignore_prefix=1):
    """Random token rows of the given lengths (ids >= 1, 0 is the pad id) and labels = tokens with the first
    `ignore_prefix` positions of every row set to -100 (a 'prompt'). Returns (tokens, labels) as lists."""
    g = _seeded(seed)
    tokens, labels = [], []
    for n in lengths:
        row = torch.randint(1, vocab_size, (n,), generator=g).tolist()
        tokens.append(row)
        labels.append([IGNORE] * min(ignore_prefix, n) + row[ignore_prefix:])
    return tokens, labels


def pad_batch(tokens, labels=None):
    """Right-pad ragged rows: ids with PAD_ID, mask 1 on real tokens, labels -100 on pads."""
    L = max(len(r) for r in tokens)
    ids = torch.full((len(tokens), L), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(tokens), L), dtype=torch.long)
    lab = torch.full((len(tokens), L), IGNORE, dtype=torch.long)
    for i, row in enumerate(tokens):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
        if labels is not None:
            lab[i, :len(labels[i])] = torch.tensor(labels[i])
    return ids, mask, (lab if labels is not None else None)


# ---------------------------------------------------------------------------------------------
# transformers + peft reference
# ---------------------------------------------------------------------------------------------

def load_reference(model_dir, adapter_dir=None, dtype="fp32"):
    """HF model (eager attention, eager experts) with the PEFT adapter in fp32 (PEFT's autocast_adapter_dtype)."""
    model = _load_model(model_dir, dtype)
    if adapter_dir is None:
        return model
    from peft import PeftModel
    return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)


def _router(layer):
    """The HF router module of a MoE layer (under PEFT's ParamWrapper when the router has LoRA: hooks on the base
    router run while the LoRA parametrization is active, so they see W + delta), or None for a dense layer."""
    gate = getattr(layer.mlp, "gate", None)
    if gate is None or not hasattr(layer.mlp, "experts"):
        return None
    return gate.get_base_layer() if hasattr(gate, "get_base_layer") else gate


def reference_forward(model_dir, adapter_dir, tokens, labels=None, dtype="fp32", model=None, routing=False):
    """Logits [B, L, V] fp32, loss (transformers' shifted mean over non -100 labels) and, when labels are given,
    the fp32 gradient of every LoRA parameter under PEFT's saved names, plus `expert_grads`: the routed-expert
    grads mapped to Tandem's per-expert names (diagonal blocks of the fused grads).
    routing=True also returns {layer: top-k expert ids [B*L, k]} seen by each router (pads included)."""
    if model is None:
        model = load_reference(model_dir, adapter_dir, dtype)
    model.train()  # no dropout anywhere: attention_dropout 0, lora_dropout 0
    ids, mask, lab = pad_batch(tokens, labels)
    captured = {}
    hooks = []
    if routing:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for i, layer in enumerate(base.model.layers):
            gate = _router(layer)
            if gate is not None:
                hooks.append(gate.register_forward_hook(
                    lambda mod, inp, out, i=i: captured.__setitem__(i, out[2].detach().clone())))
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(labels is not None):
        out = model(input_ids=ids, attention_mask=mask, labels=lab, use_cache=False)
    for h in hooks:
        h.remove()
    result = {"logits": out.logits.detach().float(), "mask": mask, "routing": captured}
    if labels is None:
        return result
    out.loss.backward()
    result["loss"] = out.loss.detach().float()
    grads = {}
    for name, p in model.named_parameters():
        if ".lora_" in name and p.requires_grad:
            grads[peft_name(name)] = (p.grad.detach().float().clone() if p.grad is not None
                                      else torch.zeros_like(p, dtype=torch.float32))
    result["grads"] = grads
    if adapter_dir is not None:
        result["expert_grads"] = fused_grads_to_per_expert(grads, read_adapter_config(adapter_dir), model)
    return result


def fused_grads_to_per_expert(grads, cfg, model):
    """Map PEFT fused expert grads to per-expert names (Tandem's grads must equal these)."""
    if "mlp.experts.gate_up_proj" not in (cfg.get("target_parameters") or []):
        return {}
    r = cfg["r"]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    out = {}
    for layer, experts in moe_layers(base):
        k = fused_keys(layer)
        per = fused_to_per_expert(grads[k["gu_A"]], grads[k["gu_B"]], grads[k["dn_A"]], grads[k["dn_B"]],
                                  experts.num_experts, r, experts.intermediate_dim)
        for (e, proj), (gA, gB) in per.items():
            out[expert_key(layer, e, proj, "A")] = gA
            out[expert_key(layer, e, proj, "B")] = gB
    return out


def tandem_expected_grads(ref):
    """The grads `tandem debug grad` must write: every non-expert LoRA grad under PEFT's name, and the routed
    experts under per-expert names."""
    out = {k: v for k, v in ref["grads"].items() if ".mlp.experts." not in k}
    out.update(ref.get("expert_grads", {}))
    return out


# ---------------------------------------------------------------------------------------------
# Independent plain-torch references
# ---------------------------------------------------------------------------------------------

def torch_reference_expert_lora(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, lora, scaling,
                                act=F.silu):
    """Routed-expert MoE output with per-expert LoRA in plain torch autograd (no PEFT, no transformers).

    hidden [T, H]; top_k_index [T, k] int; top_k_weights [T, k]; gate_up_proj [E, 2I, H]; down_proj [E, H, I];
    lora[(e, proj)] = (A, B) tensors (requires_grad as you like), proj in gate_proj/up_proj/down_proj.
    y_t = sum_k w_tk * down_e(act(gate_e(x_t)) * up_e(x_t)),  proj(x) = x W^T + scaling * (x A^T) B^T.
    """
    E = gate_up_proj.shape[0]
    inter = down_proj.shape[2]
    out = torch.zeros_like(hidden)
    for e in range(E):
        tok, slot = torch.where(top_k_index == e)
        if tok.numel() == 0:
            continue
        x = hidden[tok]
        Wg, Wu, Wd = gate_up_proj[e, :inter], gate_up_proj[e, inter:], down_proj[e]

        def proj(v, W, name):
            A, B = lora[(e, name)]
            return v @ W.T + scaling * (v @ A.T) @ B.T

        h = act(proj(x, Wg, "gate_proj")) * proj(x, Wu, "up_proj")
        y = proj(h, Wd, "down_proj") * top_k_weights[tok, slot, None]
        out = out.index_add(0, tok, y.to(out.dtype))
    return out


@torch.no_grad()
def merged_reference_logits(model_dir, per_expert_dir, tokens, dtype="fp32"):
    """Logits of the base model with a per-expert-form adapter merged into the weights by hand (plain torch:
    W += s * B @ A, expert slices of gate_up_proj / down_proj included). Independent of PEFT's fused path."""
    cfg = read_adapter_config(per_expert_dir)
    state = load_file(str(Path(per_expert_dir) / ADAPTER_FILE))
    model = _load_model(model_dir, "fp32")
    r, alpha, rs = cfg["r"], cfg["lora_alpha"], cfg.get("use_rslora", False)
    s = lora_scaling(alpha, r, rs)
    modules = dict(model.named_modules())
    for key in sorted(state):
        if ".lora_A." not in key:
            continue
        A, B = state[key], state[key.replace(".lora_A.", ".lora_B.")]
        path = key[len("base_model.model."):].split(".lora_A.")[0]
        m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$", path)
        if m:
            experts, e, proj = modules[m.group(1)], int(m.group(2)), m.group(3)
            I = experts.intermediate_dim
            delta = s * B @ A
            if proj == "gate_proj":
                experts.gate_up_proj[e, :I] += delta
            elif proj == "up_proj":
                experts.gate_up_proj[e, I:] += delta
            else:
                experts.down_proj[e] += delta
        elif path.endswith(".mlp.gate"):  # router weight [E, H] (2-D target parameter, standard orientation)
            modules[path].weight += s * B @ A
        else:
            modules[path].weight += s * B @ A
    model = model.to(_dtype(dtype))
    ids, mask, _ = pad_batch(tokens)
    return model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()


# ---------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------

def rel_l2(got, ref):
    got, ref = got.double(), ref.double()
    denom = ref.norm()
    if denom == 0:
        return float(got.norm())
    return float((got - ref).norm() / denom)


def cosine(got, ref):
    got, ref = got.double().flatten(), ref.double().flatten()
    if ref.norm() == 0 and got.norm() == 0:
        return 1.0
    return float(F.cosine_similarity(got, ref, dim=0))


def valid_positions(logits, mask):
    """Logits at real (non-padding) positions only: [n_real, V]."""
    return logits[mask.bool()]


# ---------------------------------------------------------------------------------------------
# Routing margins and well-conditioned batches
# ---------------------------------------------------------------------------------------------

def _router_margins(router, h):
    """Per-token decision margin of one HF router on hidden states h [T, H] (fp32): the gap between the last
    selected and the first rejected candidate, at the group stage too where there is one (in router-logit units
    for softmax routers, in sigmoid-score units for DeepSeek-V3). A small margin means a
    tiny numeric difference can flip the expert choice (and make two correct implementations disagree)."""
    h = h.float()
    W = router.weight.float()
    k = router.top_k
    logits = h @ W.T
    E = logits.shape[-1]
    inf = torch.full((h.shape[0],), float("inf"))
    name = type(router).__name__
    group_margin = inf

    def topk_gap(scores, kk):
        if kk >= scores.shape[-1]:
            return inf
        v = scores.sort(dim=-1, descending=True).values
        return v[:, kk - 1] - v[:, kk]

    if name.startswith("DeepseekV3"):
        scores = logits.sigmoid() + router.e_score_correction_bias.float()
        ng, tg = router.num_group, router.topk_group
        gs = scores.view(-1, ng, E // ng).topk(2, dim=-1)[0].sum(-1)
        group_margin = topk_gap(gs, tg)
        keep = torch.zeros_like(gs).scatter_(1, gs.topk(tg, dim=-1)[1], 1).bool()
        scores = scores.masked_fill(~keep.repeat_interleave(E // ng, dim=1), float("-inf"))
        expert_margin = topk_gap(scores, k)
    elif name.startswith("DeepseekV2"):
        scores = logits.log_softmax(-1)  # monotonic in the softmax probabilities; gaps in logit units
        if router.topk_method == "group_limited_greedy":
            ng, tg = router.num_group, router.topk_group
            gs = scores.view(-1, ng, E // ng).max(-1).values
            group_margin = topk_gap(gs, tg)
            keep = torch.zeros_like(gs).scatter_(1, gs.topk(tg, dim=-1)[1], 1).bool()
            scores = scores.masked_fill(~keep.repeat_interleave(E // ng, dim=1), float("-inf"))
        expert_margin = topk_gap(scores, k)
    else:  # softmax top-k routers (qwen2_moe, qwen3_moe, mixtral): the order is the order of the logits
        expert_margin = topk_gap(logits, k)
    return torch.minimum(torch.nan_to_num(group_margin, posinf=1e9), torch.nan_to_num(expert_margin, posinf=1e9))


@torch.no_grad()
def routing_margin(model, tokens):
    """Smallest routing margin over all MoE layers and real tokens of `tokens` (inf for dense models)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    margins = []
    hooks = []
    for layer in base.model.layers:
        gate = _router(layer)
        if gate is not None:
            hooks.append(gate.register_forward_hook(
                lambda mod, inp, out: margins.append(_router_margins(mod, inp[0].reshape(-1, inp[0].shape[-1])))))
    ids, mask, _ = pad_batch(tokens)
    try:
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    if not margins:
        return float("inf")
    real = mask.flatten().bool()
    return float(min(m[real].min() for m in margins))


def pick_batch(model, lengths, seeds=range(32), ignore_prefix=1):
    """The random batch (over `seeds`) whose routing is furthest from a tie. Returns (tokens, labels, margin)."""
    best = None
    for seed in seeds:
        tokens, labels = make_batch(model.config.vocab_size, lengths, seed=seed, ignore_prefix=ignore_prefix)
        m = routing_margin(model, tokens)
        if best is None or m > best[2]:
            best = (tokens, labels, m)
        if m == float("inf"):
            break
    return best


# ---------------------------------------------------------------------------------------------
# A complete case on disk (used by the tests and by make_fixture.py)
# ---------------------------------------------------------------------------------------------

LENGTHS = [12, 5, 9]   # ragged: right padding in two of three rows


def _write_json(path, value):
    Path(path).write_text(json.dumps(value))


def build_case(arch, root, dtype="fp32", rank=4, alpha=8, rslora=False, router_lora=False, seed=0,
               lengths=LENGTHS):
    """Write model/, adapter/ (fused experts), adapter_per_expert/, tokens.json, labels.json,
    reference.safetensors (logits, loss, every grad Tandem must write under its exact name),
    reference_fused_grads.safetensors (PEFT's own grads, fused expert form) and meta.json into root.

    For dtype bf16 the model is saved in bf16, the reference is HF in bf16 with the fp32 adapter, and the fp32
    reference of the same bf16 weights is written too (reference_fp32.safetensors): bf16 results are judged
    against it, relative to how far HF's own bf16 run lands from it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    model_dir = make_tiny_model(arch, root / "model", seed=seed, dtype=dtype)
    ad = make_adapter(model_dir, root / "adapter", rank=rank, alpha=alpha, rslora=rslora, seed=seed + 1,
                      router_lora=router_lora, per_expert_dir=root / "adapter_per_expert")
    model32 = load_reference(model_dir, ad["fused"], "fp32")
    tokens, labels, margin = pick_batch(model32, lengths)
    _write_json(root / "tokens.json", tokens)
    _write_json(root / "labels.json", labels)
    ref32 = reference_forward(model_dir, ad["fused"], tokens, labels, "fp32", model=model32, routing=True)
    meta = {"arch": arch, "model_type": ARCHS[arch][0], "dtype": dtype, "rank": rank, "alpha": alpha,
            "rslora": rslora, "router_lora": router_lora, "lengths": [len(t) for t in tokens],
            "routing_margin": margin,
            "experts_used": {str(L): sorted(set(v[ref32["mask"].flatten().bool()].flatten().tolist()))
                             for L, v in ref32["routing"].items()}}
    _save_reference(root / ("reference_fp32.safetensors" if dtype == "bf16" else "reference.safetensors"), ref32)
    save_file({k: v.contiguous() for k, v in ref32["grads"].items()}, str(root / "reference_fused_grads.safetensors"))
    if dtype == "bf16":
        ref16 = reference_forward(model_dir, ad["fused"], tokens, labels, "bf16")
        _save_reference(root / "reference.safetensors", ref16)
        meta["hf_bf16_vs_fp32"] = compare_outputs(ref16, ref32)
    (root / "meta.json").write_text(json.dumps(meta, indent=2))
    return root


def _save_reference(path, ref):
    tensors = {"logits": ref["logits"].contiguous(), "loss": ref["loss"].reshape(()).contiguous()}
    tensors.update({k: v.contiguous() for k, v in tandem_expected_grads(ref).items()})
    save_file(tensors, str(path))


def load_outputs(path):
    """An output file of `tandem debug` (or a reference file) as {"logits", "loss", "grads"}."""
    t = load_file(str(path))
    return {"logits": t.pop("logits", None), "loss": t.pop("loss", None), "grads": t}


def flat_grads(grads, keys):
    return torch.cat([grads[k].double().flatten() for k in keys])


def compare_outputs(got, ref, mask=None):
    """Errors of `got` against `ref` (dicts with logits / loss / grads or expert-named grads)."""
    if mask is None:
        mask = ref.get("mask")
    lg, lr = got["logits"], ref["logits"]
    if mask is not None:
        lg, lr = valid_positions(lg, mask), valid_positions(lr, mask)
    out = {"logits_rel_l2": rel_l2(lg, lr), "logits_cos": cosine(lg, lr)}
    if got.get("loss") is not None and ref.get("loss") is not None:
        out["loss_rel"] = abs(float(got["loss"]) - float(ref["loss"])) / abs(float(ref["loss"]))
    gg = got["grads"] if "expert_grads" not in got else tandem_expected_grads(got)
    gr = ref["grads"] if "expert_grads" not in ref else tandem_expected_grads(ref)
    keys = sorted(set(gg) & set(gr))
    if keys:
        out["grads_rel_l2"] = rel_l2(flat_grads(gg, keys), flat_grads(gr, keys))
        out["grads_cos"] = cosine(flat_grads(gg, keys), flat_grads(gr, keys))
    return out


def mask_from_lengths(lengths, L=None):
    L = L or max(lengths)
    m = torch.zeros(len(lengths), L, dtype=torch.long)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    return m


# ---------------------------------------------------------------------------------------------
# Judging a `tandem debug` output file against a case written by build_case
# ---------------------------------------------------------------------------------------------

FP32_REL = 1e-4          # logits rel-L2, loss rel, every grad rel-L2 (fp32)
BF16_LOGITS_REL = 2e-2   # floors of the bf16 bounds; the bound is max(floor, 2 x HF bf16's own error)
BF16_LOSS_REL = 1e-2
BF16_GRADS_REL = 5e-2
BF16_COS = 0.999


def compare_case(case_dir, out_path, expect_grads=None):
    """Judge a `tandem debug forward|grad` output file for the case in case_dir. Returns a dict with ok, failures
    (human-readable strings), errors (the numbers) and the bounds used.

    fp32: logits rel-L2 <= 1e-4 at real positions, loss rel <= 1e-4, every grad rel-L2 <= 1e-4 (plus a 1e-7 x
    largest-grad-norm absolute floor for tiny tensors), and exactly the expected grad names.
    bf16: judged against the fp32 run on the same bf16 weights ("truth"), relative to how far HF's own bf16 run
    lands from it (meta.json hf_bf16_vs_fp32): error <= max(floor, 2 x HF's) and cosine >= min(0.999, 1 - 4 x
    HF's (1 - cosine)); grads as one concatenated vector. HF's bf16 run is itself 1-2e-2 (logits) and 3-6e-2
    (grads) away from the truth on these models, so 'rel-L2 <= 2e-2 against HF bf16' would fail correct code."""
    case_dir = Path(case_dir)
    meta = json.loads((case_dir / "meta.json").read_text())
    got = load_outputs(out_path)
    bf16 = meta["dtype"] == "bf16"
    ref = load_outputs(case_dir / ("reference_fp32.safetensors" if bf16 else "reference.safetensors"))
    failures = []
    if got["logits"] is None:
        return {"ok": False, "failures": ["no `logits` tensor in the output"], "errors": {}}
    if tuple(got["logits"].shape) != tuple(ref["logits"].shape):
        return {"ok": False, "errors": {},
                "failures": [f"logits shape {tuple(got['logits'].shape)} != {tuple(ref['logits'].shape)}"]}
    if got["logits"].dtype != torch.float32:
        failures.append(f"logits dtype {got['logits'].dtype}, want float32")
    mask = mask_from_lengths(meta["lengths"], ref["logits"].shape[1])
    lg, lr = valid_positions(got["logits"], mask), valid_positions(ref["logits"], mask)
    errors = {"logits_rel_l2": rel_l2(lg, lr), "logits_cos": cosine(lg, lr)}
    if not torch.isfinite(lg).all():
        failures.append("non-finite logits at real positions")
    if got["loss"] is not None:
        if got["loss"].dim() != 0:
            failures.append(f"loss has shape {tuple(got['loss'].shape)}, want a 0-dim tensor")
        errors["loss_rel"] = abs(float(got["loss"]) - float(ref["loss"])) / abs(float(ref["loss"]))
    want_grads = bool(got["grads"]) if expect_grads is None else expect_grads
    if want_grads:
        missing = sorted(set(ref["grads"]) - set(got["grads"]))
        extra = sorted(set(got["grads"]) - set(ref["grads"]))
        if missing:
            failures.append(f"{len(missing)} grads missing, e.g. {missing[:3]}")
        if extra:
            failures.append(f"{len(extra)} unexpected grads, e.g. {extra[:3]}")
        keys = sorted(set(ref["grads"]) & set(got["grads"]))
        for k in keys:
            if tuple(got["grads"][k].shape) != tuple(ref["grads"][k].shape):
                failures.append(f"grad {k}: shape {tuple(got['grads'][k].shape)} != {tuple(ref['grads'][k].shape)}")
        keys = [k for k in keys if tuple(got["grads"][k].shape) == tuple(ref["grads"][k].shape)]
        if keys:
            fg, fr = flat_grads(got["grads"], keys), flat_grads(ref["grads"], keys)
            errors["grads_rel_l2"] = rel_l2(fg, fr)
            errors["grads_cos"] = cosine(fg, fr)
            if not bf16:
                biggest = max(float(ref["grads"][k].double().norm()) for k in keys)
                worst = []
                for k in keys:
                    g, r = got["grads"][k].double(), ref["grads"][k].double()
                    err = float((g - r).norm())
                    bound = FP32_REL * float(r.norm()) + 1e-7 * biggest
                    if not err <= bound:
                        worst.append((err / max(float(r.norm()), 1e-30), k))
                if worst:
                    worst.sort(reverse=True)
                    failures.append(f"{len(worst)} grads over rel-L2 {FP32_REL}: "
                                    + ", ".join(f"{k} ({e:.2e})" for e, k in worst[:5]))
    elif got["grads"]:
        failures.append(f"unexpected tensors in a forward output: {sorted(got['grads'])[:3]}")

    if not bf16:
        bounds = {"logits_rel_l2": FP32_REL, "loss_rel": FP32_REL, "grads_rel_l2": FP32_REL}
        lower = {}
    else:
        hf = meta["hf_bf16_vs_fp32"]
        bounds = {"logits_rel_l2": max(BF16_LOGITS_REL, 2 * hf["logits_rel_l2"]),
                  "loss_rel": max(BF16_LOSS_REL, 2 * hf["loss_rel"]),
                  "grads_rel_l2": max(BF16_GRADS_REL, 2 * hf["grads_rel_l2"])}
        # Twice HF's relative error e means 1 - cos up to (2e)^2 / 2 = 4 x HF's (1 - cos):
        # the cosine bound must scale by 4 to say the same thing as the rel-L2 bound.
        lower = {"logits_cos": min(BF16_COS, 1 - 4 * (1 - hf["logits_cos"])),
                 "grads_cos": min(BF16_COS, 1 - 4 * (1 - hf["grads_cos"]))}
    for k, b in bounds.items():
        if k in errors and not errors[k] <= b:
            failures.append(f"{k} {errors[k]:.3e} > {b:.3e}")
    for k, b in lower.items():
        if k in errors and not errors[k] >= b:
            failures.append(f"{k} {errors[k]:.6f} < {b:.6f}")
    return {"ok": not failures, "failures": failures, "errors": errors, "bounds": bounds, "lower_bounds": lower}


def write_quantised_checkpoints(root, config, quantise, quantization_config, tokenizer_dir, seed=0):
    """A random DeepSeek-V3-shaped checkpoint stored quantised, and its reference (what transformers runs):
    root/model holds what `quantise(name, w)` stores (None: the tensor is kept in bf16; else (stored, dequantised):
    the tensors written in its place, by name, and its fp32 dequantisation) with `quantization_config` in
    config.json; root/dequantised holds the same weights in fp32. The router's e_score_correction_bias stays fp32
    in both, as in DeepSeek's checkpoints. Both get tokenizer_dir's tokenizer."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("deepseek_v3", **config), dtype=torch.float32)
    reinit_(model, seed)
    original = root / "original"
    model.save_pretrained(str(original))  # per-expert names, as DeepSeek's and Kimi's checkpoints
    stored, dequantised = {}, {}
    for name, w in load_file(str(original / "model.safetensors")).items():
        quantised = quantise(name, w)
        if quantised is not None:
            tensors, dequantised[name] = quantised
            stored.update({n: t.contiguous() for n, t in tensors.items()})
        elif name.endswith("e_score_correction_bias"):
            stored[name] = dequantised[name] = w
        else:
            stored[name] = w.to(torch.bfloat16)
            dequantised[name] = stored[name].to(torch.float32)
    cfg = json.loads((original / "config.json").read_text())
    for sub, tensors, extra in (("model", stored, {"quantization_config": quantization_config, "dtype": "bfloat16"}),
                                ("dequantised", dequantised, {})):
        (root / sub).mkdir(parents=True)
        save_file(tensors, str(root / sub / "model.safetensors"), metadata={"format": "pt"})
        (root / sub / "config.json").write_text(json.dumps({**cfg, **extra}, indent=2))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_dir / name, root / sub / name)
    return root
