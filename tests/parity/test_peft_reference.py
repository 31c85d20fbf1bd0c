"""Checks of the reference side itself (reference.py), independent of Tandem: they pin down what transformers
5.17 + peft 0.18.1 do with LoRA on fused MoE experts, which docs/peft_formats.md describes.

- the PEFT 0.18.1 fused (target_parameters) layout built from per-expert LoRAs reproduces per-expert LoRA exactly:
  one MoE layer against a plain torch autograd reference (outputs and gradients), and whole models against the
  per-expert adapter merged into the weights by hand;
- saved key names, shapes, rank/alpha patterns, scaling (also rsLoRA), adapter dtype under a bf16 base;
- what `all-linear` picks per architecture; the awkward routing paths the tiny models are built to exercise.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import reference as R

pytestmark = pytest.mark.filterwarnings("ignore:Unsupported layer type:UserWarning")

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache = {}

    def get(arch, rslora=False, router_lora=False):
        key = (arch, rslora, router_lora)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"{arch}_{int(rslora)}{int(router_lora)}")
            model_dir = R.make_tiny_model(arch, root / "model", seed=0)
            ad = R.make_adapter(model_dir, root / "adapter", rank=3, alpha=5, rslora=rslora, seed=1,
                                router_lora=router_lora, per_expert_dir=root / "adapter_per_expert")
            cache[key] = (model_dir, ad)
        return cache[key]

    return get


def test_fused_layout_round_trip():
    g = torch.Generator().manual_seed(0)
    E, r, I, H = 5, 3, 7, 11
    per = {}
    for e in range(E):
        per[(e, "gate_proj")] = (torch.randn(r, H, generator=g), torch.randn(I, r, generator=g))
        per[(e, "up_proj")] = (torch.randn(r, H, generator=g), torch.randn(I, r, generator=g))
        per[(e, "down_proj")] = (torch.randn(r, I, generator=g), torch.randn(H, r, generator=g))
    gu_A, gu_B, dn_A, dn_B = R.per_expert_to_fused(per, E, r, I, H)
    assert gu_A.shape == (E * 2 * r, 2 * I) and gu_B.shape == (H, 2 * r * E)
    assert dn_A.shape == (E * r, H) and dn_B.shape == (I, r * E)
    back = R.fused_to_per_expert(gu_A, gu_B, dn_A, dn_B, E, r, I)
    for k, (A, B) in per.items():
        assert torch.equal(back[k][0], A) and torch.equal(back[k][1], B), k
    # PEFT's own delta formula (ParamWrapper.get_delta_weight) on the fused tensors == per-expert B @ A blocks
    delta = torch.einsum("o r e, e r i -> e i o", gu_B.reshape(H, 2 * r, E), gu_A.reshape(E, 2 * r, 2 * I))
    for e in range(E):
        (Ag, Bg), (Au, Bu) = per[(e, "gate_proj")], per[(e, "up_proj")]
        torch.testing.assert_close(delta[e], torch.cat([Bg @ Ag, Bu @ Au]), rtol=1e-5, atol=1e-5)
    delta = torch.einsum("o r e, e r i -> e i o", dn_B.reshape(I, r, E), dn_A.reshape(E, r, H))
    for e in range(E):
        Ad, Bd = per[(e, "down_proj")]
        torch.testing.assert_close(delta[e], Bd @ Ad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_moe_top1", "qwen2_moe", "deepseek_v2", "deepseek_v3", "mixtral"])
def test_saved_adapter_names_shapes_and_config(models, arch):
    model_dir, ad = models(arch)
    cfg = R.read_adapter_config(ad["fused"])
    state = load_file(str(ad["fused"] / R.ADAPTER_FILE))
    model = R.load_reference(model_dir)
    r = cfg["r"]
    assert cfg["target_parameters"] == R.EXPERT_PARAMS
    assert cfg["rank_pattern"] == {"mlp.experts.gate_up_proj": 2 * r}
    assert cfg["alpha_pattern"] == {"mlp.experts.gate_up_proj": 2 * cfg["lora_alpha"]}
    assert cfg["peft_version"] == "0.18.1"
    for layer, experts in R.moe_layers(model):
        E, I, H = experts.num_experts, experts.intermediate_dim, experts.hidden_dim
        assert tuple(experts.gate_up_proj.shape) == (E, 2 * I, H)
        assert tuple(experts.down_proj.shape) == (E, H, I)
        k = R.fused_keys(layer)
        assert tuple(state[k["gu_A"]].shape) == (E * 2 * r, 2 * I)   # PEFT reads [E, 2I, H] as [E, in, out]
        assert tuple(state[k["gu_B"]].shape) == (H, 2 * r * E)
        assert tuple(state[k["dn_A"]].shape) == (E * r, H)
        assert tuple(state[k["dn_B"]].shape) == (I, r * E)
    for key, t in state.items():
        assert key.startswith("base_model.model.model.layers."), key
        assert key.endswith(".lora_A.weight") or key.endswith(".lora_B.weight"), key
        if ".mlp.experts." not in key:
            module = model.get_submodule(key[len("base_model.model."):].rsplit(".lora_", 1)[0])
            assert isinstance(module, torch.nn.Linear)
            want = (r, module.in_features) if ".lora_A." in key else (module.out_features, r)
            assert tuple(t.shape) == want, key
            assert t.abs().sum() > 0, key   # non-zero A and B
    per_state = load_file(str(ad["per_expert"] / R.ADAPTER_FILE))
    per_cfg = R.read_adapter_config(ad["per_expert"])
    assert not per_cfg["target_parameters"] and not per_cfg["rank_pattern"]
    for layer, experts in R.moe_layers(model):
        E, I, H = experts.num_experts, experts.intermediate_dim, experts.hidden_dim
        for e in range(E):
            assert tuple(per_state[R.expert_key(layer, e, "gate_proj", "A")].shape) == (r, H)
            assert tuple(per_state[R.expert_key(layer, e, "up_proj", "B")].shape) == (I, r)
            assert tuple(per_state[R.expert_key(layer, e, "down_proj", "A")].shape) == (r, I)
            assert tuple(per_state[R.expert_key(layer, e, "down_proj", "B")].shape) == (H, r)


@pytest.mark.parametrize("rslora", [False, True])
def test_loaded_scaling_matches_per_expert(models, rslora):
    model_dir, ad = models("qwen3_moe", rslora=rslora)
    cfg = R.read_adapter_config(ad["fused"])
    pm = R.load_reference(model_dir, ad["fused"])
    want = R.lora_scaling(cfg["lora_alpha"], cfg["r"], rslora)
    base = pm.get_base_model()
    for layer, _ in R.moe_layers(base):
        wrapper = base.model.layers[layer].mlp.experts
        assert wrapper.parameter_name == "down_proj" and wrapper.base_layer.parameter_name == "gate_up_proj"
        assert wrapper.r["default"] == cfg["r"] and wrapper.base_layer.r["default"] == 2 * cfg["r"]
        assert math.isclose(wrapper.scaling["default"], want, rel_tol=1e-12)
        assert math.isclose(wrapper.base_layer.scaling["default"], want, rel_tol=1e-12)
        q = base.model.layers[layer].self_attn.q_proj
        assert math.isclose(q.scaling["default"], want, rel_tol=1e-12)


@pytest.mark.parametrize("arch,rslora", [("qwen3_moe", False), ("qwen3_moe", True), ("mixtral", False),
                                         ("deepseek_v3", True), ("qwen3_moe_top1", False)])
def test_peft_fused_layer_equals_torch_reference(models, arch, rslora):
    """One MoE layer: PEFT's nested ParamWrappers on the fused experts == plain torch per-expert LoRA, forward and
    backward (grads of PEFT's fused tensors mapped to per-expert by their diagonal blocks)."""
    model_dir, ad = models(arch, rslora=rslora)
    cfg = R.read_adapter_config(ad["fused"])
    pm = R.load_reference(model_dir, ad["fused"])
    base = pm.get_base_model()
    layer, experts = R.moe_layers(base)[0]
    wrapper = base.model.layers[layer].mlp.experts
    E, H, k = experts.num_experts, experts.hidden_dim, base.config.num_experts_per_tok
    g = torch.Generator().manual_seed(5)
    T = 6
    hidden = torch.randn(T, H, generator=g)
    # route to a subset of experts only: the rest must get exactly zero gradient
    top_k_index = torch.stack([torch.randperm(max(E // 2, k), generator=g)[:k] for _ in range(T)])
    top_k_weights = torch.rand(T, k, generator=g)

    x1 = hidden.clone().requires_grad_(True)
    pm.zero_grad(set_to_none=True)
    y_peft = wrapper(x1, top_k_index, top_k_weights)
    dy = torch.randn(y_peft.shape, generator=g)
    (y_peft * dy).sum().backward()
    fk = R.fused_keys(layer, prefix="base_model.model.model.layers")
    named = {R.peft_name(n): p for n, p in pm.named_parameters()}
    fused_grads = {k2: named[v].grad for k2, v in fk.items()}
    per_grads = R.fused_to_per_expert(fused_grads["gu_A"], fused_grads["gu_B"], fused_grads["dn_A"],
                                      fused_grads["dn_B"], E, cfg["r"], experts.intermediate_dim)

    lora = {(e, proj): (A.clone().requires_grad_(True), B.clone().requires_grad_(True))
            for (L, e, proj), (A, B) in ad["per"].items() if L == layer}
    x2 = hidden.clone().requires_grad_(True)
    y_ref = R.torch_reference_expert_lora(x2, top_k_index, top_k_weights, experts.gate_up_proj.detach(),
                                          experts.down_proj.detach(), lora,
                                          R.lora_scaling(cfg["lora_alpha"], cfg["r"], rslora))
    (y_ref * dy).sum().backward()

    assert R.rel_l2(y_peft.detach(), y_ref.detach()) < 1e-6
    assert R.rel_l2(x1.grad, x2.grad) < 1e-6
    used = set(top_k_index.flatten().tolist())
    for (e, proj), (A, B) in lora.items():
        gA, gB = per_grads[(e, proj)]
        rA = A.grad if A.grad is not None else torch.zeros_like(A)   # unused expert: no graph, zero grad
        rB = B.grad if B.grad is not None else torch.zeros_like(B)
        assert R.rel_l2(gA, rA) < 1e-5 and R.rel_l2(gB, rB) < 1e-5, (e, proj, R.rel_l2(gA, rA), R.rel_l2(gB, rB))
        if e not in used:
            assert gA.abs().max() == 0 and gB.abs().max() == 0


@pytest.mark.parametrize("arch", R.MOE_ARCHS)
def test_whole_model_fused_equals_merged_per_expert(models, arch):
    """PEFT with the fused adapter == the per-expert adapter merged into the weights by plain torch."""
    model_dir, ad = models(arch)
    model = R.load_reference(model_dir)
    tokens, labels = R.make_batch(model.config.vocab_size, R.LENGTHS, seed=3)
    ref = R.reference_forward(model_dir, ad["fused"], tokens, labels)
    merged = R.merged_reference_logits(model_dir, ad["per_expert"], tokens)
    mask = ref["mask"]
    assert R.rel_l2(R.valid_positions(merged, mask), R.valid_positions(ref["logits"], mask)) < 1e-5
    base = R.reference_forward(model_dir, None, tokens)
    # and the adapter really changes the output (non-zero B)
    assert R.rel_l2(R.valid_positions(base["logits"], mask), R.valid_positions(ref["logits"], mask)) > 1e-2


def test_router_lora_as_2d_target_parameter(models):
    model_dir, ad = models("deepseek_v3", router_lora=True)
    cfg = R.read_adapter_config(ad["fused"])
    assert cfg["target_parameters"] == R.EXPERT_PARAMS + ["mlp.gate.weight"]
    state = load_file(str(ad["fused"] / R.ADAPTER_FILE))
    E, H, r = 8, 64, cfg["r"]
    assert tuple(state["base_model.model.model.layers.1.mlp.gate.lora_A.weight"].shape) == (r, H)
    assert tuple(state["base_model.model.model.layers.1.mlp.gate.lora_B.weight"].shape) == (E, r)
    model = R.load_reference(model_dir)
    tokens, labels = R.make_batch(model.config.vocab_size, R.LENGTHS, seed=3)
    ref = R.reference_forward(model_dir, ad["fused"], tokens, labels)
    merged = R.merged_reference_logits(model_dir, ad["per_expert"], tokens)
    mask = ref["mask"]
    assert R.rel_l2(R.valid_positions(merged, mask), R.valid_positions(ref["logits"], mask)) < 1e-5
    assert ref["grads"]["base_model.model.model.layers.1.mlp.gate.lora_B.weight"].norm() > 0


ALL_LINEAR = {
    "qwen3_moe": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    "qwen2_moe": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "shared_expert_gate", "up_proj",
                  "v_proj"],
    "deepseek_v2": ["down_proj", "gate_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_proj", "up_proj"],
    "deepseek_v3": ["down_proj", "gate_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_a_proj", "q_b_proj",
                    "up_proj"],
    "mixtral": ["k_proj", "o_proj", "q_proj", "v_proj"],
    "llama": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    "qwen2": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    "qwen3": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
}


@pytest.mark.parametrize("arch", list(ALL_LINEAR))
def test_all_linear_picks(tmp_path, arch):
    """transformers 5.17 + peft 0.18.1 `all-linear`: routers and routed experts are not nn.Linear -> never picked."""
    from peft import LoraConfig, get_peft_model
    model = AutoModel(arch)
    pm = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear"))
    picked = sorted(set(n.rsplit(".", 1)[-1] for n in pm.peft_config["default"].target_modules))
    assert picked == ALL_LINEAR[arch]
    assert not any(".mlp.gate" == n[-9:] or ".experts" in n for n in pm.peft_config["default"].target_modules)


def AutoModel(arch):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_config(R.build_config(arch))


def test_adapter_stays_fp32_under_bf16_base(models):
    model_dir, ad = models("qwen3_moe")
    pm = R.load_reference(model_dir, ad["fused"], "bf16")
    dtypes = {(".lora_" in n, p.dtype) for n, p in pm.named_parameters()}
    assert dtypes == {(True, torch.float32), (False, torch.bfloat16)}


def test_tiny_models_exercise_the_awkward_paths(tmp_path):
    d = R.make_tiny_model("deepseek_v3", tmp_path / "v3")
    state = load_file(str(d / "model.safetensors"))
    bias = state["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert bias.abs().min() > 0                               # non-zero correction bias, saved
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["routed_scaling_factor"] == 2.5 and cfg["n_group"] == 4 and cfg["topk_group"] == 2
    assert cfg["rope_parameters"]["rope_type"] == "yarn" and cfg["rope_parameters"]["mscale_all_dim"] == 0.707
    assert "model.layers.0.mlp.gate_proj.weight" in state     # first_k_dense_replace=1: dense layer 0
    # v3 on disk: per-expert names (save_pretrained reverses the in-memory fusion)
    assert tuple(state["model.layers.1.mlp.experts.3.gate_proj.weight"].shape) == (24, 64)

    d = R.make_tiny_model("mixtral", tmp_path / "mx")
    names = set(load_file(str(d / "model.safetensors")))
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight" in names     # on-disk Mixtral names
    assert "model.layers.0.block_sparse_moe.gate.weight" in names

    d = R.make_tiny_model("qwen3_moe_top1", tmp_path / "top1")
    model = R.load_reference(d)
    tokens, labels = R.make_batch(model.config.vocab_size, R.LENGTHS, seed=0)
    ref = R.reference_forward(d, None, tokens, labels, routing=True)
    used = set(ref["routing"][1][ref["mask"].flatten().bool()].flatten().tolist())
    assert len(used) < 16                                     # some experts get no token
    assert set(ref["routing"]) == {1}                         # decoder_sparse_step=2: layers 0 and 2 dense


def test_make_fixture_script(tmp_path):
    out = tmp_path / "fx"
    result = subprocess.run([sys.executable, str(HERE / "make_fixture.py"), "qwen3_moe_top1", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    for name in ("model/config.json", "adapter/adapter_config.json", "adapter_per_expert/adapter_model.safetensors",
                 "tokens.json", "labels.json", "reference.safetensors", "reference_fused_grads.safetensors",
                 "meta.json", "README.txt"):
        assert (out / name).exists(), name
    ref = R.load_outputs(out / "reference.safetensors")
    assert ref["logits"].shape[:2] == (3, 12) and ref["loss"].dim() == 0
    assert "base_model.model.model.layers.1.mlp.experts.0.gate_proj.lora_A.weight" in ref["grads"]
