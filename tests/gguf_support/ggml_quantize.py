"""ggml's own quantisers (ggml_quantize_chunk in the libggml-base that llama-cpp-python ships), for block
types the `gguf` package cannot quantise (its quantize() has Q8_0, Q4_0, MXFP4, ..., not the K-quants or
IQ4_XS). The blocks are ggml's, byte for byte what llama-quantize writes for the same rows (without an
importance matrix)."""

import ctypes
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

_lib = None


def _ggml():
    global _lib
    if _lib is None:
        import llama_cpp

        path = Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
        _lib = ctypes.CDLL(str(path))
        _lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        _lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                             ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return _lib


def quantize(rows: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """rows [..., n] f32 -> uint8 [..., n / block * type_size], ggml's blocks (n a multiple of the block)."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    block, type_size = GGML_QUANT_SIZES[qtype]
    n = rows.shape[-1]
    assert n % block == 0, f"{n} is not a multiple of {qtype.name}'s block {block}"
    n_rows = rows.size // n
    out = np.zeros(n_rows * (n // block) * type_size, dtype=np.uint8)
    written = _ggml().ggml_quantize_chunk(int(qtype), rows.ctypes.data, out.ctypes.data, 0, n_rows, n, None)
    assert written == out.size, (written, out.size)
    return out.reshape(*rows.shape[:-1], (n // block) * type_size)
