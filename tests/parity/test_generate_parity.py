"""Greedy generation of Tandem (`tandem debug generate`, KV-cached prefill + decode) against transformers 5.17
`model.generate(do_sample=False, max_new_tokens=64)` (+ peft 0.18.1 for adapters), token for token, fp32.

Every architecture of reference.ARCHS, each with a random non-zero LoRA adapter on every linear and (MoE models)
on the routed experts in PEFT's fused target_parameters form. Tandem loads the base once and the adapter beside
it, unmerged, and answers every prompt with the base and then the adapter, so switching is exercised both ways.
Merged adapters (`--merge`) and the per-expert adapter form are checked on a subset. Neither side stops early: the
models carry no eos for transformers, and Tandem runs with stop_on_eos off.

  tandem debug generate --model DIR [--adapter DIR [--merge]] --tokens PROMPTS.json --max-new-tokens N
      prints {"base": [[ids]...], "adapter": [[ids]...]}
"""

import json
import subprocess
from pathlib import Path

import pytest
import torch

import reference as R

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NEW_TOKENS = 64
PROMPT_LENGTHS = [7, 13]


@pytest.fixture(scope="session")
def cases(tmp_path_factory):
    built = {}

    def get(arch):
        if arch not in built:
            root = tmp_path_factory.mktemp(f"gen_{arch}")
            model_dir = R.make_tiny_model(arch, root / "model", seed=3)
            ad = R.make_adapter(model_dir, root / "adapter", rank=4, alpha=8, seed=4,
                                per_expert_dir=root / "adapter_per_expert")
            g = torch.Generator().manual_seed(5)
            vocab = R.build_config(arch).vocab_size
            prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
            (root / "prompts.json").write_text(json.dumps(prompts))
            built[arch] = {"root": root, "model": model_dir, "adapter": ad["fused"],
                           "adapter_per_expert": ad["per_expert"], "prompts": prompts}
        return built[arch]

    return get


@torch.no_grad()
def hf_generate(model_dir, adapter_dir, prompts):
    model = R.load_reference(model_dir, adapter_dir, "fp32")
    model.eval()
    base = model.get_base_model() if adapter_dir else model
    base.generation_config.eos_token_id = None  # run all NEW_TOKENS, as Tandem's stop_on_eos off
    base.generation_config.pad_token_id = R.PAD_ID
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=NEW_TOKENS, use_cache=True)
        out.append(seq[0, len(p):].tolist())
    return out


def tandem_generate(tandem, case, adapter=None, merge=False, extra=()):
    cmd = [tandem, "debug", "generate", "--model", str(case["model"]), "--tokens", str(case["root"] / "prompts.json"),
           "--max-new-tokens", str(NEW_TOKENS)]
    if adapter:
        cmd += ["--adapter", str(adapter)]
    if merge:
        cmd.append("--merge")
    cmd += list(extra)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def assert_same_tokens(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert len(g) == NEW_TOKENS and len(w) == NEW_TOKENS, f"{what} prompt {i}: lengths {len(g)} / {len(w)}"
        first = next((t for t in range(NEW_TOKENS) if g[t] != w[t]), None)
        assert first is None, f"{what} prompt {i}: token {first} is {g[first]}, transformers has {w[first]}\n{g}\n{w}"


@pytest.mark.parametrize("arch", list(R.ARCHS))
def test_greedy_base_and_adapter_match_transformers(tandem, cases, arch):
    case = cases(arch)
    got = tandem_generate(tandem, case, adapter=case["adapter"])
    assert_same_tokens(got["base"], hf_generate(case["model"], None, case["prompts"]), f"{arch} base")
    want_adapter = hf_generate(case["model"], case["adapter"], case["prompts"])
    assert_same_tokens(got["adapter"], want_adapter, f"{arch} adapter")
    assert got["adapter"] != got["base"], "the adapter must change the answer (else this test proves nothing)"


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "llama3"])
def test_merged_adapter_matches_transformers(tandem, cases, arch):
    case = cases(arch)
    got = tandem_generate(tandem, case, adapter=case["adapter"], merge=True)
    assert "base" not in got
    assert_same_tokens(got["adapter"], hf_generate(case["model"], case["adapter"], case["prompts"]),
                       f"{arch} merged adapter")


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v2"])
def test_resident_experts_generate_the_same(tandem, cases, arch):
    """--gpu-experts 2: the most routed experts of the first prompt's forward computed by torch on the device (here
    the CPU device), the rest by the CPU engine, through prefill and KV-cached decode, base and adapter."""
    case = cases(arch)
    got = tandem_generate(tandem, case, adapter=case["adapter"], extra=["--gpu-experts", "2"])
    assert_same_tokens(got["base"], hf_generate(case["model"], None, case["prompts"]), f"{arch} base")
    assert_same_tokens(got["adapter"], hf_generate(case["model"], case["adapter"], case["prompts"]), f"{arch} adapter")


@pytest.mark.parametrize("arch", ["qwen2_moe", "deepseek_v2"])
def test_per_expert_adapter_form_generates_the_same(tandem, cases, arch):
    case = cases(arch)
    fused = tandem_generate(tandem, case, adapter=case["adapter"])
    per_expert = tandem_generate(tandem, case, adapter=case["adapter_per_expert"])
    assert per_expert["adapter"] == fused["adapter"]


def test_seeded_sampling_is_reproducible(tandem, cases):
    case = cases("qwen3_moe")

    def sample(seed):
        cmd = [tandem, "debug", "generate", "--model", str(case["model"]), "--tokens",
               str(case["root"] / "prompts.json"), "--max-new-tokens", "32", "--sample", "--seed", str(seed)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)["base"]

    first, again, other = sample(11), sample(11), sample(12)
    assert first == again
    assert first != other


def test_bad_inputs_are_errors_not_crashes(tandem, cases, tmp_path):
    case = cases("llama")
    bad = tmp_path / "bad.json"
    bad.write_text("[[1, 2, 999999]]")
    run = subprocess.run([tandem, "debug", "generate", "--model", str(case["model"]), "--tokens", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "outside the vocabulary" in run.stderr
    run = subprocess.run([tandem, "debug", "generate", "--model", str(case["model"]), "--tokens",
                          str(case["root"] / "prompts.json"), "--adapter", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "adapter_config.json" in run.stderr
