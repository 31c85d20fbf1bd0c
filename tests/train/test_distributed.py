"""Data-parallel `tandem train` over c10d (Gloo over loopback, CPU): ranks started by `tandem launch` or
with torchrun's variables by hand, compared against one process with the whole global batch; a dead or
stalled rank stops the job within ddp_timeout, naming the rank, and a rerun resumes."""

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
TANDEM = os.environ["TANDEM_BIN"]
DEMO_PRESET = REPO / "presets" / "training" / "demo_lora_sft.yaml"
DEMO_DATA = REPO / "resources" / "demo"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings(demo, output_dir, batch, **extra):
    # fp32 (the demo's dtype), no dropout: the masks are drawn per rank, so only dropout-free runs
    # can match a one-process run bit for bit.
    values = {"model_name_or_path": demo["model"], "dataset_dir": DEMO_DATA, "output_dir": output_dir,
              "per_device_train_batch_size": batch, "max_steps": 6, "save_steps": 3, "logging_steps": 1,
              "num_train_epochs": 100, "lora_dropout": 0, "plot_loss": "false", "overwrite_output_dir": "false",
              "ddp_timeout": 60}
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]


def env_for(demo, **extra):
    return dict(os.environ, TANDEM_HOME=str(demo["home"]), **{k: str(v) for k, v in extra.items()})


def train(demo, args, timeout=300, **env):
    return subprocess.run([TANDEM, "train", DEMO_PRESET, *args], capture_output=True, text=True, timeout=timeout,
                          env=env_for(demo, **env))


def launch(demo, args, nproc=2, timeout=300):
    cmd = [TANDEM, "launch", "--nproc-per-node", str(nproc), "--master", f"127.0.0.1:{free_port()}", "--",
           "train", DEMO_PRESET, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env_for(demo))


def start_rank(demo, args, rank, world, port, log):
    env = env_for(demo, RANK=rank, WORLD_SIZE=world, LOCAL_RANK=rank, LOCAL_WORLD_SIZE=world,
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    return subprocess.Popen([TANDEM, "train", DEMO_PRESET, *args], stdout=log, stderr=subprocess.STDOUT, env=env)


def log_lines(output_dir):
    return [json.loads(line) for line in (Path(output_dir) / "trainer_log.jsonl").read_text().splitlines()]


def losses(output_dir):
    return [line["loss"] for line in log_lines(output_dir) if "loss" in line]


def assert_same_adapter(a_dir, b_dir, rel=1e-5):
    a, b = load_file(str(Path(a_dir) / "adapter_model.safetensors")), load_file(str(Path(b_dir) / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    assert any("experts" in k for k in a), "the demo model trains expert LoRA (host buffers) too"
    for k in a:
        diff = (a[k] - b[k]).norm().item()
        assert diff <= rel * a[k].norm().item() + 1e-12, (k, diff, a[k].norm().item())


@pytest.fixture(scope="module")
def runs(demo, tmp_path_factory):
    """One process with batch 4, and the same steps as 2 ranks x batch 2 started by `tandem launch`."""
    root = tmp_path_factory.mktemp("ddp")
    one, two = root / "one", root / "two"
    result = train(demo, settings(demo, one, 4))
    assert result.returncode == 0, result.stderr[-2000:]
    # plot_loss on: rank 0 alone plots (two ranks writing the same png raced before).
    launched = launch(demo, settings(demo, two, 2, plot_loss="true"))
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    return {"one": one, "two": two, "launch_output": launched.stdout + launched.stderr}


def test_two_ranks_of_batch_b_train_like_one_rank_of_batch_2b(runs):
    assert "rank 1 of 2" in runs["launch_output"] and "process group: rank 0 of 2" in runs["launch_output"]
    assert_same_adapter(runs["one"], runs["two"])
    assert losses(runs["two"]) == pytest.approx(losses(runs["one"]), rel=1e-5)
    # Rank 0 alone writes: one log line per step, one checkpoint, one run in the store.
    assert len(losses(runs["two"])) == 6
    assert sorted(p.name for p in runs["two"].glob("checkpoint-*")) == ["checkpoint-3"]
    state = json.loads((runs["two"] / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["train_batch_size"] == 2


def test_a_two_rank_checkpoint_resumes_on_one_rank_on_the_same_curve(demo, runs, tmp_path):
    # The finished 2-rank run's last checkpoint is step 3: a rerun on one rank redoes 4..6 from it,
    # with gradient accumulation 2 keeping the global batch of 4.
    resumed = tmp_path / "resumed"
    subprocess.run(["cp", "-r", str(runs["two"]), str(resumed)], check=True)
    (resumed / "adapter_model.safetensors").unlink()
    result = train(demo, settings(demo, resumed, 2))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from" in result.stdout and "checkpoint-3" in result.stdout
    assert "gradient_accumulation_steps is 2 (was 1), keeping the global batch of 4" in result.stdout
    assert losses(resumed) == pytest.approx(losses(runs["one"]), rel=1e-5)
    assert_same_adapter(runs["one"], resumed)


def test_a_killed_rank_stops_the_other_naming_it_and_a_rerun_resumes(demo, tmp_path):
    out = tmp_path / "out"
    args = settings(demo, out, 2, max_steps=24, save_steps=4, ddp_timeout=30)
    port = free_port()
    logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(2)]
    ranks = [start_rank(demo, args, r, 2, port, logs[r]) for r in range(2)]
    deadline = time.time() + 240
    while not (out / "checkpoint-4" / "trainer_state.json").exists() and time.time() < deadline:
        time.sleep(0.02)
    ranks[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    code = ranks[0].wait(timeout=120)
    elapsed = time.time() - killed_at
    ranks[1].wait()
    for f in logs:
        f.close()
    rank0 = (tmp_path / "rank0.log").read_text()
    assert not (out / "adapter_model.safetensors").exists(), "the run finished before the kill"
    assert code != 0 and elapsed < 30, (code, elapsed, rank0[-2000:])
    assert "rank 1 (pid" in rank0 and "left the job" in rank0, rank0[-2000:]
    assert "the last checkpoint in output_dir is intact" in rank0
    assert (out / "checkpoint-4" / "trainer_state.json").exists()

    rerun = launch(demo, args)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "resuming from" in rerun.stdout
    # The rerun continues the same curve as one process with the whole batch.
    reference = tmp_path / "reference"
    straight = train(demo, settings(demo, reference, 4, max_steps=24, save_steps=4))
    assert straight.returncode == 0, straight.stderr[-2000:]
    assert losses(out) == pytest.approx(losses(reference), rel=1e-5)


def test_a_stalled_rank_stops_the_other_within_ddp_timeout(demo, tmp_path):
    out = tmp_path / "out"
    args = settings(demo, out, 2, max_steps=200, save_steps=4, ddp_timeout=15)
    port = free_port()
    logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(2)]
    ranks = [start_rank(demo, args, r, 2, port, logs[r]) for r in range(2)]
    try:
        deadline = time.time() + 240
        while not (out / "checkpoint-4" / "trainer_state.json").exists() and time.time() < deadline:
            time.sleep(0.02)
        ranks[1].send_signal(signal.SIGSTOP)  # alive, connected, silent: a stalled network looks so
        stopped_at = time.time()
        code = ranks[0].wait(timeout=120)
        elapsed = time.time() - stopped_at
    finally:
        ranks[1].send_signal(signal.SIGKILL)
        ranks[1].wait()
        for f in logs:
            f.close()
    rank0 = (tmp_path / "rank0.log").read_text()
    assert code != 0 and 10 < elapsed < 45, (code, elapsed, rank0[-2000:])
    assert "did not answer within ddp_timeout (15 s)" in rank0, rank0[-2000:]
    assert "rank 1" in rank0


def test_the_rendezvous_listens_on_master_addr_only_and_a_missing_rank_times_out(demo, tmp_path):
    port = free_port()
    with open(tmp_path / "rank0.log", "w") as log:
        rank0 = start_rank(demo, settings(demo, tmp_path / "out", 2, ddp_timeout=8), 0, 2, port, log)
        listening = []
        deadline = time.time() + 60
        while not listening and time.time() < deadline and rank0.poll() is None:
            # /proc/net/tcp: local address as hex IP:port, state 0A = LISTEN.
            rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
            rows += [line.split() for line in Path("/proc/net/tcp6").read_text().splitlines()[1:]]
            listening = [r[1] for r in rows if r[3] == "0A" and r[1].endswith(f":{port:04X}")]
            time.sleep(0.05)
        code = rank0.wait(timeout=120)
    assert listening == [f"0100007F:{port:04X}"], listening  # 127.0.0.1, not 0.0.0.0 or ::
    text = (tmp_path / "rank0.log").read_text()
    assert code != 0
    assert "could not join the job" in text and "within ddp_timeout (8 s)" in text, text[-2000:]


def test_ranks_with_different_data_are_refused(demo, tmp_path):
    port = free_port()
    base = settings(demo, tmp_path / "out", 2)
    logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(2)]
    ranks = [start_rank(demo, base + (["max_samples=16"] if r else []), r, 2, port, logs[r]) for r in range(2)]
    codes = [p.wait(timeout=240) for p in ranks]
    for f in logs:
        f.close()
    text = (tmp_path / "rank0.log").read_text()
    assert codes[0] != 0 and codes[1] != 0
    assert "do not have the same number of training samples" in text, text[-2000:]


def test_plan_knows_the_world_size(demo, runs, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(f"model_name_or_path: {demo['model']}\nstage: sft\nfinetuning_type: lora\nlora_target: all\n"
                      f"lora_rank: 8\ndataset: identity\ndataset_dir: {DEMO_DATA}\ntemplate: qwen3_nothink\n"
                      f"output_dir: {tmp_path / 'out'}\nper_device_train_batch_size: 2\n"
                      "gradient_accumulation_steps: 4\n")
    result = subprocess.run([TANDEM, "plan", config, "--nnodes", "2", "--nproc-per-node", "2", "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)["job"]
    assert job["world_size"] == 4 and job["global_batch"] == 2 * 4 * 4
    # The gradients all-reduced per step, fp32: the attention LoRA of the adapter the runs trained, and
    # the experts' r x (in + out) per projection (the file holds those in PEFT's fused form).
    adapter = load_file(str(runs["two"] / "adapter_model.safetensors"))
    attention = sum(t.numel() for k, t in adapter.items() if "self_attn" in k)
    cfg = json.loads((Path(demo["model"]) / "config.json").read_text())
    experts = cfg["num_hidden_layers"] * cfg["num_experts"] * 3 * 8 * (cfg["hidden_size"] + cfg["moe_intermediate_size"])
    assert job["lora_gradient_bytes"] == 4 * (attention + experts)
    assert job["allreduce_bytes_per_rank"] == 2 * 3 * job["lora_gradient_bytes"] // 4
    text = subprocess.run([TANDEM, "plan", config, "--nnodes", "2"], capture_output=True, text=True, timeout=120)
    assert "global batch 2 x 4 x 2 = 16 sequences per optimizer step" in text.stdout, text.stdout[-2000:]
