"""The Tandem side of the end-to-end benchmark (bench/e2e_train_bench.cpp), run on the CPU device.

The GPU numbers in docs/benchmarks.md come from this program on the H200 machine; here every set-up it
measures runs on a tiny random Qwen3-MoE so that a change which breaks one fails CI rather than the next
device session. The set-ups compute the same model from the same seed, so their losses must agree: the
CPU expert engine, resident experts beside it, offload mode (also with a resident cache), experts_mode auto's
split, each with bf16, int8 and int4 experts (int8, int4: the same quantised weights everywhere)."""
import json
import math
import os
import subprocess
import sys

import pytest

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 256, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def bench(config_dir, *args):
    cmd = [os.environ["TANDEM_E2E_BENCH"], "--config", str(config_dir), "--device", "cpu", "--tokens", "64",
           "--steps", "2", "--lora-rank", "8", "--lora-alpha", "16", "--lora-target", "q_proj,v_proj",
           "--gradient-checkpointing", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(result.stdout[result.stdout.index("{"):])


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3_tiny")
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_every_setup_trains_the_same_model(config_dir, fmt):
    runs = {
        "co": bench(config_dir, "--experts", "cpu", "--keep-expert-forward", "--experts-format", fmt),
        "resident": bench(config_dir, "--experts", "cpu", "--gpu-experts", "3", "--experts-format", fmt),
        "offload": bench(config_dir, "--experts", "gpu-offload", "--experts-format", fmt),
        "offload-resident": bench(config_dir, "--experts", "gpu-offload", "--gpu-experts", "3", "--experts-format", fmt),
        "offload-serial": bench(config_dir, "--experts", "gpu-offload", "--stream-ahead", "false", "--experts-format", fmt),
        # experts_mode auto, its split forced through every path (resident, streamed, CPU) in turn
        "auto": bench(config_dir, "--experts", "auto", "--expert-split", "cycle", "--gpu-experts", "3",
                      "--keep-expert-forward", "--experts-format", fmt),
    }
    for name, r in runs.items():
        assert r["experts_format"] == fmt, name
        assert len(r["steps"]) == 2, name
        assert r["tokens_per_s"] > 0, name
    assert runs["resident"]["gpu_experts"] == [3, 3]
    assert runs["offload-resident"]["gpu_experts"] == [3, 3]
    assert runs["offload"]["gpu_experts"] == []
    assert runs["co"]["gpu_experts"] == []
    split = runs["auto"]["split"]
    assert min(split["resident_pairs"], split["streamed_pairs"], split["cpu_pairs"]) > 0, split
    losses = {name: [s["loss"] for s in r["steps"]] for name, r in runs.items()}
    for name, loss in losses.items():
        # bf16 activations and two different summation orders: agree to bf16's precision.
        assert loss == pytest.approx(losses["co"], rel=2e-3), (name, losses)
    # The optimizer stepped: the second step's loss moved.
    assert losses["co"][1] != losses["co"][0]
    # The streamer's look-ahead moves copies earlier, never numbers; it copied layer 1 while layer 0 ran.
    assert losses["offload-serial"] == losses["offload"]
    assert runs["offload"]["streamer"]["look_ahead"] and runs["offload"]["streamer"]["copied_ahead"] > 0
    assert not runs["offload-serial"]["streamer"]["look_ahead"]
    assert runs["offload-serial"]["streamer"]["copied_ahead"] == 0
    assert runs["offload"]["streamer"]["taken"] == runs["offload-serial"]["streamer"]["taken"] > 0


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantised_experts_are_not_the_bf16_ones(config_dir, fmt):
    """--experts-format int8 / int4 reaches every set-up: its loss differs from bf16's by the quantisation."""
    for args in (["--experts", "cpu", "--gpu-experts", "8"], ["--experts", "gpu-offload"]):
        bf16 = bench(config_dir, *args, "--experts-format", "bf16")["steps"][0]["loss"]
        quantised = bench(config_dir, *args, "--experts-format", fmt)["steps"][0]["loss"]
        assert quantised != bf16, args
        assert quantised == pytest.approx(bf16, rel=2e-2 if fmt == "int8" else 5e-2), args


def test_busy_time_trace_and_cost_model_are_reported(config_dir, tmp_path):
    """Issue 28's trace: per step the CPU expert engine's busy time (never more than the step), one
    more step under the profiler (--busy-trace), and the cost model's prediction beside the measured
    step. On this machine there is no GPU: the trace has no GPU or copy figures and the model predicts
    only the all-CPU modes; the calibration is cached (a second run reads it)."""
    env = {**os.environ, "TANDEM_HOME": str(tmp_path)}
    cmd = [os.environ["TANDEM_E2E_BENCH"], "--config", str(config_dir), "--device", "cpu", "--tokens", "64",
           "--steps", "2", "--lora-rank", "8", "--lora-target", "q_proj,v_proj", "--experts", "cpu",
           "--busy-trace"]
    runs = []
    for _ in range(2):
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        runs.append(json.loads(result.stdout[result.stdout.index("{"):]))
    r = runs[0]
    for step in r["steps"]:
        busy = step["busy_ms"]["cpu_expert_engine"]
        assert 0 < busy <= 1e3 * step["step_s"], step
        assert 0 < step["busy_ms"]["cpu_expert_engine_forward"] < busy, step
    trace = r["busy_trace"]
    assert 0 < trace["busy_ms"]["cpu_expert_engine"] <= 1e3 * trace["step_s"]
    assert "gpu_compute" not in trace["busy_ms"]  # no GPU here
    cost = r["cost_model"]
    assert cost["rates_source"] == "calibrated"
    assert runs[1]["cost_model"]["rates_source"] == "cache"
    assert runs[1]["cost_model"]["calibration_s"] == 0
    assert set(cost["modes"]) == {"co", "split"}
    assert cost["modes"]["split"]["step_ms"] == pytest.approx(cost["modes"]["co"]["step_ms"])
    assert cost["lower_bound_ms"] > 0
    assert cost["measured_step_ms"] > 0 and cost["measured_cpu_expert_engine_ms"] > 0
    assert cost["step_over_lower_bound"] == pytest.approx(cost["measured_step_ms"] / cost["lower_bound_ms"])
    assert cost["modes"]["co"]["cpu_experts_ms"] > 0
    # What the prediction was made from is recorded: --predict-from recomputes it (no model built).
    assert cost["record"]["request"]["tokens"] == 64 and cost["record"]["rates"]["cpu"]
    recorded = tmp_path / "recorded.json"
    recorded.write_text(json.dumps({"tiny": {"tandem_co": r}}))
    again = subprocess.run([os.environ["TANDEM_E2E_BENCH"], "--predict-from", str(recorded)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.startswith(f"tiny tandem_co: predicted {cost['modes']['co']['tokens_per_s']:.0f} tokens/s (co)"), \
        again.stdout
    bad = subprocess.run([os.environ["TANDEM_E2E_BENCH"], "--predict-from", str(tmp_path / "none.json")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "cannot read" in bad.stderr


def test_offloaded_checkpoints_report_the_planners_peak_beside_the_run(config_dir):
    """Issue 29: the bench records, per length, tokens/s and the planner's prediction for the same
    settings (in-process); offloading checkpoints adds the layer inputs to the predicted host bytes.
    On the CPU device there is no caching allocator peak to set beside it (that is the H200 run's)."""
    plain = bench(config_dir, "--experts", "cpu")
    offloaded = bench(config_dir, "--experts", "cpu", "--offload-checkpoints", "--moe-token-chunk", "32")
    for r in (plain, offloaded):
        seq = r["sequence"]
        assert seq["tokens"] == 64
        assert seq["tokens_per_s"] == r["tokens_per_s"] > 0
        assert "peak_allocated_bytes" not in seq  # the layers run on the CPU device
    assert offloaded["sequence"]["offload_checkpoints"] and offloaded["sequence"]["moe_token_chunk"] == 32
    assert offloaded["gradient_checkpointing"]
    # The same model and tokens: offloading is planned, and moves no number.
    assert [s["loss"] for s in offloaded["steps"]] == [s["loss"] for s in plain["steps"]]


FAKE_BENCH = r'''#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
tokens = int(args[args.index("--tokens") + 1])
offload = "--offload-checkpoints" in args
print(json.dumps({"tokens_per_s": 1e6 / tokens, "steps": [{"loss": 5.0}],
                  "gpu_memory": {"cuda:0": {"peak_allocated_bytes": 1000 * tokens, "peak_reserved_bytes": 1100 * tokens}},
                  "sequence": {"tokens": tokens, "tokens_per_s": 1e6 / tokens, "offload_checkpoints": offload,
                               "peak_allocated_bytes": 1000 * tokens, "peak_reserved_bytes": 1100 * tokens,
                               "predicted_gpu_peak_bytes": 1050 * tokens + (1 << 30),
                               "predicted_over_allocated": 1.05, "predicted_over_reserved": 1050 / 1100}}))
'''


def test_a_token_list_runs_each_length_in_its_own_process(tmp_path):
    """--tokens 2048,16384,65536: every length of every mode is one bench process, and the JSON keeps
    each length's tokens/s, allocator peak and planner prediction under "sequence"."""
    fake = tmp_path / "fake_bench"
    fake.write_text(FAKE_BENCH)
    fake.chmod(0o755)
    driver = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "e2e_train_bench.py")
    out = tmp_path / "result.json"
    result = subprocess.run(
        [sys.executable, driver, "--bench", str(fake), "--models", "qwen3-30b-a3b", "--tokens", "65536,2048,16384",
         "--modes", "co,offload", "--offload-checkpoints", "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    r = json.loads(out.read_text())["qwen3-30b-a3b"]
    assert list(r["sequence"]) == ["2048", "16384", "65536"]  # shortest first
    for tokens in (2048, 16384, 65536):
        for mode in ("tandem_co", "tandem_offload"):
            seq = r["sequence"][str(tokens)][mode]
            assert seq["tokens"] == tokens and seq["offload_checkpoints"]
            assert seq["tokens_per_s"] == pytest.approx(1e6 / tokens)
            assert seq["peak_reserved_bytes"] == 1100 * tokens
            assert seq["predicted_over_reserved"] == pytest.approx(1050 / 1100)
            assert r["by_tokens"][str(tokens)][mode]["command"].count("--tokens " + str(tokens)) == 1


def test_more_lengths_run_on_the_same_model(config_dir):
    """--more-tokens: after --tokens, longer sequences on the model already built (a 48-layer model
    takes minutes to build on the H200), each with its own steps, tokens/s and planner figures; the
    same length asked twice trains on from where the first left off, so its loss moves."""
    r = bench(config_dir, "--experts", "cpu", "--offload-checkpoints", "--more-tokens", "128,64")
    first, second = r["more_tokens"]
    assert (first["tokens"], second["tokens"]) == (128, 64)
    for more in (first, second):
        assert "error" not in more
        assert more["tokens_per_s"] > 0 and more["sequence"]["tokens"] == more["tokens"]
        assert all(math.isfinite(s["loss"]) for s in more["steps"]) and len(more["steps"]) == 2
    assert second["steps"][0]["loss"] != r["steps"][0]["loss"]  # the optimizer stepped in between


def test_weights_dir_writes_the_random_weights_once_and_later_runs_load_them(config_dir, tmp_path):
    """Issue 28's full-depth runs: with --weights-dir the first process writes its random weights (and the
    config.json of the depth it built), a later process loads them instead of generating them, and it
    trains the same model: the same losses. A directory of another depth is an error that says so."""
    weights = tmp_path / "weights"
    first = bench(config_dir, "--experts", "cpu", "--weights-dir", str(weights))
    assert first["weights"]["source"] == "generated" and first["weights"]["write_s"] >= 0
    assert (weights / "model.safetensors").is_file()
    assert json.loads((weights / "config.json").read_text())["num_hidden_layers"] == CONFIG["num_hidden_layers"]
    later = bench(config_dir, "--experts", "cpu", "--weights-dir", str(weights))
    assert later["weights"]["source"] == "loaded"
    assert [s["loss"] for s in later["steps"]] == pytest.approx([s["loss"] for s in first["steps"]], rel=1e-6)
    # Offload mode as the first process (it frees a random model's experts once copied, unless they
    # are to be written): the file it writes is the same model.
    offload_weights = tmp_path / "offload-weights"
    offload_first = bench(config_dir, "--experts", "gpu-offload", "--weights-dir", str(offload_weights))
    assert offload_first["weights"]["source"] == "generated"
    loaded = bench(config_dir, "--experts", "cpu", "--weights-dir", str(offload_weights))
    assert loaded["weights"]["source"] == "loaded"
    assert [s["loss"] for s in loaded["steps"]] == pytest.approx([s["loss"] for s in first["steps"]], rel=1e-6)
    cmd = [os.environ["TANDEM_E2E_BENCH"], "--config", str(config_dir), "--device", "cpu", "--tokens", "64",
           "--steps", "1", "--layers", "1", "--weights-dir", str(weights)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "holds another model" in result.stderr


def run_failing(config_dir, *args):
    cmd = [os.environ["TANDEM_E2E_BENCH"], "--config", str(config_dir), "--device", "cpu", "--tokens", "64",
           "--steps", "1", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stderr


def test_int8_weights_dir_holds_the_engines_int8_experts(config_dir, tmp_path):
    """Issue 28 (q3fit item 1): with --experts-format int8 the first process writes the routed experts as the CPU
    engine's int8 rows (U8 values + each row's f32 max |w|: half the bf16 bytes), and every mode that loads the
    file trains the model the generating processes trained: the same losses (co-computation: the same, loaded or
    generated). A truncated file, a corrupt one and a run in another format are errors that say so."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = tmp_path / "int8"
    first = bench(config_dir, "--experts", "gpu-offload", "--experts-format", "int8", "--weights-dir", str(weights))
    assert first["weights"]["source"] == "generated" and first["weights"]["experts"] == "int8_rows"
    tensors = load_file(str(weights / "model.safetensors"))
    h, i, e = CONFIG["hidden_size"], CONFIG["moe_intermediate_size"], CONFIG["num_experts"]
    for layer in range(CONFIG["num_hidden_layers"]):
        for expert in range(e):
            for proj, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
                name = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
                assert name not in tensors
                values = tensors[name + "_int8"]
                assert values.dtype == torch.uint8 and tuple(values.shape) == shape
                amax = tensors[name + "_int8_amax"]
                assert amax.dtype == torch.float32 and tuple(amax.shape) == (shape[0],) and bool((amax > 0).all())
                # Each row's largest |q| is 127: the row maximum is one of its values.
                q = values.view(torch.int8).int()
                assert bool((q.abs().max(dim=1).values == 127).all())
    # The experts' bytes: a byte a weight and 4 a row, against 2 a weight in bf16.
    int8_bytes = sum(t.numel() * t.element_size() for n, t in tensors.items() if "_int8" in n)
    assert int8_bytes == CONFIG["num_hidden_layers"] * e * (3 * h * i + 4 * (2 * i + h))
    bf16 = bench(config_dir, "--experts", "cpu", "--experts-format", "bf16", "--weights-dir", str(tmp_path / "bf16"))
    assert first["weights"]["file_bytes"] < bf16["weights"]["file_bytes"]

    first_losses = [s["loss"] for s in first["steps"]]
    for setup in (["--experts", "cpu"], ["--experts", "gpu-offload"], ["--experts", "gpu-offload", "--gpu-experts", "3"],
                  ["--experts", "auto", "--expert-split", "cycle", "--gpu-experts", "3"]):
        loaded = bench(config_dir, *setup, "--experts-format", "int8", "--weights-dir", str(weights))
        assert loaded["weights"]["source"] == "loaded", setup
        generated = bench(config_dir, *setup, "--experts-format", "int8")
        # The same int8 weights as generating them, bitwise: the same numbers.
        assert [s["loss"] for s in loaded["steps"]] == [s["loss"] for s in generated["steps"]], setup
        # Across set-ups as test_every_setup_trains_the_same_model (bf16 activations, other sums).
        assert [s["loss"] for s in loaded["steps"]] == pytest.approx(first_losses, rel=2e-3), setup

    # Another format than the file's.
    assert "int8 rows" in run_failing(config_dir, "--experts-format", "bf16", "--weights-dir", str(weights))
    # Truncated (a write cut short, a full disk).
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "config.json").write_text((weights / "config.json").read_text())
    data = (weights / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "truncated" in run_failing(config_dir, "--experts-format", "int8", "--weights-dir", str(truncated))
    # Corrupt: an expert's row maxima missing.
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text((weights / "config.json").read_text())
    del tensors["model.layers.1.mlp.experts.5.down_proj.weight_int8_amax"]
    save_file(tensors, str(corrupt / "model.safetensors"))
    message = run_failing(config_dir, "--experts-format", "int8", "--weights-dir", str(corrupt))
    assert "corrupt" in message and "experts.5.down_proj.weight_int8_amax is missing" in message
