"""Routed experts computed on their GGUF blocks (issue 27) against the PyPI `gguf` package.

For every block type the expert engine takes (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4), random expert
weights are quantised by ggml (tests/gguf_support/ggml_quantize.py: ggml_quantize_chunk, the quantiser of
llama-quantize) and written to a GGUF file with gguf-py's GGUFWriter; tests/tools/expert_layer_tool runs one
ExpertLayer forward + backward on them, reading the blocks where the file is mapped. The reference
dequantises the same bytes with gguf.quants.dequantize and computes the layer in fp32 with torch autograd
(HF semantics, PEFT LoRA on gate/up/down):

* the engine's reference decoder gives gguf's values bit for bit (a scale or min read wrong shows here);
* y, dX, d topk-weights and the LoRA gradients are within 1e-3 relative L2 (bf16 activations: 2e-2), on the
  fp32 backends this machine has;
* a flipped scale byte in one block breaks the parity (the comparison sees the blocks' scales);
* int4 (quantised by the engine at load from these weights) and a wrong table are checked too.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gguf_support"))
import ggml_quantize  # noqa: E402

TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS, Q.MXFP4]
E, H, I, T, K, R, SCALE = 4, 256, 512, 13, 2, 4, 0.5
PROJ = ("gate", "up", "down")


def tool():
    path = os.environ.get("TANDEM_EXPERT_LAYER_TOOL")
    if not path:
        pytest.skip("TANDEM_EXPERT_LAYER_TOOL is not set (run through ctest)")
    return path


def shape_of(p):  # torch order [E, out, in]
    return (E, H, I) if p == "down" else (E, I, H)


def make_case(qtype, seed=0, down_qtype=None):
    rng = np.random.default_rng(seed)
    case = {"qtype": qtype, "types": {"gate": qtype, "up": qtype, "down": down_qtype or qtype}}
    for p in PROJ:
        e, out, inp = shape_of(p)
        w = (rng.standard_normal((e, out, inp)) / np.sqrt(inp)).astype(np.float32)
        case[p] = ggml_quantize.quantize(w, case["types"][p])
        case[p + ".lora_a"] = (rng.standard_normal((E, R, inp)) / np.sqrt(inp)).astype(np.float32)
        case[p + ".lora_b"] = (rng.standard_normal((E, out, R)) / np.sqrt(R)).astype(np.float32)
    case["x"] = rng.standard_normal((T, H)).astype(np.float32)
    case["dy"] = rng.standard_normal((T, H)).astype(np.float32)
    case["ids"] = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    case["weights"] = rng.uniform(0.1, 1.0, (T, K)).astype(np.float32)
    return case


def write_case(case, path):
    writer = GGUFWriter(str(path), "tandem-test")
    writer.add_float32("test.lora_scale", SCALE)
    for p in PROJ:
        writer.add_tensor(p, case[p], raw_dtype=case["types"][p])  # byte shape [E, out, row bytes]
    for name, value in case.items():
        if name not in PROJ and name not in ("qtype", "types"):
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run_tool(case, tmp_path, fmt="blocks", backend="auto", act="f32"):
    src, out = tmp_path / "in.gguf", tmp_path / "out.gguf"
    write_case(case, src)
    result = subprocess.run([tool(), str(src), str(out), fmt, backend, act], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    reader = GGUFReader(str(out))
    got = {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}
    for key in ("weight_format", "backend"):
        field = reader.fields["test." + key]
        got[key] = bytes(field.parts[field.data[0]]).decode()
    return got


ROUNDING_BACKENDS = ("amx_blocks", "avx512_bf16_blocks")  # multiply bf16-rounded weights (and bf16 / q8 activations)


def tolerance(got, act="f32"):
    """1e-3 (bf16 activations 2e-2); amx_blocks and avx512_bf16_blocks, named explicitly, multiply bf16 tiles of
    the decoded weights, so their weights are rounded to bf16 as well: 2e-2 there too. "auto" with f32
    activations never picks those (test_auto_keeps_fp32_exact_kernels_for_f32_activations)."""
    return 2e-2 if act == "bf16" or got["backend"] in ROUNDING_BACKENDS else 1e-3


def bf16_round(a):
    return torch.from_numpy(a).to(torch.bfloat16).to(torch.float32).numpy()


def reference(case, weights, act="f32"):
    """fp32 torch autograd of the expert layer on `weights` (name -> [E, out, in] f32)."""
    x_np, dy_np = case["x"], case["dy"]
    if act == "bf16":
        x_np, dy_np = bf16_round(x_np), bf16_round(dy_np)
    x = torch.tensor(x_np, requires_grad=True)
    tw = torch.tensor(case["weights"], requires_grad=True)
    lora = {n: torch.tensor(case[n], requires_grad=True) for p in PROJ for n in (p + ".lora_a", p + ".lora_b")}
    w = {p: torch.tensor(weights[p]) for p in PROJ}

    def proj(p, e, v):
        return v @ w[p][e].T + SCALE * (v @ lora[p + ".lora_a"][e].T) @ lora[p + ".lora_b"][e].T

    rows = []
    for t in range(T):
        y_t = torch.zeros(H)
        for j in range(K):
            e = int(case["ids"][t, j])
            h = torch.nn.functional.silu(proj("gate", e, x[t])) * proj("up", e, x[t])
            y_t = y_t + tw[t, j] * proj("down", e, h)
        rows.append(y_t)
    y = torch.stack(rows)
    (y * torch.tensor(dy_np)).sum().backward()
    ref = {"y": y.detach().numpy(), "dx": x.grad.numpy(), "dw": tw.grad.numpy()}
    for p in PROJ:
        ref[p + ".grad_a"] = lora[p + ".lora_a"].grad.numpy()
        ref[p + ".grad_b"] = lora[p + ".lora_b"].grad.numpy()
    return ref


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def gguf_weights(case):
    return {p: dequantize(case[p], case["types"][p]).reshape(shape_of(p)).astype(np.float32) for p in PROJ}


def assert_parity(got, ref, tol):
    for name, want in ref.items():
        err = rel_l2(got[name], want)
        assert err <= tol, f"{name}: relative L2 {err:.3g} > {tol}"


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_blocks_decode_bit_for_bit_and_the_layer_matches_fp32(qtype, tmp_path):
    case = make_case(qtype)
    weights = gguf_weights(case)
    got = run_tool(case, tmp_path)
    assert got["weight_format"] == qtype.name.lower()
    for p in PROJ:
        assert np.array_equal(got[p + ".dequant"].reshape(shape_of(p)), weights[p]), \
            f"{p}: the engine's decoder differs from gguf.quants.dequantize"
    assert_parity(got, reference(case, weights), tolerance(got))


def test_projections_in_different_block_types_as_q4_k_m_stores_them(tmp_path):
    case = make_case(Q.Q4_K, seed=5, down_qtype=Q.Q6_K)
    weights = gguf_weights(case)
    got = run_tool(case, tmp_path)
    assert np.array_equal(got["down.dequant"].reshape(shape_of("down")), weights["down"])
    assert_parity(got, reference(case, weights), tolerance(got))


@pytest.mark.parametrize("backend", ["generic", "avx2"])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=["Q4_K", "Q6_K"])
def test_other_backends_and_bf16_activations(qtype, backend, tmp_path):
    case = make_case(qtype, seed=1)
    weights = gguf_weights(case)
    assert_parity(run_tool(case, tmp_path, backend=backend), reference(case, weights), 1e-3)
    assert_parity(run_tool(case, tmp_path, backend=backend, act="bf16"), reference(case, weights, "bf16"), 2e-2)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=["Q4_K", "Q6_K"])
def test_auto_keeps_fp32_exact_kernels_for_f32_activations(qtype, tmp_path):
    """auto on f32 activations: an fp32 backend (avx512 / avx2 / generic) and 1e-3 parity, on every CPU; on bf16
    activations auto may take the bf16 block kernels (2e-2): with ~6 rows per expert, their few-row int8 forward
    (Q4_K by vpdpbusd, Q6_K by vpmaddubsw) on AVX-512 machines."""
    case = make_case(qtype, seed=4)
    weights = gguf_weights(case)
    got = run_tool(case, tmp_path)
    assert got["backend"] in ("avx512", "avx2", "generic"), got["backend"]
    assert_parity(got, reference(case, weights), 1e-3)
    got = run_tool(case, tmp_path, act="bf16")
    assert_parity(got, reference(case, weights, "bf16"), 2e-2)


# Byte offsets of a scale inside one block: Q4_K's 6-bit scales/mins start at byte 4, Q6_K's int8 scales at
# 192, Q8_0's f16 d at 0, IQ4_XS's scales_l at 4.
SCALE_BYTE = {Q.Q4_K: 4, Q.Q5_K: 8, Q.Q6_K: 195, Q.Q8_0: 1, Q.IQ4_XS: 4}


@pytest.mark.parametrize("qtype", list(SCALE_BYTE), ids=[t.name for t in SCALE_BYTE])
def test_a_wrong_scale_breaks_parity(qtype, tmp_path):
    case = make_case(qtype, seed=2)
    ref = reference(case, gguf_weights(case))
    tampered = dict(case)
    gate = case["gate"].copy()
    # the same scale of the first block of every row of expert ids[0, 0]'s gate_proj
    gate[int(case["ids"][0, 0]), :, SCALE_BYTE[qtype]] ^= 0x1F
    tampered["gate"] = gate
    got = run_tool(tampered, tmp_path)
    assert rel_l2(got["y"], ref["y"]) > 1e-3, "a scale byte changed and the output did not"


@pytest.mark.parametrize("spec", ["int4", "int4:g64:asym", "int4:g128"])
def test_int4_quantised_at_load_from_blocks(spec, tmp_path):
    case = make_case(Q.Q8_0, seed=3)
    got = run_tool(case, tmp_path, fmt=spec)
    assert got["weight_format"] == "int4"
    # The layer computes on int4 tables made from the Q8_0 weights: near the Q8_0 reference, not equal.
    err = rel_l2(got["y"], reference(case, gguf_weights(case))["y"])
    assert 1e-4 < err < 0.2, err


def test_a_short_table_is_refused(tmp_path):
    case = make_case(Q.Q4_K, seed=4)
    case["down"] = case["down"][:, :-1, :]  # one row of blocks short for the [E, H, I] shape
    src, out = tmp_path / "in.gguf", tmp_path / "out.gguf"
    writer = GGUFWriter(str(src), "tandem-test")
    writer.add_float32("test.lora_scale", SCALE)
    for p in PROJ:
        writer.add_tensor(p, case[p], raw_dtype=Q.Q4_K)
    for name, value in case.items():
        if name not in PROJ and name not in ("qtype", "types"):
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = subprocess.run([tool(), str(src), str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "down_proj" in result.stderr and "needs" in result.stderr, result.stderr
