"""LoRA experts (issue 32) against an independent PyTorch reference.

The reference is transformers + peft (the same model and PEFT adapter as test_model_parity.py) with the LoRA
experts added by forward hooks on each MoE block: the fp32 SwiGLU `down(silu(gate(x)) * up(x))`, summed over the
paths, written here from the saved file's tensors (docs/peft_formats.md section 5). `tandem debug grad` on the
same adapter dir must give the same logits, loss, LoRA gradients and LoRA-expert gradients (fp32, 1e-4
relative). A zero `down` must leave the model exactly as without LE."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import reference as R
from test_model_parity import run_debug, tandem  # noqa: F401  (the `tandem` fixture)

LE_PREFIX = "base_model.model.model.layers"


def write_lora_experts(case, name, paths=2, le_dim=8, seed=5, zero_down=False):
    """Copy case/adapter to case/name and add LoRA experts with random (non-zero) weights."""
    cfg = json.loads((case / "model" / "config.json").read_text())
    hidden = cfg["hidden_size"]
    base = R.load_reference(case / "model")
    layers = [i for i, _ in R.moe_layers(base)]
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in layers:
        for k in range(paths):
            for proj, shape in (("gate_proj", (le_dim, hidden)), ("up_proj", (le_dim, hidden)),
                                ("down_proj", (hidden, le_dim))):
                t = torch.randn(shape, generator=g) * 0.3
                if zero_down and proj == "down_proj":
                    t = torch.zeros(shape)
                tensors[f"{LE_PREFIX}.{layer}.mlp.lora_experts.{k}.{proj}.weight"] = t
    out = case / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(case / "adapter", out)
    save_file(tensors, str(out / "lora_experts.safetensors"))
    (out / "lora_experts_config.json").write_text(json.dumps(
        {"format": "tandem_lora_experts", "version": 1, "lora_experts": paths, "le_dim": le_dim,
         "hidden_size": hidden}))
    return out, tensors, layers, paths


def reference_with_lora_experts(case, adapter, tensors, layers, paths):
    """Logits, loss and every gradient (LoRA under Tandem's names, LE under their saved names) of
    transformers + peft with the LE added to each MoE block's output by a hook."""
    tokens = json.loads((case / "tokens.json").read_text())
    labels = json.loads((case / "labels.json").read_text())
    model = R.load_reference(case / "model", adapter, "fp32")
    model.train()
    le = {k: v.clone().requires_grad_(True) for k, v in tensors.items()}
    base = model.get_base_model()
    hooks = []
    for layer in layers:
        def add_le(module, inputs, output, layer=layer):
            x = inputs[0].float()
            extra = 0
            for k in range(paths):
                w = {p: le[f"{LE_PREFIX}.{layer}.mlp.lora_experts.{k}.{p}.weight"]
                     for p in ("gate_proj", "up_proj", "down_proj")}
                extra = extra + F.linear(F.silu(F.linear(x, w["gate_proj"])) * F.linear(x, w["up_proj"]),
                                         w["down_proj"])
            if isinstance(output, tuple):
                return (output[0] + extra.to(output[0].dtype), *output[1:])
            return output + extra.to(output.dtype)
        hooks.append(base.model.layers[layer].mlp.register_forward_hook(add_le))
    ids, mask, lab = R.pad_batch(tokens, labels)
    out = model(input_ids=ids, attention_mask=mask, labels=lab, use_cache=False)
    out.loss.backward()
    for h in hooks:
        h.remove()
    grads = {R.peft_name(n): (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in model.named_parameters() if ".lora_" in n and p.requires_grad}
    ref = {"logits": out.logits.detach().float(), "loss": out.loss.detach().float(), "mask": mask, "grads": grads}
    ref["expert_grads"] = R.fused_grads_to_per_expert(grads, R.read_adapter_config(adapter), model)
    ref["grads"] = R.tandem_expected_grads(ref)
    del ref["expert_grads"]
    ref["grads"].update({k: v.grad.detach().clone() for k, v in le.items()})
    return ref


@pytest.fixture(scope="module")
def le_cases(tmp_path_factory):
    built = {}

    def get(arch):
        if arch not in built:
            built[arch] = R.build_case(arch, tmp_path_factory.mktemp(f"le_{arch}"))
        return built[arch]
    return get


# qwen3_moe: routed experts only; deepseek_v2: shared experts too (LE goes after their sum).
@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v2"])
def test_lora_experts_forward_and_gradients_match_torch_reference(tandem, le_cases, tmp_path, arch):
    case = le_cases(arch)
    adapter, tensors, layers, paths = write_lora_experts(case, "adapter_le")
    out = tmp_path / "le.safetensors"
    result = run_debug(tandem, "grad", case, out, adapter="adapter_le")
    assert result.returncode == 0, result.stderr
    got = R.load_outputs(out)
    ref = reference_with_lora_experts(case, adapter, tensors, layers, paths)
    mask = ref["mask"]
    assert R.rel_l2(R.valid_positions(got["logits"], mask), R.valid_positions(ref["logits"], mask)) <= 1e-4
    assert abs(float(got["loss"]) - float(ref["loss"])) <= 1e-4 * abs(float(ref["loss"]))
    le_keys = [k for k in ref["grads"] if ".lora_experts." in k]
    assert len(le_keys) == 3 * paths * len(layers)
    assert set(ref["grads"]) == set(got["grads"]), set(ref["grads"]) ^ set(got["grads"])
    largest = max(float(v.norm()) for v in ref["grads"].values())
    for key, want in ref["grads"].items():
        have = got["grads"][key]
        err = float((have.double() - want.double()).norm())
        assert err <= 1e-4 * float(want.double().norm()) + 1e-7 * largest, (key, err, float(want.norm()))
    # The LE changes the model: the same adapter without LE is measurably elsewhere.
    plain = tmp_path / "plain.safetensors"
    assert run_debug(tandem, "forward", case, plain, adapter="adapter", labels=False).returncode == 0
    assert R.rel_l2(R.valid_positions(R.load_outputs(plain)["logits"], mask),
                    R.valid_positions(ref["logits"], mask)) > 1e-3


def test_zero_down_lora_experts_leave_the_model_exactly_as_without(tandem, le_cases, tmp_path):
    case = le_cases("qwen3_moe")
    write_lora_experts(case, "adapter_le_zero", zero_down=True)
    with_le, without = tmp_path / "with.safetensors", tmp_path / "without.safetensors"
    assert run_debug(tandem, "grad", case, with_le, adapter="adapter_le_zero").returncode == 0
    assert run_debug(tandem, "grad", case, without, adapter="adapter").returncode == 0
    a, b = load_file(str(with_le)), load_file(str(without))
    assert torch.equal(a["loss"], b["loss"]) and torch.equal(a["logits"], b["logits"])
    for key in b:  # LoRA grads unchanged too (gate/up of a zero-down path get exactly zero)
        assert torch.equal(a[key], b[key]), key
    for key in a:
        if ".lora_experts." in key and not key.endswith("down_proj.weight"):
            assert not a[key].any(), key


@pytest.mark.parametrize("mutate,phrase", [
    (lambda d: (d / "lora_experts.safetensors").unlink(), "lora_experts_config.json but not"),
    (lambda d: (d / "lora_experts_config.json").write_text('{"lora_experts": 2, "le_dim": 8, "hidden_size": 7}'),
     "hidden_size"),
    (lambda d: (d / "lora_experts_config.json").write_text('{"lora_experts": 3, "le_dim": 8, "hidden_size": 64}'),
     "lacks"),
])
def test_damaged_lora_expert_files_are_errors(tandem, le_cases, tmp_path, mutate, phrase):
    case = le_cases("qwen3_moe")
    adapter, *_ = write_lora_experts(case, "adapter_le_bad")
    cfg = json.loads((adapter / "lora_experts_config.json").read_text())
    mutate(adapter)
    text = (adapter / "lora_experts_config.json").read_text() if (adapter / "lora_experts_config.json").exists() else ""
    if '"hidden_size": 64' in text:  # keep the model's width where the case is about the path count
        (adapter / "lora_experts_config.json").write_text(text.replace("64", str(cfg["hidden_size"])))
    result = run_debug(tandem, "grad", case, tmp_path / "o.safetensors", adapter="adapter_le_bad")
    assert result.returncode == 1 and phrase in result.stderr, result.stderr
