"""`tandem train` and `tandem demo` as a user runs them: the loss falls, the adapter loads in PEFT with
Tandem's logits, a SIGKILLed run resumes to the same adapter, and bad configs and datasets are refused
without touching an existing output dir."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
TANDEM = os.environ["TANDEM_BIN"]
DEMO_PRESET = REPO / "presets" / "training" / "demo_lora_sft.yaml"
DEMO_DATA = REPO / "resources" / "demo"


def run(args, home, timeout=600, **kw):
    env = dict(os.environ, TANDEM_HOME=str(home))
    return subprocess.run([TANDEM, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env, **kw)


def log_lines(output_dir):
    return [json.loads(line) for line in (Path(output_dir) / "trainer_log.jsonl").read_text().splitlines()]


def losses(output_dir):
    return [line["loss"] for line in log_lines(output_dir) if "loss" in line]


def peft_vs_tandem(model_dir, adapter_dir, dtype, tmp_path):
    """Logits of PEFT (transformers + peft) and of `tandem debug forward` on one identity sample."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(model_dir) / "tokenizer.json"))
    text = "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\nI am Tandem.<|im_end|>\n"
    ids = tok(text)["input_ids"]
    (tmp_path / "tokens.json").write_text(json.dumps([ids]))
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype)
    peft_model = PeftModel.from_pretrained(model, str(adapter_dir))
    with torch.no_grad():
        ref = peft_model(torch.tensor([ids])).logits.float()
    out = tmp_path / "out.safetensors"
    result = subprocess.run([TANDEM, "debug", "forward", "--model", str(model_dir), "--adapter", str(adapter_dir),
                             "--tokens", str(tmp_path / "tokens.json"), "--out", str(out), "--dtype", dtype],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    ours = load_file(str(out))["logits"]
    rel = ((ours - ref).norm() / ref.norm()).item()
    cos = torch.nn.functional.cosine_similarity(ours.flatten().double(), ref.flatten().double(), dim=0).item()
    return rel, cos


def test_demo_learns_the_identity_and_peft_loads_its_adapter(demo, tmp_path):
    assert "with adapter: I am Tandem" in demo["stdout"]
    png = demo["adapter"] / "training_loss.png"  # plot_loss: true (this build has Qt Charts)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000
    history = losses(demo["adapter"])
    assert history[-1] < 0.6 * history[0], history
    rel, cos = peft_vs_tandem(demo["model"], demo["adapter"], "fp32", tmp_path)
    assert rel < 1e-4 and cos > 0.9999
    runs = run(["runs", "--json"], demo["home"])
    assert runs.returncode == 0, runs.stderr
    assert any(r["status"] == "completed" for r in json.loads(runs.stdout))


# A config written exactly like LLaMA-Factory's examples/train_lora/qwen3_lora_sft.yaml; the model, the
# datasets and the output dir point at local files, and max_steps keeps it short.
LLAMA_FACTORY_QWEN3 = """\
### model
model_name_or_path: {model}
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all

### dataset
dataset: identity,alpaca_local,sharegpt_local
dataset_dir: {data}
template: qwen3_nothink
cutoff_len: 2048
max_samples: 1000
overwrite_cache: true
preprocessing_num_workers: 16
dataloader_num_workers: 4

### output
output_dir: {output}
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none  # choices: [none, wandb, tensorboard, swanlab, mlflow]

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-3
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
resume_from_checkpoint: null
"""


def write_local_datasets(data_dir):
    data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEMO_DATA / "identity.json", data_dir / "identity.json")
    alpaca = [{"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"{i} plus {i + 1} is {2 * i + 1}."}
              for i in range(12)]
    (data_dir / "alpaca_local.json").write_text(json.dumps(alpaca))
    sharegpt = [{"conversations": [{"from": "human", "value": f"Name a number above {i}."},
                                   {"from": "gpt", "value": f"{i + 7} is above {i}."}]} for i in range(12)]
    (data_dir / "sharegpt_local.jsonl").write_text("\n".join(json.dumps(r) for r in sharegpt))
    (data_dir / "dataset_info.json").write_text(json.dumps({
        "identity": {"file_name": "identity.json"},
        "alpaca_local": {"file_name": "alpaca_local.json"},
        "sharegpt_local": {"file_name": "sharegpt_local.jsonl", "formatting": "sharegpt"},
    }))


def test_llama_factory_config_trains_in_bf16_and_peft_loads_it(demo, tmp_path):
    data = tmp_path / "data"
    write_local_datasets(data)
    output = tmp_path / "saves"
    config = tmp_path / "qwen3_lora_sft.yaml"
    config.write_text(LLAMA_FACTORY_QWEN3.format(model=demo["model"], data=data, output=output))
    result = run(["train", config, "num_train_epochs=2", "logging_steps=1"], demo["home"])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    history = losses(output)
    assert history[-1] < history[0], history
    assert (output / "adapter_config.json").exists() and (output / "adapter_model.safetensors").exists()
    rel, cos = peft_vs_tandem(demo["model"], output, "bf16", tmp_path)
    assert rel < 2e-2 and cos > 0.999, (rel, cos)


def adapter_tensors(output):
    return load_file(str(Path(output) / "adapter_model.safetensors"))


# lora_experts: LoRA experts (issue 32) are saved in the checkpoint, restored with their AdamW state and
# must come out bit for bit as in the uninterrupted run.
@pytest.mark.parametrize("lora_experts", ["0", "2"])
def test_sigkill_mid_run_then_rerun_gives_the_same_adapter(demo, tmp_path, lora_experts):
    common = ["model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA), "max_steps=24",
              "save_steps=8", "logging_steps=1", "num_train_epochs=100", "overwrite_output_dir=false",
              "lora_experts=" + lora_experts, "le_dim=16"]
    straight = tmp_path / "straight"
    result = run(["train", DEMO_PRESET, *common, "output_dir=" + str(straight)], demo["home"])
    assert result.returncode == 0, result.stderr[-2000:]

    killed = tmp_path / "killed"
    args = [TANDEM, "train", str(DEMO_PRESET), *common, "output_dir=" + str(killed)]
    env = dict(os.environ, TANDEM_HOME=str(demo["home"]))
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 300
    while not (killed / "checkpoint-8" / "trainer_state.json").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (killed / "checkpoint-8").exists()
    assert not (killed / "adapter_model.safetensors").exists(), "the run finished before it was killed"

    result = run(["train", DEMO_PRESET, *common, "output_dir=" + str(killed)], demo["home"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from" in result.stdout
    a, b = adapter_tensors(straight), adapter_tensors(killed)
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-6, worst
    assert losses(straight) == pytest.approx(losses(killed), abs=1e-6)
    if lora_experts != "0":
        le_a = load_file(str(straight / "lora_experts.safetensors"))
        le_b = load_file(str(killed / "lora_experts.safetensors"))
        assert len(le_a) == 4 * 2 * 3 and le_a.keys() == le_b.keys()  # 4 MoE layers x 2 paths x 3
        assert worst == 0, worst  # bit for bit, the LoRA weights beside them too
        assert all(torch.equal(le_a[k], le_b[k]) for k in le_a)
        assert all(le_a[k].any() for k in le_a if k.endswith("down_proj.weight")), "LE did not train"
        assert (killed / "checkpoint-8" / "lora_experts.safetensors").exists()


def test_lora_experts_leave_the_first_loss_exactly_as_without_and_then_train(demo, tmp_path):
    # Their down projection starts at zero: the first step's loss (before any update) is bit for bit the
    # run's without them, and from the second step on they change it.
    common = ["model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA), "max_steps=3",
              "save_steps=100", "logging_steps=1"]
    runs = {}
    for le in ("0", "2"):
        out = tmp_path / f"le{le}"
        result = run(["train", DEMO_PRESET, *common, "output_dir=" + str(out), "lora_experts=" + le], demo["home"])
        assert result.returncode == 0, result.stderr[-2000:]
        runs[le] = losses(out)
    assert runs["0"][0] == runs["2"][0]
    assert runs["0"][1:] != runs["2"][1:]


def test_a_rerun_with_only_memory_settings_changed_resumes_instead_of_refusing(demo, tmp_path):
    # What a user changes after a run stopped out of memory: where and in what pieces the same math
    # runs. The output dir is still this run's, so it resumes from its last checkpoint.
    base = ["model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA),
            "output_dir=" + str(tmp_path / "out"), "max_steps=2", "save_steps=1", "overwrite_output_dir=false"]
    first = run(["train", DEMO_PRESET, *base], demo["home"])
    assert first.returncode == 0, first.stderr[-2000:]
    result = run(["train", DEMO_PRESET, *base, "disable_gradient_checkpointing=false", "loss_chunk_tokens=64",
                  "expert_chunk_tokens=32", "device=cpu", "experts_mode=cpu"], demo["home"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from" in result.stdout and "checkpoint-1" in result.stdout, result.stdout[-2000:]


def snapshot(directory):
    """Every file under `directory` with its hash: to prove nothing was written."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(directory).rglob("*")) if p.is_file()}


BAD_CASES = [
    # (name, extra overrides or a config-text transformer, expected phrase in stderr)
    ("unknown key", ["learning_rat=1e-3"], "did you mean 'learning_rate'"),
    ("bad value", ["lora_rank=eight"], "lora_rank"),
    ("bad scheduler", ["lr_scheduler_type=wavy"], "cosine"),
    ("unknown dataset", ["dataset=nonexistent"], "nonexistent"),
    ("unknown template", ["template=qwen9"], "qwen9"),
    ("missing model", ["model_name_or_path=/nonexistent/model"], "/nonexistent/model"),
    ("full finetuning", ["finetuning_type=full"], "LoRA"),
    ("lora target not in model", ["lora_target=q_proj,qkv_proj"], "qkv_proj"),
    ("empty dataset", ["dataset=broken"], "no usable rows"),
    ("another config's output dir", ["learning_rate=0.5"], "different configuration"),
]


@pytest.mark.parametrize("name,overrides,phrase", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_configs_and_datasets_are_refused_and_nothing_is_written(demo, tmp_path, name, overrides, phrase):
    data = tmp_path / "data"
    shutil.copytree(DEMO_DATA, data)
    (data / "broken.json").write_text(json.dumps([{"instruction": "x"}, "not a row", {"output": "y"}]))
    info = json.loads((data / "dataset_info.json").read_text())
    info["broken"] = {"file_name": "broken.json"}
    (data / "dataset_info.json").write_text(json.dumps(info))
    output = tmp_path / "out"
    base = ["model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(data), "output_dir=" + str(output),
            "max_steps=2", "save_steps=1"]
    first = run(["train", DEMO_PRESET, *base], demo["home"])
    assert first.returncode == 0, first.stderr[-2000:]
    before = snapshot(output)
    result = run(["train", DEMO_PRESET, *base, *overrides], demo["home"])
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "error:" in result.stderr and phrase in result.stderr, result.stderr[-2000:]
    assert "internal error" not in result.stderr
    assert snapshot(output) == before


def test_overwrite_output_dir_clears_our_previous_run(demo, tmp_path):
    # Clearing goes through std::filesystem: a build that bound those calls to libtorch's own copy
    # crashed here, so this also guards the link order.
    base = ["model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA),
            "output_dir=" + str(tmp_path / "out"), "max_steps=3", "save_steps=1", "overwrite_output_dir=true"]
    for learning_rate in ("1e-3", "2e-3"):  # the second run has another config: it must clear, not resume
        result = run(["train", DEMO_PRESET, *base, "learning_rate=" + learning_rate], demo["home"])
        assert result.returncode == 0, result.stderr[-2000:]
        assert "resuming" not in result.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-1", "checkpoint-2"]


def test_val_size_holds_out_samples_and_evaluates_every_eval_steps(demo, tmp_path):
    output = tmp_path / "out"
    result = run(["train", DEMO_PRESET, "model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA),
                  "output_dir=" + str(output), "max_steps=12", "val_size=0.25", "eval_strategy=steps",
                  "eval_steps=4", "per_device_eval_batch_size=3"], demo["home"])
    assert result.returncode == 0, result.stderr[-2000:]
    evals = [line for line in log_lines(output) if "eval_loss" in line]
    assert [line["current_steps"] for line in evals] == [4, 8, 12]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    assert "on 8 samples" in result.stdout  # ceil(0.25 * 32) held out, as LLaMA-Factory


def test_overwrite_output_dir_never_clears_what_tandem_did_not_write(demo, tmp_path):
    base = ["model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA), "max_steps=2",
            "save_steps=1", "overwrite_output_dir=true"]
    # An empty marker is no credential: the dir, and every run saved under it, stays.
    forged = tmp_path / "forged"
    (forged / "earlier-run").mkdir(parents=True)
    (forged / "tandem_run.json").write_text("{}")
    (forged / "earlier-run" / "adapter_model.safetensors").write_bytes(b"precious")
    before = snapshot(forged)
    result = run(["train", DEMO_PRESET, *base, "output_dir=" + str(forged)], demo["home"])
    assert result.returncode == 1, result.stderr[-2000:]
    assert "not written by Tandem" in result.stderr, result.stderr[-2000:]
    assert snapshot(forged) == before
    # Tandem's own run with a user's file beside it: refused, naming the file, nothing removed.
    ours = tmp_path / "ours"
    assert run(["train", DEMO_PRESET, *base, "output_dir=" + str(ours)], demo["home"]).returncode == 0
    (ours / "notes.txt").write_text("mine")
    before = snapshot(ours)
    result = run(["train", DEMO_PRESET, *base, "output_dir=" + str(ours), "learning_rate=1e-3"], demo["home"])
    assert result.returncode == 1, result.stderr[-2000:]
    assert "notes.txt" in result.stderr and "did not write" in result.stderr, result.stderr[-2000:]
    assert snapshot(ours) == before


def test_demo_never_removes_a_model_dir_or_output_it_did_not_make(demo, tmp_path):
    work = tmp_path / "work"
    (work / "model").mkdir(parents=True)
    (work / "model" / "my_weights.bin").write_bytes(b"precious")
    result = run(["demo", "--workdir", work], tmp_path / "home")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "my_weights.bin" in result.stderr and "--workdir" in result.stderr, result.stderr[-2000:]
    assert (work / "model" / "my_weights.bin").read_bytes() == b"precious"
    # The demo's model in place, someone else's files in its output dir: refused, kept.
    other = tmp_path / "other"
    shutil.copytree(demo["model"], other / "model")
    (other / "output").mkdir()
    (other / "output" / "notes.txt").write_text("mine")
    result = run(["demo", "--workdir", other], tmp_path / "home")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "not written by Tandem" in result.stderr, result.stderr[-2000:]
    assert (other / "output" / "notes.txt").read_text() == "mine"


def test_a_second_run_into_a_busy_output_dir_is_refused_and_a_killed_runs_leftovers_go(demo, tmp_path):
    output = tmp_path / "out"
    args = ["train", DEMO_PRESET, "model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA),
            "output_dir=" + str(output), "max_steps=400", "save_steps=1000", "logging_steps=1",
            "num_train_epochs=1000", "overwrite_output_dir=false"]
    env = dict(os.environ, TANDEM_HOME=str(demo["home"]))
    first = subprocess.Popen([TANDEM, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.time() + 300
        while not (output / "trainer_log.jsonl").exists() and time.time() < deadline:
            time.sleep(0.02)
        second = run(args, demo["home"])
        assert first.poll() is None, "the first run ended before the second tried"
        assert second.returncode == 1, second.stderr[-2000:]
        assert f"in use by another Tandem run (pid {first.pid}" in second.stderr, second.stderr[-2000:]
        assert " kept, " not in second.stdout, "refused only after reading the data"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert not list(output.glob("checkpoint-*")), "killed before its first checkpoint"
    killed_log = log_lines(output)
    # A save the kill cut short (as a killed save leaves it): swept by the next run.
    (output / ".checkpoint-7.tmp-999999").mkdir()
    (output / ".checkpoint-7.tmp-999999" / "adapter_model.safetensors").write_bytes(b"half")
    # The lock died with the killed run; the rerun starts afresh with a log of its own.
    result = run(args, demo["home"])
    assert result.returncode == 0, result.stderr[-2000:]
    steps = [line["current_steps"] for line in log_lines(output) if "loss" in line]
    assert steps == list(range(1, 401)), steps[:20]
    assert log_lines(output.parent / "out") and not (output / ".checkpoint-7.tmp-999999").exists()
    assert [json.loads(line) for line in (output / "trainer_log.previous.jsonl").read_text().splitlines()] == killed_log


def test_a_changed_response_column_misses_the_tokenised_cache(demo, tmp_path):
    # The same files, another response column in dataset_info.json: the next run must tokenise
    # the new labels, not read the old ones back from the cache.
    data = tmp_path / "data"
    data.mkdir()
    rows = json.loads((DEMO_DATA / "identity.json").read_text())
    for row in rows:
        row["short"] = "I am a short answer."
    (data / "identity.json").write_text(json.dumps(rows))
    info = {"identity": {"file_name": "identity.json"}}
    (data / "dataset_info.json").write_text(json.dumps(info))

    def train(name):
        result = run(["train", DEMO_PRESET, "model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(data),
                      "output_dir=" + str(tmp_path / name), "max_steps=1", "logging_steps=1"], demo["home"])
        assert result.returncode == 0, result.stderr[-2000:]
        return "from the cache" in result.stdout, losses(tmp_path / name)[0]

    first_cached, first_loss = train("first")
    assert train("again")[0], "the same data and settings should be read from the cache"
    info["identity"]["columns"] = {"prompt": "instruction", "query": "input", "response": "short"}
    (data / "dataset_info.json").write_text(json.dumps(info))
    cached, loss = train("short")
    assert not cached, "a changed response column was read from the cache"
    assert loss != pytest.approx(first_loss, abs=1e-4), (loss, first_loss)


def test_a_diverging_run_stops_before_the_update_and_keeps_its_last_checkpoint(demo, tmp_path):
    output = tmp_path / "out"
    args = ["train", DEMO_PRESET, "model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA),
            "output_dir=" + str(output), "max_steps=6", "save_steps=2", "logging_steps=1",
            "overwrite_output_dir=false"]
    assert run(args, demo["home"]).returncode == 0
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    # An inf in the newest checkpoint's weights (what an overflow leaves): the resumed step 5 diverges.
    poisoned = output / "checkpoint-4" / "adapter_model.safetensors"
    tensors = load_file(str(poisoned))
    for t in tensors.values():
        t.view(-1)[0] = float("inf")
    save_file(tensors, str(poisoned), metadata={"format": "pt"})
    checkpoints = {d: snapshot(output / d) for d in ("checkpoint-2", "checkpoint-4")}
    result = run(args, demo["home"])
    assert result.returncode == 1, result.stderr[-2000:]
    assert "training diverged in step 5" in result.stderr and "no weight was updated" in result.stderr
    for advice in ("learning_rate", "bf16: false", "max_grad_norm", "checkpoint-4, is intact"):
        assert advice in result.stderr, (advice, result.stderr[-2000:])
    assert "internal error" not in result.stderr
    # Nothing was saved over the checkpoints, and the log says why the run ended.
    assert {d: snapshot(output / d) for d in checkpoints} == checkpoints
    assert not (output / "checkpoint-6").exists()
    assert "training diverged" in log_lines(output)[-1]["error"]
    # The good checkpoint before it still resumes and finishes.
    shutil.rmtree(output / "checkpoint-4")
    result = run(args, demo["home"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from" in result.stdout and "checkpoint-2" in result.stdout


def test_neat_packing_trains_like_the_unpacked_run(demo, tmp_path):
    # With every sample in one batch, a neat-packed run computes the unpacked run's math: each packed sample
    # attends only to itself from position 0, so the first loss (before any update) is the same number and the
    # two runs fall together. Plain packing lets the samples see each other: another first loss.
    common = ["model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA), "max_steps=12",
              "save_steps=100", "logging_steps=1", "per_device_train_batch_size=64", "warmup_ratio=0"]
    runs, outputs = {}, {}
    for name, extra in (("unpacked", []), ("neat", ["neat_packing=true"]), ("plain", ["packing=true"])):
        out = tmp_path / name
        result = run(["train", DEMO_PRESET, *common, "output_dir=" + str(out), *extra], demo["home"])
        assert result.returncode == 0, result.stderr[-2000:]
        runs[name], outputs[name] = losses(out), result.stdout
    assert "neat packing: packed 32 samples into" in outputs["neat"], outputs["neat"][-2000:]
    unpacked, neat, plain = runs["unpacked"], runs["neat"], runs["plain"]
    assert abs(neat[0] / unpacked[0] - 1) < 1e-5, (neat[0], unpacked[0])
    # The demo's random model leans little on context: plain packing moves the first loss by ~5e-4.
    assert abs(plain[0] / unpacked[0] - 1) > 1e-4, (plain[0], unpacked[0])
    assert neat[-1] < 0.85 * neat[0], neat  # 6.71 -> 5.01 in 12 full-batch steps
    assert abs(neat[-1] / unpacked[-1] - 1) < 2e-2, (neat, unpacked)
