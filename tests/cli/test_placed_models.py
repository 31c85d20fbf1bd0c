"""A model placed across two devices answers as it does on one: `tandem chat`, `serve` and `eval` place the model
through the memory planner as training does, and a placement file splitting the decoder layers over two devices is
planned and run as written. The two devices are cuda:0 and cuda:1 on a machine with two GPUs, cuda:0 and cpu with
one, and on the CPU-only build the host's two torch device objects, cpu and cpu:numa0 (node 0's own device, as the
parity tests split models): activations cross between layers, each layer's LoRA lives on its own device.

Training runs the same file: the placement it reports is the file's, and it trains."""

import json
import os
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TANDEM = os.environ["TANDEM_BIN"]
DEMO_DATA = REPO / "resources" / "demo"
QUESTION = "Who are you?"


def run(args, home, stdin="", timeout=600):
    env = dict(os.environ, TANDEM_HOME=str(home))
    return subprocess.run([TANDEM, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.fixture(scope="module")
def devices(demo):
    """The two devices this machine splits the demo model over."""
    info = run(["info", "--json"], demo["home"])
    assert info.returncode == 0, info.stderr
    gpus = len(json.loads(info.stdout).get("gpus", []))
    return {0: ("cpu", "cpu:numa0"), 1: ("cuda:0", "cpu")}.get(gpus, ("cuda:0", "cuda:1"))


@pytest.fixture(scope="module")
def split(demo, devices, tmp_path_factory):
    """A placement preset (as the studio's placement editor writes one): the demo's 4 layers 2 + 2 over the devices."""
    first, second = devices
    path = tmp_path_factory.mktemp("placement") / "split.yaml"
    path.write_text(f"name: two devices\nembed_tokens: {first}\nlm_head: {second}\n"
                    f"experts: {{device: cpu, backend: auto}}\n"
                    f"layers:\n  - {{layers: \"0-1\", device: \"{first}\"}}\n  - {{layers: \"2-\", device: \"{second}\"}}\n")
    return path


def placement_line(devices):
    first, second = devices
    return f"placement: layers {first}:0-1,{second}:2-3, lm_head on {second}"


def chat(demo, *extra):
    result = run(["chat", "--model", demo["model"], "--adapter", f"tuned={demo['adapter']}", "--template",
                  "qwen3_nothink", "--greedy", "--max-new-tokens", "32", "--dtype", "fp32", *extra], demo["home"],
                 stdin=f"{QUESTION}\n/base\n{QUESTION}\n")
    assert result.returncode == 0, result.stderr
    return result


def test_chat_on_two_devices_answers_as_on_one(demo, split, devices):
    one = chat(demo)
    two = chat(demo, "--placement", split)
    assert "placement: layers cpu:0-3" in one.stderr or "placement: layers cuda:0:0-3" in one.stderr, one.stderr
    assert placement_line(devices) in two.stderr, two.stderr
    assert two.stdout == one.stdout
    assert one.stdout.startswith(demo["tuned"] + "\n")  # the adapter's answer, then the base's


def serve_answers(demo, home, *extra):
    proc = subprocess.Popen([TANDEM, "serve", "--model", str(demo["model"]), "--adapter", f"tuned={demo['adapter']}",
                             "--template", "qwen3_nothink", "--dtype", "fp32", "--port", "0", *map(str, extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, TANDEM_HOME=str(home)))
    try:
        printed, port = [], None
        deadline = time.time() + 300
        while time.time() < deadline and port is None:
            line = proc.stdout.readline()
            if not line:
                break
            printed.append(line)
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
            port = int(match.group(1)) if match else None
        assert port, "".join(printed)
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        answers = []
        for model in ("tuned", "base"):
            body = json.dumps({"model": model, "messages": [{"role": "user", "content": QUESTION}],
                               "max_tokens": 32, "temperature": 0}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=300) as response:
                answers.append(json.loads(response.read())["choices"][0]["message"]["content"])
        return answers, "".join(printed)
    finally:
        proc.kill()
        proc.wait()


def test_serve_on_two_devices_answers_as_on_one(demo, split, devices, tmp_path):
    one, _ = serve_answers(demo, tmp_path / "one")
    two, printed = serve_answers(demo, tmp_path / "two", "--placement", split)
    assert placement_line(devices) in printed, printed
    assert two == one
    assert one[0] == demo["tuned"]  # the adapter's answer; one[1] is the base model's


def evaluate(demo, out, *extra):
    result = run(["eval", "--model", demo["model"], "--adapter", demo["adapter"], "--dataset", "identity",
                  "--dataset-dir", DEMO_DATA, "--max-samples", 4, "--max-new-tokens", 24, "--dtype", "fp32",
                  "--template", "qwen3_nothink", "--output-dir", out, "--no-store", *extra], demo["home"])
    assert result.returncode == 0, result.stderr[-3000:]
    return (out / "generated_predictions.jsonl").read_text(encoding="utf-8"), result.stderr


def test_eval_on_two_devices_predicts_as_on_one(demo, split, devices, tmp_path):
    one, _ = evaluate(demo, tmp_path / "one")
    two, stderr = evaluate(demo, tmp_path / "two", "--placement", split)
    assert placement_line(devices) in stderr, stderr
    assert two == one
    assert len(one.splitlines()) == 4


def test_training_runs_the_placement_file_as_written(demo, split, devices, tmp_path):
    result = run(["train", REPO / "presets" / "training" / "demo_lora_sft.yaml", f"model_name_or_path={demo['model']}",
                  f"dataset_dir={DEMO_DATA}", f"output_dir={tmp_path / 'out'}", f"placement_rule={split}",
                  "max_steps=3", "logging_steps=1", "--db", tmp_path / "runs.db"], demo["home"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert placement_line(devices) in result.stdout + result.stderr, result.stdout + result.stderr
    assert (tmp_path / "out" / "adapter_model.safetensors").exists()


# The studio's placement board fixes each MoE layer's resident experts in the rule file it writes
# (tandem_gpu_experts): 4, 0, 8 and all 16 of the demo's layers, where auto would fill every layer
# alike. The planner keeps them (everywhere: planned for the H200 preset), and a run on a GPU
# keeps them on the GPU layer by layer.
BOARD_COUNTS = (4, 0, 8, 16)


def board_rules(path, device):
    rules = [f'- match: {{name: "^model\\\\.embed_tokens$"}}\n'
             f'  replace: {{class: default, kwargs: {{generate_device: "{device}", prefill_device: "{device}"}}}}\n']
    for layer, count in enumerate(BOARD_COUNTS):
        rules.append(f'- match: {{name: "^model\\\\.layers\\\\.{layer}\\\\.mlp\\\\.experts$"}}\n'
                     f'  replace:\n    class: ktransformers.operators.experts.KTransformersExperts\n'
                     f'    kwargs: {{prefill_device: "{device}", generate_device: cpu, out_device: "{device}", '
                     f'tandem_gpu_experts: {count}}}\n  recursive: False\n')
    for name in ("^model\\\\.layers\\\\.", "^model\\\\.norm$", "^lm_head$"):
        rules.append(f'- match: {{name: "{name}"}}\n  replace: {{class: default, kwargs: '
                     f'{{generate_device: "{device}", prefill_device: "{device}"}}}}\n')
    path.write_text("".join(rules))
    return path


def test_the_planner_keeps_a_rule_files_per_layer_resident_experts(demo, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text((REPO / "presets" / "training" / "demo_lora_sft.yaml").read_text()
                      .replace("model_name_or_path: demo-model", f"model_name_or_path: {demo['model']}")
                      .replace("dataset_dir: resources/demo", f"dataset_dir: {DEMO_DATA}")
                      .replace("output_dir: demo-output", f"output_dir: {tmp_path / 'out'}"))
    rules = board_rules(tmp_path / "board.yaml", "cuda:0")
    result = run(["plan", config, "--hardware", "1xh200_xeon-16c_128g", "--placement", rules, "--json"],
                 demo["home"])
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    resident = [m["gpu_experts"] for m in plan["placement"] if m["kind"] == "routed_experts"]
    assert resident == list(BOARD_COUNTS)


def test_training_keeps_a_rule_files_per_layer_resident_experts(demo, devices, tmp_path):
    if not devices[0].startswith("cuda"):
        pytest.skip("resident experts live on a GPU layer; this machine has none")
    rules = board_rules(tmp_path / "board.yaml", "cuda:0")
    result = run(["train", REPO / "presets" / "training" / "demo_lora_sft.yaml", f"model_name_or_path={demo['model']}",
                  f"dataset_dir={DEMO_DATA}", f"output_dir={tmp_path / 'out'}", f"placement_rule={rules}",
                  "max_steps=2", "logging_steps=1", "--db", tmp_path / "runs.db"], demo["home"])
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr
    assert ("placement: layers cuda:0:0-3, lm_head on cuda:0, 28 routed experts resident over 3 layers"
            in printed), printed
