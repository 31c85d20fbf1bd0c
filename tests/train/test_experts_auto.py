"""`experts_mode: auto` trains the adapter `experts_mode: cpu` trains (issue 28): on this CPU-only
machine auto is cpu mode (bit for bit), and with `expert_split: cycle` the split itself runs here,
every routed expert resident, streamed or on the CPU engine in turn, the resident cache re-placed every
step, torch computing the "device" experts on the CPU device: the same adapter within fp32 rounding."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
TANDEM = os.environ["TANDEM_BIN"]
DEMO_PRESET = REPO / "presets" / "training" / "demo_lora_sft.yaml"
DEMO_DATA = REPO / "resources" / "demo"


def train(demo, output, *overrides):
    common = ["model_name_or_path=" + str(demo["model"]), "dataset_dir=" + str(DEMO_DATA), "max_steps=4",
              "save_steps=100", "logging_steps=1", "device=cpu", "output_dir=" + str(output)]
    env = dict(os.environ, TANDEM_HOME=str(demo["home"]))
    result = subprocess.run([TANDEM, "train", str(DEMO_PRESET), *common, *overrides], capture_output=True,
                            text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    losses = [line["loss"] for line in map(json.loads, (output / "trainer_log.jsonl").read_text().splitlines())
              if "loss" in line]
    return load_file(str(output / "adapter_model.safetensors")), losses


def test_auto_trains_the_adapter_cpu_mode_trains(demo, tmp_path):
    cpu, cpu_losses = train(demo, tmp_path / "cpu", "experts_mode=cpu")
    assert any(".experts." in k for k in cpu), "the demo's adapter has no expert LoRA to compare"

    # Without a GPU, auto is cpu mode: the same adapter bit for bit.
    auto, auto_losses = train(demo, tmp_path / "auto", "experts_mode=auto")
    assert auto.keys() == cpu.keys()
    assert all((auto[k] == cpu[k]).all() for k in cpu)
    assert auto_losses == cpu_losses

    # The split forced through every path, changing every call, the cache re-placed every step.
    split, split_losses = train(demo, tmp_path / "split", "experts_mode=auto", "expert_split=cycle",
                                "gpu_experts=2", "resident_refresh_steps=1")
    assert split.keys() == cpu.keys()
    assert split_losses == pytest.approx(cpu_losses, rel=1e-4)
    for k in cpu:
        scale = cpu[k].abs().max().item()
        worst = (split[k] - cpu[k]).abs().max().item()
        assert worst <= 1e-3 * scale + 1e-7, (k, worst, scale)
    # and it is not the base adapter: training moved the expert LoRA
    moved = [k for k in cpu if ".experts." in k and k.endswith("lora_B.weight")]
    assert moved and all(split[k].abs().max().item() > 0 for k in moved)
