"""`tandem eval` as a user runs it on the built-in demo (its random Qwen3-MoE and the identity LoRA
it trains): LLaMA-Factory's output files, scores that python's reference packages reproduce from the
written predictions, the adapter scoring above the base, the run store, and Ctrl-C."""
import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path


from llamafactory_reference import dataset_results

REPO = Path(__file__).resolve().parents[2]
TANDEM = os.environ["TANDEM_BIN"]
DEMO_DATA = REPO / "resources" / "demo"
SAMPLES = 6


def run(args, home, timeout=600):
    env = dict(os.environ, TANDEM_HOME=str(home))
    return subprocess.run([TANDEM, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def evaluate(demo, out, *extra):
    args = ["eval", "--model", demo["model"], "--dataset", "identity", "--dataset-dir", DEMO_DATA,
            "--max-samples", SAMPLES, "--max-new-tokens", 32, "--dtype", "fp32", "--template", "qwen3_nothink",
            "--output-dir", out, *extra]
    result = run(args, demo["home"])
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (out / "generated_predictions.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines], json.loads((out / "predict_results.json").read_text()), result


def test_eval_writes_llamafactory_files_that_the_references_rescore(demo, tmp_path):
    rows, results, result = evaluate(demo, tmp_path / "tuned", "--adapter", demo["adapter"])
    dataset = json.loads((DEMO_DATA / "identity.json").read_text())[:SAMPLES]
    assert len(rows) == SAMPLES
    for row, sample in zip(rows, dataset):
        assert list(row) == ["prompt", "predict", "label"]
        assert row["label"] == sample["output"]
        assert sample["instruction"] in row["prompt"] and "<|im_start|>assistant" in row["prompt"]
    assert "[eval] 6/6 samples" in result.stderr
    # The reference packages, run on the predictions we wrote, give the same floats.
    _, reference = dataset_results(rows)
    for key, value in reference.items():
        assert results[key] == value, key
    assert results["predict_samples"] == results["predict_samples_requested"] == SAMPLES
    assert results["predict_bad_rows"] == 0 and results["predict_runtime"] > 0
    # The identity adapter was trained on these answers: it must score far above the random base.
    _, base, _ = evaluate(demo, tmp_path / "base")
    assert results["predict_bleu-4"] > 50 > base["predict_bleu-4"]
    assert results["predict_rouge-l"] > base["predict_rouge-l"] + 20
    # --predictions re-scores the file to the same numbers.
    rescored = run(["eval", "--predictions", tmp_path / "tuned" / "generated_predictions.jsonl",
                    "--output-dir", tmp_path / "rescored", "--no-store"], demo["home"])
    assert rescored.returncode == 0, rescored.stderr
    again = json.loads((tmp_path / "rescored" / "predict_results.json").read_text())
    for key in reference:
        assert again[key] == results[key], key
    # Both generating runs are in the run store as completed eval runs.
    db = sqlite3.connect(demo["home"] / "runs.db")
    evals = db.execute("SELECT status, last_step, output_dir FROM runs WHERE kind = 'eval' ORDER BY id").fetchall()
    assert [(s, n) for s, n, _ in evals[-2:]] == [("completed", SAMPLES), ("completed", SAMPLES)]
    extra = db.execute("SELECT extra_json FROM metrics m JOIN runs r ON r.id = m.run_id "
                       "WHERE r.output_dir = ?", (str((tmp_path / "tuned").resolve()),)).fetchone()[0]
    assert json.loads(extra)["predict_bleu-4"] == results["predict_bleu-4"]
    listed = json.loads(run(["runs", "--json"], demo["home"]).stdout)
    assert sum(r["kind"] == "eval" for r in listed) == 2 and any(r["kind"] == "train" for r in listed)


def test_ctrl_c_writes_the_samples_done_so_far(demo, tmp_path):
    out = tmp_path / "stopped"
    env = dict(os.environ, TANDEM_HOME=str(demo["home"]))
    proc = subprocess.Popen([TANDEM, "eval", "--model", str(demo["model"]), "--dataset", "identity",
                             "--dataset-dir", str(DEMO_DATA), "--max-new-tokens", "200", "--dtype", "fp32", "--template", "qwen3_nothink",
                             "--output-dir", str(out)], stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    seen = b""
    while b"[eval] 2/" not in seen:
        chunk = proc.stderr.read1(4096)
        assert chunk, seen.decode(errors="replace")
        seen += chunk
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr.decode(errors="replace")
    results = json.loads((out / "predict_results.json").read_text())
    total = len(json.loads((DEMO_DATA / "identity.json").read_text()))
    assert 2 <= results["predict_samples"] < results["predict_samples_requested"] == total
    rows = (out / "generated_predictions.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(rows) == results["predict_samples"]
    assert b"stopped after" in stdout
    db = sqlite3.connect(demo["home"] / "runs.db")
    status = db.execute("SELECT status FROM runs WHERE output_dir = ?", (str(out.resolve()),)).fetchone()[0]
    assert status == "stopped"


def test_bad_inputs_are_clear_errors(demo, tmp_path):
    result = run(["eval", "--model", tmp_path / "missing", "--dataset", "identity", "--dataset-dir", DEMO_DATA,
                  "--output-dir", tmp_path / "o"], demo["home"])
    assert result.returncode == 1 and "error:" in result.stderr
    result = run(["eval", "--model", demo["model"], "--dataset", "nope", "--dataset-dir", DEMO_DATA,
                  "--output-dir", tmp_path / "o"], demo["home"])
    assert result.returncode == 1 and "nope" in result.stderr
    result = run(["eval", "--predictions", tmp_path / "x.jsonl", "--choices", "abc"], demo["home"])
    assert result.returncode == 1 and "--choices" in result.stderr
    assert not (tmp_path / "o").exists()
