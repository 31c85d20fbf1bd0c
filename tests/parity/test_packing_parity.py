"""Sequence packing (`packing`, `neat_packing`) against transformers + peft, through `tandem debug --pack`.

`tandem debug grad --pack plain|neat --cutoff-len N` packs its token rows (samples) exactly as `tandem train` packs
them (engine/train/packing.h: LLaMA-Factory's greedy knapsack into rows of at most N - 1 tokens) and writes the
packed rows' logits, loss and LoRA gradients; --packed-layout says which samples went into which row, in order.

  neat:  the loss (sum over the kept tokens / their count, the trainer's definition) and every LoRA gradient equal
         transformers + peft on the samples one by one (a right-padded batch), and so does every sample's logits,
         read back out of the packed rows: attention stays inside each sample and positions restart at 0.
  plain: transformers + peft on the concatenated rows (samples attend to each other, positions run on).
fp32, the model parity bounds (reference.FP32_REL). Tiny GQA (Qwen3-MoE) and MLA (DeepSeek-V2, yarn rope) models.
TANDEM_PACKING_DEVICE=cuda:0 runs Tandem's side on that device (the H200 check); default: the CPU.
"""

import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file

import reference as R

pytestmark = pytest.mark.filterwarnings("ignore:Unsupported layer type:UserWarning")

ARCHS = ["qwen3_moe", "deepseek_v2"]
LENGTHS = [9, 7, 6, 5, 4, 3, 8]  # samples
CUTOFF = 19  # rows of at most 18 tokens: three rows of two or three samples


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    built = {}

    def get(arch):
        if arch not in built:
            root = tmp_path_factory.mktemp(f"pack_{arch}")
            model_dir = R.make_tiny_model(arch, root / "model", seed=0)
            R.make_adapter(model_dir, root / "adapter", rank=4, alpha=8, seed=1)
            model = R.load_reference(model_dir, root / "adapter", "fp32")
            # Every label a target (train_on_prompt): a sample's first label, which neat packing must mask,
            # would otherwise be counted.
            tokens, labels, _ = R.pick_batch(model, LENGTHS, ignore_prefix=0)
            (root / "tokens.json").write_text(json.dumps(tokens))
            (root / "labels.json").write_text(json.dumps(labels))
            built[arch] = {"root": root, "model": model, "tokens": tokens, "labels": labels}
        return built[arch]

    return get


def run_packed(tandem, case, mode, pack, tmp_path, tokens_file="tokens.json"):
    root = case["root"]
    tag = f"{mode}_{pack}_{tokens_file.removesuffix('.json')}"
    out, layout = tmp_path / f"{tag}.safetensors", tmp_path / f"{tag}_layout.json"
    cmd = [tandem, "debug", mode, "--model", str(root / "model"), "--adapter", str(root / "adapter"),
           "--tokens", str(root / tokens_file), "--labels", str(root / "labels.json"), "--out", str(out),
           "--pack", pack, "--cutoff-len", str(CUTOFF), "--packed-layout", str(layout),
           "--device", os.environ.get("TANDEM_PACKING_DEVICE", "cpu")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"tandem debug {mode} --pack {pack} failed:\n{result.stderr}"
    return R.load_outputs(out), json.loads(layout.read_text())["rows"]


def reference(case, tokens, labels):
    """transformers + peft on right-padded rows (each row alone): logits, loss, LoRA grads (experts per expert)."""
    return R.reference_forward(case["root"] / "model", case["root"] / "adapter", tokens, labels, model=case["model"])


def unpack_logits(logits, rows, lengths):
    """{sample index: its logits [len, V]} read out of packed rows laid out as `rows`."""
    out = {}
    for r, samples in enumerate(rows):
        start = 0
        for i in samples:
            out[i] = logits[r, start:start + lengths[i]]
            start += lengths[i]
    return out


def assert_grads_close(got, ref):
    want = R.tandem_expected_grads(ref)
    assert sorted(got) == sorted(want)
    biggest = max(float(g.double().norm()) for g in want.values())
    worst = {k: float((got[k].double() - want[k].double()).norm()) / max(float(want[k].double().norm()), 1e-30)
             for k in want
             if float((got[k].double() - want[k].double()).norm()) > R.FP32_REL * float(want[k].double().norm())
             + 1e-7 * biggest}
    assert not worst, f"{len(worst)} grads over rel-L2 {R.FP32_REL}: {sorted(worst.items(), key=lambda kv: -kv[1])[:5]}"


def test_layout_packs_every_sample_once_within_the_cutoff(tandem, cases, tmp_path):
    case = cases("qwen3_moe")
    _, rows = run_packed(tandem, case, "forward", "neat", tmp_path)
    assert sorted(i for row in rows for i in row) == list(range(len(LENGTHS)))
    assert all(sum(LENGTHS[i] for i in row) <= CUTOFF - 1 for row in rows)
    assert len(rows) > 1


@pytest.mark.parametrize("arch", ARCHS)
def test_neat_packing_equals_the_samples_one_by_one(tandem, cases, tmp_path, arch):
    case = cases(arch)
    ref = reference(case, case["tokens"], case["labels"])
    got, rows = run_packed(tandem, case, "grad", "neat", tmp_path)
    assert abs(float(got["loss"]) / float(ref["loss"]) - 1) <= R.FP32_REL
    assert_grads_close(got["grads"], ref)
    lengths = [len(t) for t in case["tokens"]]
    per_sample = unpack_logits(got["logits"], rows, lengths)
    for i, n in enumerate(lengths):
        assert R.rel_l2(per_sample[i], ref["logits"][i, :n]) <= R.FP32_REL, f"sample {i}"


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_packing_equals_transformers_on_the_concatenated_rows(tandem, cases, tmp_path, arch):
    case = cases(arch)
    got, rows = run_packed(tandem, case, "grad", "plain", tmp_path)
    tokens = [sum((case["tokens"][i] for i in row), []) for row in rows]
    labels = [sum((case["labels"][i] for i in row), []) for row in rows]
    ref = reference(case, tokens, labels)
    errors = R.compare_outputs(got, ref)
    assert errors["logits_rel_l2"] <= R.FP32_REL, errors
    assert errors["loss_rel"] <= R.FP32_REL, errors
    assert_grads_close(got["grads"], ref)
    # And it is not the one-by-one loss: the packed samples do see each other.
    alone = reference(case, case["tokens"], case["labels"])
    assert abs(float(got["loss"]) / float(alone["loss"]) - 1) > 10 * R.FP32_REL


@pytest.mark.parametrize("arch", ARCHS)
def test_a_change_in_one_sample_reaches_the_next_only_without_neat_packing(tandem, cases, tmp_path, arch):
    """Change the first token of the first sample of a row: under neat packing the row's other samples keep their
    logits (and loss); under plain packing they change."""
    case = cases(arch)
    lengths = [len(t) for t in case["tokens"]]
    before_neat, rows = run_packed(tandem, case, "forward", "neat", tmp_path)
    before_plain, plain_rows = run_packed(tandem, case, "forward", "plain", tmp_path)
    assert plain_rows == rows
    row = next(r for r in rows if len(r) >= 2)
    first, later = row[0], row[1:]
    changed = [list(t) for t in case["tokens"]]
    changed[first][0] = changed[first][0] % (case["model"].config.vocab_size - 1) + 1
    (case["root"] / "tokens_changed.json").write_text(json.dumps(changed))
    after_neat, _ = run_packed(tandem, case, "forward", "neat", tmp_path, "tokens_changed.json")
    after_plain, _ = run_packed(tandem, case, "forward", "plain", tmp_path, "tokens_changed.json")
    b_neat, a_neat = (unpack_logits(o["logits"], rows, lengths) for o in (before_neat, after_neat))
    b_plain, a_plain = (unpack_logits(o["logits"], rows, lengths) for o in (before_plain, after_plain))
    assert R.rel_l2(a_neat[first], b_neat[first]) > 1e-3  # the change itself shows
    for i in later:
        assert R.rel_l2(a_neat[i], b_neat[i]) <= 1e-6, f"neat: sample {i} saw sample {first}"
        assert R.rel_l2(a_plain[i], b_plain[i]) > 1e-4, f"plain: sample {i} did not see sample {first}"
