"""`tandem plan` as a user runs it: the real config.json of six MoE models against hardware presets
from 128 GB to 2 TB (the whole model x preset product runs in-process in placement_test), checked
against numbers computed here by hand from the configs."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

TANDEM = os.environ["TANDEM_BIN"]
REPO = pathlib.Path(__file__).resolve().parents[2]
MODELS = REPO / "presets" / "models"
# The smallest and largest machines, an AMD one without AMX and a 4-GPU one (tandem starts in ~2 s).
HARDWARE = [REPO / "presets" / "hardware" / f"{name}.yaml" for name in
            ("1xh200_xeon-16c_128g", "1x4090-24g_xeon-w7-spr_256g", "2xa6000_epyc-genoa-2s_768g",
             "4x4090-48g_xeon-gnr-2s_2t")]
RULES = REPO / "engine" / "placement" / "testdata" / "DeepSeek-V3-Chat-sft-amx-multi-gpu.yaml"
GIB = 1 << 30


def config(tmp_path, model, **extra):
    lines = {"model_name_or_path": str(MODELS / model), "stage": "sft", "do_train": "true",
             "finetuning_type": "lora", "lora_target": "all", "lora_rank": 8, "dataset": "identity",
             "template": "qwen3", "cutoff_len": 2048, "per_device_train_batch_size": 1, "bf16": "true",
             "output_dir": str(tmp_path / "out")}
    lines.update(extra)
    path = tmp_path / "train.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return path


def plan(*args):
    r = subprocess.run([TANDEM, "plan", *map(str, args), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def expert_bytes(model, bytes_per_weight, placement):
    """The routed experts' bytes less those the plan's placement makes resident on a GPU (the host
    frees its packs of them)."""
    c = json.loads((MODELS / model).read_text())
    experts = c.get("n_routed_experts") or c.get("num_experts") or c["num_local_experts"]
    width = c["intermediate_size"] if c["model_type"] == "mixtral" else c["moe_intermediate_size"]
    moe_layers = c["num_hidden_layers"] - c.get("first_k_dense_replace", 0)
    per_expert = 3 * c["hidden_size"] * width * bytes_per_weight
    routed = [m for m in placement if m["kind"] == "routed_experts"]
    assert len(routed) == moe_layers
    return sum((experts - m.get("gpu_experts", 0)) * per_expert for m in routed)


def host_item(result, prefix):
    return sum(i["bytes"] for d in result["devices"] if d["device"].startswith("cpu")
               for i in d["items"] if i["what"].startswith(prefix))


@pytest.mark.parametrize("model", ["deepseek-v3.json", "kimi-k2.json", "qwen3-235b-a22b.json",
                                   "qwen3-30b-a3b.json", "deepseek-v2-lite.json", "mixtral-8x7b.json"])
def test_every_model_on_four_presets(tmp_path, model):
    cfg = config(tmp_path, model)
    for hardware in HARDWARE:
        result = plan(cfg, "--hardware", hardware.stem)
        where = f"{model} on {hardware.stem}"
        # Routed experts as the engine holds them on these AVX-512/AMX presets: packed as bf16, fp8
        # checkpoints dequantised at pack time (2 bytes a weight either way, no scales), less the
        # experts resident on the GPUs (all of Qwen3-30B-A3B's fit an H200).
        # Where they do not fit so, experts_format auto holds them as int8 (1 byte a weight) or int4
        # (18 bytes per 32 weights).
        experts = host_item(result, "routed experts")
        per_weight = {"": 2, "int8": 1, "int4": 18 / 32}[result["expert_format_choice"]]
        expected = expert_bytes(model, per_weight, result["placement"])
        assert expected <= experts <= expected * 1.01, where
        modules = {m["name"]: m for m in result["placement"]}
        assert modules["model.layers.0.self_attn"]["device"].startswith("cuda:"), where
        assert all(m["device"].startswith("cpu") for m in result["placement"] if m["kind"] == "routed_experts"), where
        for d in result["devices"]:
            if d["device"].startswith("cuda:"):
                assert d["fits"], where  # the planner never overfills a GPU
        assert result["fits"] == (not result["advice"]), where
        ram = sum(d["capacity_bytes"] for d in result["devices"] if d["device"].startswith("cpu"))
        if experts > ram:
            assert not result["fits"] and "host RAM" in result["advice"][0], where
        if result["expert_format_choice"]:
            assert result["fits"], where


def test_deepseek_v3_needs_int8_and_a_terabyte(tmp_path):
    bf16 = config(tmp_path, "deepseek-v3.json", kt_backend="AMXBF16")
    small = plan(bf16, "--hardware", "2x4090-24g_xeon-spr-2s_512g")
    # The fp8 checkpoint's experts computed as bf16 need 1.3 TB: not on 512 GB, and the advice says int8.
    assert not small["fits"]
    assert "use amx_int8 experts" in small["advice"][0]
    assert not plan(bf16, "--hardware", "4x4090-24g_xeon-emr-2s_1t")["fits"]
    int8 = config(tmp_path, "deepseek-v3.json", kt_backend="AMXInt8")
    assert not plan(int8, "--hardware", "2x4090-24g_xeon-spr-2s_512g")["fits"]
    assert plan(int8, "--hardware", "4x4090-24g_xeon-emr-2s_1t")["fits"]


def test_qwen3_30b_fits_one_4090_and_256gb(tmp_path):
    result = plan(config(tmp_path, "qwen3-30b-a3b.json"), "--hardware", "1x4090-24g_xeon-w7-spr_256g")
    assert result["fits"]
    gpu = next(d for d in result["devices"] if d["device"] == "cuda:0")
    assert gpu["total_bytes"] < 24 * GIB
    assert all(m["device"] == "cuda:0" for m in result["placement"] if m["kind"] == "attention")


def test_rule_file_round_trip_through_the_cli(tmp_path):
    cfg = config(tmp_path, "deepseek-v3.json", kt_optimize_rule=RULES)
    first = plan(cfg, "--hardware", "2x4090-48g_xeon-gnr-2s_1t", "--rules-out", tmp_path / "out.yaml")
    assert {m["device"] for m in first["placement"] if m["kind"] == "attention"} == {"cuda:0", "cuda:1"}
    second = plan(cfg, "--hardware", "2x4090-48g_xeon-gnr-2s_1t", "--placement", tmp_path / "out.yaml")
    assert first["placement"] == second["placement"]


def test_this_machine_saved_as_a_preset_plans_the_same(tmp_path):
    cfg = config(tmp_path, "qwen3-30b-a3b.json")
    here = plan(cfg, "--hardware-out", tmp_path / "here.yaml")
    again = plan(cfg, "--hardware", tmp_path / "here.yaml")
    assert [d["device"] for d in here["devices"]] == [d["device"] for d in again["devices"]]
    # RAM: the preset holds the node totals the probe saw (a probe plans against available memory).
    assert sum(d["capacity_bytes"] for d in again["devices"] if d["device"].startswith("cpu")) >= \
        sum(d["capacity_bytes"] for d in here["devices"] if d["device"].startswith("cpu"))
    module = next(m for m in here["placement"] if m["name"] == "model.layers.0.mlp.experts")
    assert module["parameters"] == 128 * 3 * 2048 * 768


def test_text_output_and_bad_input(tmp_path):
    r = subprocess.run([TANDEM, "plan", str(config(tmp_path, "qwen3-30b-a3b.json")), "--hardware",
                        "1x4090-24g_xeon-w7-spr_256g"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "cuda:0" in r.stdout and "fits" in r.stdout and "routed_experts" in r.stdout
    r = subprocess.run([TANDEM, "plan", str(config(tmp_path, "qwen3-30b-a3b.json")), "--hardware", "no-such"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no hardware preset named 'no-such'" in r.stderr


def test_train_refuses_early_when_it_cannot_fit(tmp_path):
    # DeepSeek-V3 needs ~700 GB of host RAM: `tandem train` says so before loading or writing anything.
    cfg = config(tmp_path, "deepseek-v3.json")
    r = subprocess.run([TANDEM, "train", str(cfg)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TANDEM_HOME": str(tmp_path / "home")})
    assert r.returncode == 1
    assert "does not fit this machine" in r.stderr and "host RAM" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_chat_plans_a_kv_cache_instead_of_training_state(tmp_path):
    cfg = config(tmp_path, "qwen3-30b-a3b.json")
    train = plan(cfg, "--hardware", "1x4090-24g_xeon-w7-spr_256g")
    chat = plan(cfg, "--hardware", "1x4090-24g_xeon-w7-spr_256g", "--chat-context", 32768)
    gpu = lambda r: next(d for d in r["devices"] if d["device"] == "cuda:0")["bytes"]
    # 48 layers x 2 (K, V) x 4 KV heads x 128 x 2 bytes x 32768 tokens = 3 GiB, computed by hand.
    assert gpu(chat)["kv_cache"] == 48 * 2 * 4 * 128 * 2 * 32768
    assert gpu(train)["kv_cache"] == 0
    assert host_item(chat, "expert LoRA optimizer") == 0 and host_item(train, "expert LoRA optimizer") > 0


def test_a_q4_k_m_gguf_is_planned_at_its_bytes_in_the_file(tmp_path):
    """A GGUF's routed experts are held as their blocks: the plan charges exactly the bytes of the
    file's *_exps tensors (the gguf package reads them), per layer, and no transposed copy."""
    sys.path.insert(0, str(REPO / "tests" / "gguf_support"))
    import llama_reference as L
    from gguf import GGUFReader

    # Rows of 256 so that llama.cpp's Q4_K_M gives every expert tensor a K-quant (q4_K, q6_K).
    case = L.build_gguf_case("qwen3_moe_sparse", tmp_path / "case",
                             overrides={"hidden_size": 256, "moe_intermediate_size": 256})
    f32 = L.convert_hf_to_gguf(case["model"], tmp_path / "model-f32.gguf", "f32")
    q4 = L.quantize_gguf(f32, tmp_path / "model-q4_k_m.gguf", "Q4_K_M")
    experts = [t for t in GGUFReader(str(q4)).tensors if "_exps" in t.name]
    types = {t.tensor_type.name.lower() for t in experts}
    assert types <= {"q4_k", "q6_k"} and "q4_k" in types, types
    cfg = config(tmp_path, "qwen3-30b-a3b.json", model_name_or_path=q4)
    result = plan(cfg, "--hardware", "1xh200_xeon-16c_128g")
    assert host_item(result, "routed experts ") == sum(int(t.n_bytes) for t in experts)
    routed = [m for m in result["placement"] if m["kind"] == "routed_experts"]
    by_bytes = {}
    for t in experts:
        by_bytes[t.tensor_type.name.lower()] = by_bytes.get(t.tensor_type.name.lower(), 0) + int(t.n_bytes)
    assert {m["weight_format"] for m in routed} == {max(by_bytes, key=by_bytes.get)}
    assert sum(d["bytes"]["packed_wt"] for d in result["devices"]) == 0
    # The formats table starts with the format as stored and never offers a wider one.
    assert [f["format"] for f in result["expert_formats"]][0] == routed[0]["weight_format"]


def test_plan_shows_which_expert_formats_fit_and_picks_one(tmp_path):
    result = plan(config(tmp_path, "deepseek-v3.json"), "--hardware", "2x4090-24g_xeon-spr-2s_512g")
    formats = {f["format"]: f for f in result["expert_formats"]}
    assert list(formats) == ["bf16", "int8", "int4"]
    assert not formats["bf16"]["host_fits"] and not formats["int8"]["host_fits"]
    assert formats["int4"]["host_fits"] and formats["int4"]["chosen"]
    assert result["fits"] and result["expert_format_choice"] == "int4"
    # Hand formula: 58 MoE layers x 256 experts x 3 x 7168 x 2048 weights, 18 bytes per 32, less the
    # experts resident on the GPUs (never quantised on the host).
    assert host_item(result, "routed experts int4") == expert_bytes("deepseek-v3.json", 18 / 32, result["placement"])
    r = subprocess.run([TANDEM, "plan", str(config(tmp_path, "deepseek-v3.json")), "--hardware",
                        "2x4090-24g_xeon-spr-2s_512g"], capture_output=True, text=True, timeout=120)
    assert "routed experts held as" in r.stdout and "<- this plan" in r.stdout, r.stdout
    assert "experts_format auto: with bf16 experts" in r.stdout, r.stdout


def test_lora_experts_auto_is_sized_from_the_spare_gpu_memory(tmp_path):
    """issue 32: `lora_experts: auto` gets what the GPU has left after the working set (capped), a fixed number
    is taken as given, and without a GPU auto is the documented 1 path."""
    h200 = REPO / "presets" / "hardware" / "1xh200_xeon-16c_128g.yaml"
    auto = plan(config(tmp_path, "deepseek-v2-lite.json", lora_experts="auto", le_dim=64), "--hardware", h200)
    le = auto["lora_experts"]
    assert le["requested"] == "auto" and le["le_dim"] == 64
    assert le["paths"] == 8, le  # a 139 GB GPU has room for the auto maximum on V2-Lite
    hidden, tokens = 2048, 2048
    assert le["bytes_per_layer"] == 8 * (16 * 3 * hidden * 64 + 4 * tokens * (hidden + 4 * 64))
    # The plan carries them on the GPU: V2-Lite's 26 MoE layers (layer 0 is dense), as lora_optimizer bytes.
    gpu = next(d for d in auto["devices"] if d["device"] == "cuda:0")
    items = [i for i in gpu["items"] if i["what"].startswith("LoRA experts")]
    assert len(items) == 1 and items[0]["bytes"] == 26 * le["bytes_per_layer"], gpu["items"]
    # With auto, no resident experts take the spare memory first.
    assert all(m.get("gpu_experts", 0) == 0 for m in auto["placement"] if m["kind"] == "routed_experts")
    fixed = plan(config(tmp_path, "deepseek-v2-lite.json", lora_experts=3), "--hardware", h200)
    assert fixed["lora_experts"]["paths"] == 3
    off = plan(config(tmp_path, "deepseek-v2-lite.json"), "--hardware", h200)
    assert off["lora_experts"]["paths"] == 0
    cpu_only = tmp_path / "cpu_only.yaml"  # the H200 machine without its GPU
    cpu_only.write_text("\n".join(line for line in h200.read_text().splitlines()
                                  if not line.startswith(("gpus:", "  - model", "    "))) + "\ngpus: []\n")
    cpu = plan(config(tmp_path, "deepseek-v2-lite.json", lora_experts="auto"), "--hardware", cpu_only)
    assert cpu["lora_experts"]["paths"] == 1 and "CPU default" in cpu["lora_experts"]["reason"]
    text = subprocess.run([TANDEM, "plan", str(config(tmp_path, "deepseek-v2-lite.json", lora_experts="auto")),
                           "--hardware", str(h200)], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and "LoRA experts  lora_experts: auto: 8 path(s)" in text.stdout, text.stdout



@pytest.mark.parametrize("keys, format, group_bytes", [
    ({"experts_format": "int4"}, "int4", (32, 18)),
    ({"experts_format": "int4", "experts_int4_group": 64, "experts_int4_symmetric": "false"}, "int4:g64:asym", (64, 36)),
    ({"kt_expert_weight_format": "INT4"}, "int4", (32, 18)),
])
def test_int4_asked_for_is_planned_with_its_group_bytes(tmp_path, keys, format, group_bytes):
    """experts_format as the engine folds it (int4:g64:asym) is a format the planner charges: the
    routed experts at group_bytes[1] bytes per group_bytes[0] weights, no transposed copy."""
    result = plan(config(tmp_path, "qwen3-30b-a3b.json", **keys), "--hardware", "1x4090-24g_xeon-w7-spr_256g")
    routed = [m for m in result["placement"] if m["kind"] == "routed_experts"]
    assert {m["weight_format"] for m in routed} == {format}
    weights_per_byte = group_bytes[1] / group_bytes[0]
    assert host_item(result, "routed experts " + format) == expert_bytes("qwen3-30b-a3b.json", weights_per_byte, result["placement"])
    assert sum(d["bytes"]["packed_wt"] for d in result["devices"]) == 0


def test_plan_predicts_tokens_per_s_per_experts_mode(tmp_path):
    """Issue 28: the cost model's block. On the H200 preset (16 AMX cores, PCIe 5) streaming Qwen3-30B's
    experts beats the CPU engine, on two 56-core Sapphire Rapids with PCIe 4 the CPU wins; the split is
    never worse than either, and every figure is the tokens of a step over its time."""
    qwen = config(tmp_path, "qwen3-30b-a3b.json", gpu_experts=0, experts_mode="auto")
    h200 = plan(qwen, "--hardware", HARDWARE[0])["cost_model"]
    ws = plan(qwen, "--hardware", REPO / "presets" / "hardware" / "2x4090-24g_xeon-spr-2s_512g.yaml")["cost_model"]
    for cost in (h200, ws):
        assert cost["rates_source"].startswith("preset ")
        assert cost["plan_mode"] == "split"  # experts_mode auto: the split's row, not co's
        modes = {m["mode"]: m for m in cost["modes"]}
        assert set(modes) == {"co", "resident", "offload", "offload-resident"}
        for m in [*cost["modes"], cost["split"]]:
            if m["available"]:
                assert m["tokens_per_s"] == pytest.approx(2048e3 / m["step_ms"])
                assert m["step_ms"] >= cost["lower_bound_ms"] * (1 - 1e-9)
        # Never worse than co; offload may beat it (its streamed experts are staged one by one).
        assert cost["split"]["step_ms"] <= modes["co"]["step_ms"] * (1 + 1e-9)
        assert cost["lower_bound_ms"] <= modes["offload"]["step_ms"] * (1 + 1e-9)
        assert len(cost["split"]["layers"]) == 48  # its experts per MoE layer
        assert not modes["resident"]["available"]  # gpu_experts: 0
    h200_modes = {m["mode"]: m for m in h200["modes"]}
    ws_modes = {m["mode"]: m for m in ws["modes"]}
    assert h200_modes["offload"]["step_ms"] < h200_modes["co"]["step_ms"]
    assert ws_modes["co"]["step_ms"] < ws_modes["offload"]["step_ms"]
    text = subprocess.run([TANDEM, "plan", str(qwen), "--hardware", str(HARDWARE[0])], capture_output=True,
                          text=True, timeout=120)
    assert text.returncode == 0 and "predicted step (cost model" in text.stdout and "lower bound:" in text.stdout
    assert "(this plan: experts_mode auto)" in text.stdout and "split per MoE layer" in text.stdout
    assert "resident" not in [line.split()[0] for line in text.stdout.splitlines() if "(this plan" in line]


TINY = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 64,
        "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 256,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_calibrate_measures_this_machine_and_caches_it(tmp_path):
    """--calibrate measures (the expert engine on a layer of the model's shape) and writes the cache; a
    plain plan then reads it; a corrupt cache file falls back to the specs' figures, then --calibrate
    measures again."""
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    cfg = config(tmp_path, "qwen3-30b-a3b.json", model_name_or_path=model, cutoff_len=128)
    env = {**os.environ, "TANDEM_HOME": str(tmp_path / "home")}

    def run(*extra):
        r = subprocess.run([TANDEM, "plan", str(cfg), "--json", *extra], capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout).get("cost_model", {"rates_source": "none"})

    # Before any calibration: the figures this CPU's specs give (none for a CPU without AVX-512 BF16).
    unmeasured = run()["rates_source"]
    assert unmeasured.startswith("this machine's specs") or unmeasured == "none"
    measured = run("--calibrate")
    assert measured["rates_source"] == "calibrated"
    files = list((tmp_path / "home" / "cache" / "calibration").glob("*.json"))
    assert len(files) == 1
    cached = run()
    assert cached["rates_source"] == "cache"
    assert cached["modes"][0]["step_ms"] == pytest.approx(measured["modes"][0]["step_ms"])
    files[0].write_text('{"format_version": 1, "key": "tru')  # a write cut short
    assert run()["rates_source"] == unmeasured
    assert run("--calibrate")["rates_source"] == "calibrated"
    assert json.loads(files[0].read_text())["format_version"] == 1


def test_plan_says_the_longest_cutoff_len_that_fits(tmp_path):
    """Issue 29: the predicted GPU and host peaks at the YAML's cutoff_len and the longest cutoff_len
    that fits, as JSON and as the text's `sequence` line. At the longest the GPU is within its memory,
    the peak grows with the length, and a doubled batch halves (about) the longest sequence."""
    hardware = "1x4090-24g_xeon-w7-spr_256g"
    cfg = config(tmp_path, "qwen3-30b-a3b.json", lora_target="q_proj,k_proj,v_proj,o_proj", gpu_experts=0)
    result = plan(cfg, "--hardware", hardware)
    fit = result["sequence_fit"]
    gpu = next(d for d in result["devices"] if d["device"] == "cuda:0")
    assert fit["cutoff_len"] == 2048
    assert fit["gpu_peak_device"] == "cuda:0" and fit["gpu_peak_bytes"] == gpu["total_bytes"]
    assert fit["host_bytes"] == sum(d["total_bytes"] for d in result["devices"] if d["device"].startswith("cpu"))
    longest = fit["longest_cutoff_len"]
    assert 2048 < longest < 1 << 20 and longest % 256 == 0 and not fit["at_ceiling"]
    assert gpu["total_bytes"] < fit["longest_gpu_peak_bytes"] <= gpu["capacity_bytes"]
    assert any(change.startswith("offload_checkpoints: true (") for change in fit["lengthen"])
    (tmp_path / "batch2").mkdir()
    doubled = plan(config(tmp_path / "batch2", "qwen3-30b-a3b.json", lora_target="q_proj,k_proj,v_proj,o_proj",
                          gpu_experts=0, per_device_train_batch_size=2), "--hardware", hardware)["sequence_fit"]
    assert longest / 2 - 512 <= doubled["longest_cutoff_len"] <= longest / 2 + 512
    text = subprocess.run([TANDEM, "plan", str(cfg), "--hardware", hardware], capture_output=True, text=True,
                          timeout=120).stdout
    assert f"longest cutoff_len that fits: {longest} tokens" in text
    assert "\n  longer with offload_checkpoints: true (" in text
