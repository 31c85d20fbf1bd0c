"""Parity of Tandem's safetensors reader/writer with the PyPI `safetensors` package.

The reference package writes files (single and transformers-style sharded); the C++ tool
`safetensors_copy` reads them with tandem::io::SafetensorsModel and writes one file with
tandem::io::writeSafetensors; the reference package then reads that output and every tensor must be
bit-identical, with metadata preserved.

The tool's path comes from the environment variable TANDEM_SAFETENSORS_COPY (set by ctest) or the
pytest option --safetensors-copy.
"""

import json
import os
import subprocess

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file


def _tool_path(request):
    path = os.environ.get("TANDEM_SAFETENSORS_COPY")
    if not path:
        try:
            path = request.config.getoption("--safetensors-copy")
        except ValueError:
            path = None
    if not path:
        pytest.fail("set TANDEM_SAFETENSORS_COPY to the safetensors_copy executable")
    if not os.access(path, os.X_OK):
        pytest.fail(f"safetensors_copy not found or not executable: {path}")
    return path


@pytest.fixture(scope="module")
def tool(request):
    return _tool_path(request)


# torch dtype -> safetensors name; the unsigned types exist only in newer torch.
_FLOAT_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
_FP8_DTYPES = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
_INT_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8] + [
    getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)
]


def _random_bits(shape, dtype, gen):
    """Random bit patterns of `dtype` (so floats include NaNs, infs, subnormals, -0)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for d in shape:
        numel *= d
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def _special_floats(dtype):
    vals = [0.0, -0.0, 1.0, -1.5, float("inf"), float("-inf"), float("nan")]
    if dtype == getattr(torch, "float8_e4m3fn", None):
        vals = [v for v in vals if abs(v) != float("inf")]  # e4m3fn has no infinities
    return torch.tensor(vals, dtype=torch.float32).to(dtype)


def _make_tensors(seed=0):
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for dtype in _FLOAT_DTYPES + _FP8_DTYPES + _INT_DTYPES:
        name = str(dtype).replace("torch.", "")
        tensors[f"{name}.random"] = _random_bits((3, 5), dtype, gen)
        tensors[f"{name}.scalar"] = _random_bits((), dtype, gen)
        tensors[f"{name}.empty"] = torch.empty((0, 4), dtype=dtype)
        if dtype in _FLOAT_DTYPES + _FP8_DTYPES:
            tensors[f"{name}.special"] = _special_floats(dtype)
    tensors["bool.mask"] = torch.rand((7, 3), generator=gen) > 0.5
    tensors["bool.empty"] = torch.empty((0,), dtype=torch.bool)
    tensors["model.layers.0.mlp.experts.0.down_proj.weight"] = _random_bits((8, 16), torch.bfloat16, gen)
    return tensors


def _bytes(t):
    # Flatten first: torch cannot re-view a 0-d tensor as bytes of another element size.
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _assert_same(path, expected, expected_metadata):
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(expected.keys())
        assert (f.metadata() or {}) == expected_metadata
        for name, want in expected.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype, name
            assert tuple(got.shape) == tuple(want.shape), name
            assert _bytes(got) == _bytes(want), f"{name}: bytes differ"


def _run(tool, src, dst):
    result = subprocess.run([tool, str(src), str(dst)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"safetensors_copy failed:\n{result.stdout}\n{result.stderr}"


def test_single_file_every_dtype(tool, tmp_path):
    tensors = _make_tensors()
    metadata = {"format": "pt", "note": "ünïcødé ✓", "empty": ""}
    src = tmp_path / "model.safetensors"
    save_file(tensors, str(src), metadata=metadata)
    dst = tmp_path / "copy.safetensors"
    _run(tool, src, dst)
    _assert_same(dst, tensors, metadata)
    # The copy is laid out as the reference lays out headers: data section 8-byte aligned.
    header_len = int.from_bytes(dst.read_bytes()[:8], "little")
    assert (8 + header_len) % 8 == 0


def test_directory_with_model_safetensors(tool, tmp_path):
    tensors = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    dst = tmp_path / "out" / "copy.safetensors"
    dst.parent.mkdir()
    _run(tool, tmp_path, dst)
    _assert_same(dst, tensors, {})


def test_sharded_directory(tool, tmp_path):
    tensors = _make_tensors(seed=1)
    names = sorted(tensors)
    shards = [names[0::3], names[1::3], names[2::3]]
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    weight_map = {}
    total = 0
    for i, shard_names in enumerate(shards):
        shard_file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard_names}, str(model_dir / shard_file),
                  metadata={"format": "pt"})
        for n in shard_names:
            weight_map[n] = shard_file
            total += tensors[n].numel() * tensors[n].element_size()
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    dst = tmp_path / "merged.safetensors"
    _run(tool, model_dir, dst)
    _assert_same(dst, tensors, {"format": "pt"})


def test_truncated_file_is_rejected(tool, tmp_path):
    tensors = {"a": torch.randn(4, 4), "b": torch.zeros(0, dtype=torch.int8)}
    src = tmp_path / "src.safetensors"
    save_file(tensors, str(src))
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(src.read_bytes()[:-5])
    result = subprocess.run([tool, str(truncated), str(tmp_path / "x.safetensors")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "truncated.safetensors" in result.stderr
    assert not (tmp_path / "x.safetensors").exists()
