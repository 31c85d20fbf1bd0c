#!/usr/bin/env python3
"""Writes the seed corpora of the file-parser fuzz targets into tests/fuzz/corpus/<target>/.

Each target gets real files (from the repo's presets and test data, or as the tools write them),
hostile ones that must be refused with an Error, and one input of about 200 KB nested far past
the parser's depth limit: the size at which an unbounded parse used to overflow the stack.
Run from anywhere; it rewrites only the files it names.
"""
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
DEEP = "[" * 100000 + "]" * 100000  # 200 KB


def write(target, name, text):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    data = text if isinstance(text, bytes) else text.encode()
    (d / name).write_bytes(data)


def tokenizer_json():
    qwen = (ROOT / "engine/io/testdata/qwen2_small/tokenizer.json").read_text()
    write("tokenizer_json", "valid_qwen2_small", qwen)
    spm = {
        "added_tokens": [{"id": 0, "content": "<unk>", "special": True},
                         {"id": 1, "content": "<s>", "special": True}],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>",
                  "vocab": {"<unk>": 0, "<s>": 1, "<0x41>": 2, "\u2581": 3, "a": 4, "b": 5,
                            "ab": 6, "\u2581ab": 7},
                  "merges": [["a", "b"], ["\u2581", "ab"]]},
    }
    write("tokenizer_json", "valid_sentencepiece", json.dumps(spm))
    bad = json.loads(json.dumps(spm))
    bad["added_tokens"][1]["id"] = -1
    write("tokenizer_json", "invalid_added_id_negative", json.dumps(bad))
    bad["added_tokens"][1]["id"] = 2147483647
    write("tokenizer_json", "invalid_added_id_huge", json.dumps(bad))
    bad = json.loads(json.dumps(spm))
    bad["model"]["vocab"]["b"] = 1e300
    write("tokenizer_json", "invalid_vocab_id_float", json.dumps(bad))
    bad = json.loads(json.dumps(spm))
    bad["post_processor"]["special_tokens"]["<s>"]["ids"] = [99999]
    write("tokenizer_json", "invalid_template_id", json.dumps(bad))
    write("tokenizer_json", "invalid_deep_normalizer",
          '{"model": {"type": "BPE", "vocab": {}, "merges": []}, "normalizer": ' + DEEP + "}")


def model_config():
    for path in sorted((ROOT / "presets/models").glob("*.json")):
        write("model_config", "valid_" + path.stem, path.read_text())
    qwen = json.loads((ROOT / "presets/models/qwen3-30b-a3b.json").read_text())
    for key, value in [("hidden_size", 1e300), ("num_hidden_layers", "48"),
                       ("rope_scaling", {"rope_type": "yarn", "factor": -1}),
                       ("num_experts_per_tok", 1000)]:
        bad = dict(qwen)
        bad[key] = value
        write("model_config", "invalid_" + key, json.dumps(bad))
    text = json.dumps({k: v for k, v in qwen.items() if k != "hidden_size"})
    write("model_config", "invalid_deep_value", '{"hidden_size": ' + DEEP + ", " + text[1:])


def adapter_config():
    written = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "m",
               "r": 8, "lora_alpha": 16.0, "lora_dropout": 0.0, "use_rslora": False,
               "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True,
               "target_modules": ["q_proj", "v_proj"],
               "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
               "rank_pattern": {"mlp.experts.gate_up_proj": 16},
               "alpha_pattern": {"mlp.experts.gate_up_proj": 32.0},
               "modules_to_save": None, "use_dora": False, "peft_version": "0.21.0"}
    write("adapter_config", "valid_tandem_fused", json.dumps(written, indent=2))
    write("adapter_config", "valid_minimal", '{"r": 4, "lora_alpha": 8}')
    for key, value in [("peft_type", 3), ("r", 1e300), ("use_dora", "yes"),
                       ("alpha_pattern", {"x": "y"})]:
        bad = dict(written)
        bad[key] = value
        write("adapter_config", "invalid_" + key, json.dumps(bad))
    write("adapter_config", "invalid_deep_value", '{"peft_type": ' + DEEP + "}")


QWEN3_LORA_SFT = """### model
model_name_or_path: Qwen/Qwen3-4B-Instruct-2507
trust_remote_code: true
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset: identity
template: qwen3_nothink
cutoff_len: 2048
max_samples: 1000
output_dir: saves/qwen3-4b/lora/sft
logging_steps: 10
save_steps: 500
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
resume_from_checkpoint: null
"""

KT_KEYS = """use_kt: true
kt_optimize_rule: examples/kt_optimize_rules/DeepSeek-V3-Chat-sft-amx-multi-gpu.yaml
cpu_infer: 128
chunk_size: 8192
"""


def train_config():
    write("train_config", "valid_demo", (ROOT / "presets/training/demo_lora_sft.yaml").read_text())
    write("train_config", "valid_qwen3_lora_sft", QWEN3_LORA_SFT)
    write("train_config", "valid_kt_generation1", QWEN3_LORA_SFT + KT_KEYS)
    write("train_config", "invalid_huge_epochs", QWEN3_LORA_SFT + "num_train_epochs: 1e300\n")
    write("train_config", "invalid_list_value", QWEN3_LORA_SFT + "lora_rank: [1, 2]\n")
    write("train_config", "invalid_map_key", QWEN3_LORA_SFT + "? {a: b}\n: 1\n")
    write("train_config", "invalid_deep_value", QWEN3_LORA_SFT + "lora_target: " + DEEP + "\n")


def kt_rules():
    write("kt_rules", "valid_llamafactory_deepseek_v3",
          (ROOT / "engine/placement/testdata/DeepSeek-V3-Chat-sft-amx-multi-gpu.yaml").read_text())
    write("kt_rules", "valid_offload",
          '- match: {name: "^model\\\\.layers\\\\.(0|1)\\\\.mlp\\\\.experts$"}\n'
          "  replace: {class: ktransformers.operators.experts.KTransformersExperts,\n"
          "            kwargs: {generate_device: cuda:0, prefill_device: cuda:0}}\n"
          "  recursive: False\n"
          '- match: {name: "^model$"}\n'
          "  replace: {class: ktransformers.operators.models.KDeepseekV2Model,\n"
          "            kwargs: {transfer_map: {2: cuda:1}}}\n")
    write("kt_rules", "invalid_name_list", "- match: {name: [1, 2]}\n  replace: {class: default}\n")
    write("kt_rules", "invalid_map_key", "- match: {{a: b}: x}\n  replace: {class: default}\n")
    write("kt_rules", "invalid_kwarg_list",
          '- match: {name: "^lm_head$"}\n  replace: {class: default, kwargs: {prefill_device: [a]}}\n')
    write("kt_rules", "invalid_deep_value", "- match: {name: " + DEEP + "}\n")


def dataset_rows():
    # The first byte picks the kind (dataset_rows_fuzz.cpp): 0 alpaca .json, 1 alpaca .jsonl,
    # 2 alpaca .csv, 3 sharegpt .jsonl, 4 sharegpt with role/content tags, 5 openai .json.
    alpaca = [{"instruction": "Say hi", "input": "", "output": "hi", "system": "be brief",
               "history": [["q", "a"]]}, {"instruction": "x", "output": 3}]
    write("dataset_rows", "valid_alpaca_json", b"\x00" + json.dumps(alpaca).encode())
    write("dataset_rows", "valid_alpaca_jsonl",
          b"\x01" + "\n".join(json.dumps(r) for r in alpaca).encode())
    write("dataset_rows", "valid_alpaca_csv",
          b"\x02" + b'instruction,input,output\n"Say, hi",,hi\r\n"multi\nline",x,"y ""q"""\n')
    sharegpt = {"conversations": [{"from": "human", "value": "hi"},
                                  {"from": "function_call", "value": "{}"},
                                  {"from": "observation", "value": "r"},
                                  {"from": "gpt", "value": "hello"}],
                "system": "s", "tools": "[]"}
    write("dataset_rows", "valid_sharegpt", b"\x03" + json.dumps(sharegpt).encode())
    tagged = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                           {"role": "assistant", "content": "a"}]}
    write("dataset_rows", "valid_sharegpt_tags", b"\x04" + json.dumps(tagged).encode())
    write("dataset_rows", "valid_openai", b"\x05" + json.dumps([tagged]).encode())
    write("dataset_rows", "invalid_deep_tools",
          b"\x03" + ('{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", '
                     '"value": "a"}], "tools": ' + DEEP + "}").encode())
    write("dataset_rows", "invalid_csv_quote", b"\x02instruction,output\n\"open,x\n")


def block_table():
    """type index, int4 options, rows, cols (u16), claimed bytes (u32), table: block_table_fuzz.cpp."""
    import random
    import struct
    rng = random.Random(3)
    # (type index, elems, bytes): Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4, INT4 sym 32 / asym 64
    for index, name, elems, block_bytes, options in [(0, "q8_0", 32, 34, 0), (1, "q4_0", 32, 18, 0),
                                                      (2, "q4_k", 256, 144, 0), (3, "q5_k", 256, 176, 0),
                                                      (4, "q6_k", 256, 210, 0), (5, "iq4_xs", 256, 136, 0),
                                                      (6, "mxfp4", 32, 17, 0), (7, "int4_g32", 32, 18, 1),
                                                      (7, "int4_g64_asym", 64, 36, 2 | 8)]:
        rows, cols = 3, 2 * elems
        size = rows * (cols // elems) * block_bytes
        table = bytes(rng.randrange(256) for _ in range(size))
        header = bytes([index, options]) + struct.pack("<HHI", rows, cols, size)
        write("block_table", f"valid_{name}", header + table)
        write("block_table", f"invalid_short_{name}", header[:6] + struct.pack("<I", size - 1) + table)
        write("block_table", f"invalid_cols_{name}", header[:4] + struct.pack("<HI", cols + 1, size) + table)


def packed_int4():
    """dtypes (packed, scale, shape), rows, cols, packed shape, scale shape, weight_shape rank, three byte
    lengths, then the tensors: packed_int4_fuzz.cpp. Index into its dtype list: I32 0, I64 1, BF16 2, F16 3, F32 4."""
    import random
    import struct
    rng = random.Random(4)

    def case(name, rows, cols, packed_dtype=0, scale_dtype=2, shape_dtype=1, packed_shape=None, scale_shape=None,
             shape_values=None, rank=1, cut=0):
        words, groups = -(-cols // 8), -(-cols // 32)
        packed_shape = packed_shape or (rows, words)
        scale_shape = scale_shape or (rows, groups)
        sizes = {0: 4, 1: 8, 2: 2, 3: 2, 4: 4}
        packed = bytes(rng.randrange(256) for _ in range(packed_shape[0] * packed_shape[1] * sizes[packed_dtype]))
        scale = b"".join(struct.pack("<H", 0x3C00 + rng.randrange(64)) if scale_dtype == 3 else
                         struct.pack("<H", 0x3B00 + rng.randrange(64)) for _ in range(scale_shape[0] * scale_shape[1]))
        values = shape_values or (rows, cols)
        shape = b"".join(struct.pack("<q" if shape_dtype == 1 else "<i", v) for v in values)
        packed = packed[:len(packed) - cut]
        header = bytes([packed_dtype, scale_dtype, shape_dtype]) + struct.pack(
            "<HHHHHHBHHH", rows, cols, *packed_shape, *scale_shape, 1 if rank == 1 else rank, len(packed),
            len(scale), len(shape))
        write("packed_int4", name, header + packed + scale + shape)

    case("valid_4x64", 4, 64)
    case("valid_3x96_f16_scales_i32_shape", 3, 96, scale_dtype=3, shape_dtype=0)
    case("valid_partial_group_2x44", 2, 44)  # dequantised; refused by the repack (not whole groups)
    case("invalid_shape_values", 4, 64, shape_values=(4, 96))
    case("invalid_packed_width", 4, 64, packed_shape=(4, 4))
    case("invalid_packed_short", 4, 64, cut=4)
    case("invalid_scale_f32", 4, 64, scale_dtype=4)
    case("invalid_packed_i64", 4, 64, packed_dtype=1)
    case("invalid_shape_rank", 4, 64, rank=2)


if __name__ == "__main__":
    block_table()
    packed_int4()
    tokenizer_json()
    model_config()
    adapter_config()
    train_config()
    kt_rules()
    dataset_rows()
