"""The Tandem side of the end-to-end benchmark (bench/e2e_train_bench.cpp), run on the CPU device.

The GPU numbers in docs/benchmarks.md come from this program on the H200 machine; here every set-up it
measures runs on a tiny random Qwen3-MoE so that a change which breaks one fails CI rather than the next
device session. The set-ups compute the same model from the same seed, so their losses must agree: the
CPU expert engine, resident experts beside it, offload mode (also with a resident cache), experts_mode auto's
split, each with bf16 and with int8 experts (int8: the same quantised weights everywhere)."""
import json
import os
import subprocess

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


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
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


def test_int8_experts_are_not_the_bf16_ones(config_dir):
    """--experts-format int8 reaches every set-up: its loss differs from bf16's by the quantisation."""
    for args in (["--experts", "cpu", "--gpu-experts", "8"], ["--experts", "gpu-offload"]):
        bf16 = bench(config_dir, *args, "--experts-format", "bf16")["steps"][0]["loss"]
        int8 = bench(config_dir, *args, "--experts-format", "int8")["steps"][0]["loss"]
        assert int8 != bf16, args
        assert int8 == pytest.approx(bf16, rel=2e-2), args
