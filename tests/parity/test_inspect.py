"""Parity of `tandem inspect --json` with transformers' own view of the same model.

Tiny random models of each supported architecture are built with transformers (fixed seed),
saved with save_pretrained (safetensors), and inspected by the C++ tool. Parameter counts must
equal transformers' `num_parameters()` and the per-role sums of its named parameters.

transformers 5.17 keeps routed experts fused in memory (`mlp.experts.gate_up_proj` [E, 2I, H],
`mlp.experts.down_proj` [E, H, I]) but save_pretrained writes the per-expert names
(`mlp.experts.E.gate_proj.weight`, mixtral `block_sparse_moe.experts.E.w1.weight`), so the
in-memory names are the reference here, not the file's.

DeepSeek-V3's router has a persistent buffer `mlp.gate.e_score_correction_bias` that is saved in the
checkpoint but is not an nn.Parameter; Tandem counts every tensor of the checkpoint, so its total is
num_parameters() plus the persistent buffers.

The tool's path comes from $TANDEM_BIN (set by ctest).
"""

import json
import os
import subprocess

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)

CONFIGS = {
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, head_dim=16,
                      mlp_only_layers=[1], norm_topk_prob=True),
    "deepseek_v3": dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                        q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=16,
                        rope_scaling={"type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 16, "beta_fast": 32,
                                      "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "deepseek_v2": dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                        n_shared_experts=2, first_k_dense_replace=1, q_lora_rank=None,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16),
    "qwen2_moe": dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      shared_expert_intermediate_size=48, decoder_sparse_step=2),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "llama": dict(tie_word_embeddings=True,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "qwen2": dict(),
    "qwen3": dict(head_dim=16),
}
BF16 = {"qwen3_moe", "mixtral"}  # saved in bfloat16 to exercise the per-dtype counts


@pytest.fixture(scope="module")
def tandem_bin():
    path = os.environ.get("TANDEM_BIN")
    if not path:
        pytest.fail("set TANDEM_BIN to the tandem executable")
    if not os.access(path, os.X_OK):
        pytest.fail(f"tandem not found or not executable: {path}")
    return path


def build_model(model_type, directory, **save_kwargs):
    torch.manual_seed(0)
    kwargs = dict(COMMON)
    kwargs.update(CONFIGS[model_type])
    config = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(config)
    if model_type in BF16:
        model = model.to(torch.bfloat16)
    model.save_pretrained(directory, **save_kwargs)
    return model


def run_inspect(tandem_bin, directory, *extra):
    return subprocess.run([tandem_bin, "inspect", str(directory), *extra],
                          capture_output=True, text=True, timeout=60)


def inspect_json(tandem_bin, directory):
    result = run_inspect(tandem_bin, directory, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def numel(named, predicate):
    return sum(t.numel() for name, t in named if predicate(name))


def reference_counts(model):
    """Per-role sums over transformers' in-memory parameter names (and persistent buffers)."""
    params = list(model.named_parameters())
    state_names = set(model.state_dict().keys())
    buffers = [(n, b) for n, b in model.named_buffers() if n in state_names]
    tensors = params + buffers
    is_norm = lambda n: n.endswith("norm.weight")
    return {
        "buffers": numel(buffers, lambda n: True),
        "routed_experts": numel(tensors, lambda n: "mlp.experts" in n),
        "shared_experts": numel(tensors, lambda n: "mlp.shared_expert" in n),
        "router": numel(tensors, lambda n: ".mlp.gate." in n),
        "embeddings": numel(tensors, lambda n: "embed_tokens" in n),
        "lm_head": numel(tensors, lambda n: n.startswith("lm_head")),
        "norms": numel(tensors, is_norm),
        "attention": numel(tensors, lambda n: ".self_attn." in n and not is_norm(n)),
        "dense_mlp": numel(tensors, lambda n: any(f".mlp.{p}_proj." in n for p in ("gate", "up", "down"))),
    }


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_inspect_matches_transformers(tandem_bin, tmp_path, model_type):
    model = build_model(model_type, tmp_path)
    got = inspect_json(tandem_bin, tmp_path)
    ref = reference_counts(model)
    config = model.config

    assert got["architecture"] == model_type
    assert got["model_type"] == model_type
    assert got["num_layers"] == config.num_hidden_layers
    moe_layers = sum(1 for layer in model.model.layers if hasattr(layer.mlp, "experts"))
    assert got["num_moe_layers"] == moe_layers

    p = got["parameters"]
    assert p["total"] == model.num_parameters() + ref["buffers"]
    if model_type != "deepseek_v3":
        assert ref["buffers"] == 0
        assert p["total"] == model.num_parameters()
    for key in ("routed_experts", "shared_experts", "router", "embeddings", "lm_head", "norms",
                "attention", "dense_mlp"):
        assert p[key] == ref[key], key
    assert p["other"] == 0
    assert sum(v for k, v in p.items() if k != "total") == p["total"]

    if moe_layers:
        experts = got["num_experts"]
        top_k = got["num_experts_per_tok"]
        assert top_k == config.num_experts_per_tok
        assert experts == 4
        assert got["active_parameters"] == (p["total"] - p["routed_experts"]
                                            + p["routed_experts"] * top_k // experts)
    else:
        assert got["num_experts"] == 0
        assert got["active_parameters"] == p["total"]

    dtype = "BF16" if model_type in BF16 else "F32"
    assert got["dtypes"] == {dtype: p["total"]}
    files = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert got["bytes_on_disk"] == sum(os.path.getsize(tmp_path / f) for f in files)


def test_human_output_mentions_the_essentials(tandem_bin, tmp_path):
    build_model("deepseek_v3", tmp_path)
    result = run_inspect(tandem_bin, tmp_path)
    assert result.returncode == 0, result.stderr
    for text in ("deepseek_v3", "MLA", "kv_lora_rank 16", "3 (2 MoE, 1 dense)", "4 routed, top-2",
                 "routed_experts", "active", "On disk"):
        assert text in result.stdout, text


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sharded")
    model = build_model("qwen3_moe", directory, max_shard_size="100KB")
    assert (directory / "model.safetensors.index.json").exists()
    return directory, model


def test_sharded_model(tandem_bin, sharded_dir):
    directory, model = sharded_dir
    got = inspect_json(tandem_bin, directory)
    assert got["parameters"]["total"] == model.num_parameters()
    assert got["num_files"] > 1


def copy_dir(src, dst):
    dst.mkdir()
    for name in os.listdir(src):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def assert_fails(tandem_bin, directory, *expected):
    result = run_inspect(tandem_bin, directory)
    assert result.returncode == 1, (result.returncode, result.stderr)  # an Error, not a crash
    for text in expected:
        assert text in result.stderr, (text, result.stderr)


def test_missing_shard_is_an_error(tandem_bin, sharded_dir, tmp_path):
    directory = copy_dir(sharded_dir[0], tmp_path / "m")
    shard = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))[-1]
    os.remove(directory / shard)
    assert_fails(tandem_bin, directory, shard)


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("good")
    build_model("qwen3_moe", directory)
    return directory


def with_config(good_dir, tmp_path, edit):
    directory = copy_dir(good_dir, tmp_path / "m")
    path = directory / "config.json"
    path.write_text(edit(path.read_text()))
    return directory


def edit_json(change):
    def edit(text):
        config = json.loads(text)
        change(config)
        return json.dumps(config)
    return edit


def test_corrupt_config_is_an_error(tandem_bin, good_dir, tmp_path):
    directory = with_config(good_dir, tmp_path, lambda text: text[: len(text) // 2])
    assert_fails(tandem_bin, directory, "config.json", "not valid JSON")


def test_unsupported_architecture_is_an_error(tandem_bin, good_dir, tmp_path):
    directory = with_config(good_dir, tmp_path, edit_json(lambda c: c.update(model_type="gpt_oss")))
    assert_fails(tandem_bin, directory, "config.json", "model_type", "gpt_oss", "qwen3_moe")


def test_missing_field_is_an_error(tandem_bin, good_dir, tmp_path):
    directory = with_config(good_dir, tmp_path, edit_json(lambda c: c.pop("hidden_size")))
    assert_fails(tandem_bin, directory, "config.json", "'hidden_size'", "missing")


def test_wrong_type_is_an_error(tandem_bin, good_dir, tmp_path):
    directory = with_config(good_dir, tmp_path, edit_json(lambda c: c.update(num_experts_per_tok="2")))
    assert_fails(tandem_bin, directory, "'num_experts_per_tok'", "integer")


def test_missing_config_and_weights_are_errors(tandem_bin, good_dir, tmp_path):
    assert_fails(tandem_bin, tmp_path, "config.json")
    directory = copy_dir(good_dir, tmp_path / "m")
    os.remove(directory / "model.safetensors")
    result = run_inspect(tandem_bin, directory)
    assert result.returncode == 1, result.stderr
    assert "safetensors" in result.stderr
