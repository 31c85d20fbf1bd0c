"""The `tandem` command as a user runs it: --version, info (text and JSON)."""
import json
import os
import subprocess

import pytest

TANDEM = os.environ["TANDEM_BIN"]


def run(*args, env=None):
    return subprocess.run([TANDEM, *args], capture_output=True, text=True, timeout=120, env=env)


def proc_cpuinfo_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_version():
    r = run("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("tandem ")


def test_info_json_describes_this_machine():
    r = run("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    flags = proc_cpuinfo_flags()
    features = info["cpu"]["features"]
    for ours, kernel in [("avx2", "avx2"), ("avx512f", "avx512f"), ("avx512_bf16", "avx512_bf16"),
                         ("amx_tile", "amx_tile"), ("amx_bf16", "amx_bf16"), ("amx_int8", "amx_int8")]:
        assert features[ours] == (kernel in flags), ours
    assert info["cpu"]["logical_cpus"] == len(os.sched_getaffinity(0))
    nodes = info["numa"]["nodes"]
    assert nodes and sum(len(n["cpus"]) for n in nodes) == info["cpu"]["logical_cpus"]
    meminfo_kib = int(open("/proc/meminfo").readline().split()[1])
    assert abs(info["ram"]["total_bytes"] - meminfo_kib * 1024) < 16 << 20
    import torch
    assert info["torch"]["version"] == torch.__version__.split("+")[0]
    assert len(info["gpus"]) == torch.cuda.device_count() or not info["torch"]["tandem_built_with_cuda"]
    if not info["gpus"]:
        assert info["gpu_status"]
    if features["amx_tile"]:
        assert info["cpu"]["amx_status"]


def test_info_isa_cap_from_environment():
    env = dict(os.environ, TANDEM_CPU_ISA="avx2")
    info = json.loads(run("info", "--json", env=env).stdout)
    assert info["cpu"]["isa_cap"] == "avx2"
    assert not info["cpu"]["usable"]["avx512"]
    assert not info["cpu"]["usable"]["amx_bf16"]
    assert "TANDEM_CPU_ISA" in info["cpu"]["amx_status"]


def test_info_bad_isa_cap_is_a_clear_error():
    r = run("info", env=dict(os.environ, TANDEM_CPU_ISA="avx9000"))
    assert r.returncode == 1
    assert "TANDEM_CPU_ISA" in r.stderr and "avx512_bf16" in r.stderr


def test_info_text():
    r = run("info")
    assert r.returncode == 0, r.stderr
    for word in ("CPU", "AMX", "RAM", "NUMA", "libtorch"):
        assert word in r.stdout


def test_unknown_subcommand_fails():
    assert run("frobnicate").returncode != 0


def bench_experts(env=None):
    r = subprocess.run([TANDEM, "bench", "experts", "--quick", "--tokens", "64", "--routing", "uniform",
                        "--backends", "generic", "--dtypes", "bf16", "--repeats", "1"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_bench_experts_runs_on_a_cpu_without_avx512():
    """Capped at AVX2, as on an AMD Zen 3: oneDNN has no bf16 matmul there, so the ceiling is the
    avx2 kernel's own (the bench stopped at its ceilings before)."""
    if "avx2" not in proc_cpuinfo_flags():
        pytest.skip("this CPU has no AVX2")
    out = bench_experts(env=dict(os.environ, TANDEM_CPU_ISA="avx2"))
    assert out["ceilings"]["tandem_kernel"] == "avx2"
    assert out["ceilings"]["peak_tflops_bf16_onednn"] == 0
    assert out["ceilings"]["peak_tflops_bf16"] > 0
    [case] = out["cases"]
    assert case["backend"] == "generic" and case["fwd_ms"] > 0 and case["bwd_ms"] > 0
