"""Parity of Tandem's GGUF reader, dequantizers and writer with the PyPI `gguf` package (gguf-py,
llama.cpp's own Python implementation of the format).

The reference writes files (gguf.GGUFWriter, tensors made by gguf.quants.quantize or random bytes
with sane scales); the C++ tool `gguf_tool` reads them with tandem::io::GgufFile and
  - `dump`s the header, which must equal what gguf.GGUFReader reads;
  - `dequant`s every tensor it can to F32 safetensors, which must equal gguf.quants.dequantize bit
    for bit (both are ggml's dequantize_row_* arithmetic, float32, unfused);
  - `copy`s the file with tandem::io::writeGguf, which GGUFReader must read back identically; the
    copy is also byte-identical to the GGUFWriter original, since both pad every tensor (the last
    one too) and the tensor-info block to the alignment.

The tool's path comes from the environment variable TANDEM_GGUF_TOOL (set by ctest).
"""

import json
import math
import os
import subprocess

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from safetensors.numpy import load_file


@pytest.fixture(scope="module")
def tool():
    path = os.environ.get("TANDEM_GGUF_TOOL")
    if not path:
        pytest.fail("set TANDEM_GGUF_TOOL to the gguf_tool executable")
    if not os.access(path, os.X_OK):
        pytest.fail(f"gguf_tool not found or not executable: {path}")
    return path


def _run(tool, command, src, dst, expect_rc=0):
    result = subprocess.run([tool, command, str(src), str(dst)], capture_output=True, text=True, timeout=300)
    assert result.returncode == expect_rc, f"gguf_tool {command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


def _write(path, fill, alignment=None):
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    fill(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---- files --------------------------------------------------------------------------------------

def _every_metadata_type(w):
    w.add_uint8("t.u8", 255)
    w.add_int8("t.i8", -128)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_float32("t.inf", float("-inf"))
    w.add_uint64("t.u64", 2**63 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.true", True)
    w.add_bool("t.false", False)
    w.add_string("t.string", "h\u00e9llo \u2713 \U0001F600")
    w.add_array("t.ints", [1, -2, 151643])
    w.add_array("t.floats", [0.5, -1.25, 3.0e38])
    w.add_array("t.strings", ["a", "\u0120the", "<|im_end|>", " "])
    w.add_array("t.bools", [True, False, True])
    for sub in (V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.UINT64, V.INT64):
        w.add_key_value(f"t.array_{sub.name.lower()}", [0, 1, 2, 127], V.ARRAY, sub_type=sub)
    w.add_key_value("t.array_float64", [0.1, -2.5e-300], V.ARRAY, sub_type=V.FLOAT64)
    w.add_context_length(4096)
    w.add_rope_freq_base(1e6)


def _tensors_gguf_can_make(w, rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w.add_tensor("f32", x)
    w.add_tensor("f32.4d", rng.standard_normal((2, 3, 1, 5)).astype(np.float32))
    w.add_tensor("f16", x.astype(np.float16))
    w.add_tensor("f64", x.astype(np.float64)[:1])
    for dtype in (np.int8, np.int16, np.int32, np.int64):
        w.add_tensor(f"i.{np.dtype(dtype).name}", rng.integers(-100, 100, (3, 7)).astype(dtype))
    for qtype in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.MXFP4, Q.TQ1_0, Q.TQ2_0):
        data = x if gguf.GGML_QUANT_SIZES[qtype][0] <= 64 else rng.standard_normal((2, 256)).astype(np.float32)
        w.add_tensor(qtype.name.lower(), gguf.quants.quantize(data, qtype), raw_dtype=qtype)


# Byte offsets, within one block, of the fp16 scale fields; random bytes there could be inf/nan.
_FP16_SCALES = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.MXFP4: [],
    Q.IQ2_XXS: [0], Q.IQ3_S: [0], Q.IQ1_M: [],  # no dequantizer in Tandem: must be skipped
}


def _random_blocks(qtype, rows, blocks_per_row, rng):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, blocks_per_row, block_bytes), dtype=np.uint8)
    for offset in _FP16_SCALES[qtype]:
        scales = (rng.uniform(-1, 1, (rows, blocks_per_row)) * 0.05).astype(np.float16)
        raw[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(rows, blocks_per_row, 2)
    if qtype == Q.MXFP4:
        raw[:, :, 0] = rng.integers(110, 140, (rows, blocks_per_row))  # E8M0 exponent near 2^0
    return raw.reshape(rows, blocks_per_row * block_bytes)


def _random_quant_tensors(w, rng):
    for qtype in _FP16_SCALES:
        rows = 3
        blocks_per_row = 2 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 5
        w.add_tensor(f"random.{qtype.name.lower()}", _random_blocks(qtype, rows, blocks_per_row, rng), raw_dtype=qtype)
    bits = rng.integers(0, 2**16, (2, 33), dtype=np.uint16)
    w.add_tensor("random.bf16", bits.view(np.uint8), raw_dtype=Q.BF16)


@pytest.fixture(scope="module", params=[32, 64, 1, 4096], ids=lambda a: f"align{a}")
def model_file(request, tmp_path_factory):
    alignment = request.param
    rng = np.random.default_rng(alignment)
    path = tmp_path_factory.mktemp("gguf") / f"model_align{alignment}.gguf"

    def fill(w):
        _every_metadata_type(w)
        _tensors_gguf_can_make(w, rng)
        _random_quant_tensors(w, rng)

    return _write(path, fill, alignment=None if alignment == 32 else alignment)


# ---- comparisons --------------------------------------------------------------------------------

def _reader_fields(reader):
    """(key, type name, element type name or None, value) for every metadata field, in file order."""
    out = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue  # the reader's pseudo-fields for the header
        main = field.types[0]
        element = field.types[-1].name.lower() if main == V.ARRAY else None
        out.append((name, main.name.lower(), element, field.contents()))
    return out


def _json_number(v):
    return float(v) if isinstance(v, str) else v  # "nan", "inf", "-inf"


def _same_value(ours, theirs):
    if isinstance(theirs, list):
        return len(ours) == len(theirs) and all(_same_value(a, b) for a, b in zip(ours, theirs))
    if isinstance(theirs, float):
        ours = _json_number(ours)
        return ours == theirs or (math.isnan(ours) and math.isnan(theirs))
    return ours == theirs and type(ours) is type(theirs)


def test_dump_matches_gguf_reader(tool, model_file, tmp_path):
    out = tmp_path / "dump.json"
    _run(tool, "dump", model_file, out)
    dump = json.loads(out.read_text())
    reader = gguf.GGUFReader(str(model_file))

    assert dump["version"] == int(reader.fields["GGUF.version"].parts[0][0])
    assert dump["alignment"] == reader.alignment
    assert dump["data_offset"] == reader.data_offset
    theirs = _reader_fields(reader)
    assert list(dump["metadata"]) == [key for key, *_ in theirs]
    for key, type_name, element_name, value in theirs:
        entry = dump["metadata"][key]
        assert entry["type"] == type_name, key
        assert entry.get("element_type") == element_name, key
        assert _same_value(entry["value"], value), f"{key}: {entry['value']!r} != {value!r}"

    assert [t["name"] for t in dump["tensors"]] == [t.name for t in reader.tensors]
    for ours, t in zip(dump["tensors"], reader.tensors):
        assert Q[ours["type"].upper()] == t.tensor_type, t.name
        assert ours["ne"] == [int(d) for d in t.shape], t.name
        assert ours["offset"] == t.data_offset - reader.data_offset, t.name
        assert ours["byte_size"] == t.n_bytes, t.name


def _reference_dequant(t):
    if t.tensor_type in (Q.F64, Q.I8, Q.I16, Q.I32, Q.I64):
        return t.data.astype(np.float32)  # gguf.quants has no converter; ggml reads them as values
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)


def _dequantizable_by_tandem(qtype):
    return qtype not in (Q.TQ1_0, Q.TQ2_0, Q.IQ2_XXS, Q.IQ3_S, Q.IQ1_M)


def test_dequant_matches_gguf_quants(tool, model_file, tmp_path):
    out = tmp_path / "dequant.safetensors"
    _run(tool, "dequant", model_file, out)
    ours = load_file(str(out))
    reader = gguf.GGUFReader(str(model_file))
    expected_names = set()
    for t in reader.tensors:
        if not _dequantizable_by_tandem(t.tensor_type):
            assert t.name not in ours, f"{t.name}: {t.tensor_type.name} has no dequantizer but was written"
            continue
        expected_names.add(t.name)
        ref = _reference_dequant(t)
        got = ours[t.name]
        assert got.dtype == np.float32, t.name
        assert got.shape == ref.shape == tuple(int(d) for d in reversed(t.shape)), t.name
        assert np.isfinite(ref).all() or t.name == "random.bf16", f"{t.name}: reference has inf/nan"
        # Bit-identical, NaN patterns included (bf16/f16 conversions keep them).
        mismatch = np.flatnonzero(got.view(np.uint32) != ref.view(np.uint32))
        assert mismatch.size == 0, (
            f"{t.name} ({t.tensor_type.name}): {mismatch.size} of {ref.size} values differ, first at flat "
            f"index {mismatch[0]}: {got.reshape(-1)[mismatch[0]]!r} != {ref.reshape(-1)[mismatch[0]]!r}")
    assert set(ours) == expected_names


def test_copy_reads_back_identically(tool, model_file, tmp_path):
    out = tmp_path / "copy.gguf"
    _run(tool, "copy", model_file, out)
    original = gguf.GGUFReader(str(model_file))
    copy = gguf.GGUFReader(str(out))
    assert copy.alignment == original.alignment
    assert copy.data_offset == original.data_offset
    assert [(k, t, e) for k, t, e, _ in _reader_fields(copy)] == [(k, t, e) for k, t, e, _ in _reader_fields(original)]
    for (key, _, _, a), (_, _, _, b) in zip(_reader_fields(copy), _reader_fields(original)):
        assert _same_value(a, b), key
    assert len(copy.tensors) == len(original.tensors)
    for a, b in zip(copy.tensors, original.tensors):
        assert (a.name, a.tensor_type, list(a.shape)) == (b.name, b.tensor_type, list(b.shape))
        assert a.data_offset == b.data_offset, a.name
        assert a.data.tobytes() == b.data.tobytes(), f"{a.name}: tensor bytes differ"
    # writeGguf lays a file out as GGUFWriter does (metadata in order, each tensor padded to the
    # alignment, the last one included), so the copy is the same file.
    assert out.read_bytes() == model_file.read_bytes()


def test_metadata_only_file(tool, tmp_path):
    src = _write(tmp_path / "meta.gguf", _every_metadata_type, alignment=128)
    _run(tool, "copy", src, tmp_path / "copy.gguf")
    assert (tmp_path / "copy.gguf").read_bytes() == src.read_bytes()
    _run(tool, "dump", src, tmp_path / "dump.json")
    assert json.loads((tmp_path / "dump.json").read_text())["tensors"] == []


def test_uint64_above_int64_is_refused(tool, tmp_path):
    # GgufValue holds integers as int64_t; gguf-py accepts the value, Tandem refuses it by name.
    src = _write(tmp_path / "big.gguf", lambda w: w.add_uint64("t.big", 2**64 - 1))
    result = _run(tool, "dump", src, tmp_path / "dump.json", expect_rc=1)
    assert "t.big" in result.stderr and "above 2^63-1" in result.stderr
    assert not (tmp_path / "dump.json").exists()


def test_truncated_file_is_rejected(tool, tmp_path):
    rng = np.random.default_rng(0)
    src = _write(tmp_path / "src.gguf", lambda w: w.add_tensor("w", rng.standard_normal((8, 32)).astype(np.float32)))
    data = src.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) - 100])
    result = _run(tool, "copy", truncated, tmp_path / "x.gguf", expect_rc=1)
    assert "truncated.gguf" in result.stderr and 'tensor "w"' in result.stderr
    assert not (tmp_path / "x.gguf").exists()
