"""`tandem doctor` as a user runs it: the JSON report, its statuses and the exit code."""
import json
import os
import shutil
import subprocess

TANDEM = os.environ["TANDEM_BIN"]
CHECK_IDS = ["cpu", "numa", "huge_pages", "gpu", "disk", "locale"]


def doctor(*args, env=None):
    r = subprocess.run([TANDEM, "doctor", *args], capture_output=True, text=True, timeout=120, env=env)
    return r, (json.loads(r.stdout) if "--json" in args else None)


def test_json_report_has_every_check(tmp_path):
    r, report = doctor("--json", "--output-dir", str(tmp_path))
    assert r.returncode in (0, 1), r.stderr
    assert [c["id"] for c in report["checks"]] == CHECK_IDS
    statuses = [c["status"] for c in report["checks"]]
    assert set(statuses) <= {"ok", "warn", "fail"}
    worst = "fail" if "fail" in statuses else "warn" if "warn" in statuses else "ok"
    assert report["status"] == worst
    assert r.returncode == (1 if worst == "fail" else 0)
    for check in report["checks"]:
        assert check["title"] and check["finding"], check
        assert (check["fix"] == "") == (check["status"] == "ok"), check
    assert report["tandem_version"]


def test_disk_figure_matches_shutil(tmp_path):
    _, report = doctor("--json", "--output-dir", str(tmp_path))
    disk = next(c for c in report["checks"] if c["id"] == "disk")
    usage = shutil.disk_usage(tmp_path)
    assert disk["figures"]["capacity_bytes"] == usage.total
    # Other processes write meanwhile: allow 256 MiB of drift.
    assert abs(disk["figures"]["available_bytes"] - usage.free) < 256 << 20
    assert str(tmp_path) in disk["finding"]
    assert report["output_dir"] == str(tmp_path)


def test_default_output_dir_is_the_data_dir(tmp_path):
    home = tmp_path / "home"
    _, report = doctor("--json", env=dict(os.environ, TANDEM_HOME=str(home)))
    assert report["output_dir"] == str(home)
    disk = next(c for c in report["checks"] if c["id"] == "disk")
    assert disk["figures"]["capacity_bytes"] == shutil.disk_usage(tmp_path).total


def test_c_locale_is_a_warning_with_a_fix(tmp_path):
    env = dict(os.environ, LC_ALL="C")
    _, report = doctor("--json", "--output-dir", str(tmp_path), env=env)
    locale = next(c for c in report["checks"] if c["id"] == "locale")
    assert locale["status"] == "warn"
    assert "UTF-8" in locale["fix"]
    env["LC_ALL"] = "C.UTF-8"
    _, report = doctor("--json", "--output-dir", str(tmp_path), env=env)
    assert next(c for c in report["checks"] if c["id"] == "locale")["status"] == "ok"


def test_gpu_check_never_crashes_without_a_driver(tmp_path):
    _, report = doctor("--json", "--output-dir", str(tmp_path))
    gpu = next(c for c in report["checks"] if c["id"] == "gpu")
    assert gpu["status"] != "fail"
    if not os.path.exists("/proc/driver/nvidia/version"):
        assert "no NVIDIA driver: training runs on the CPU" in gpu["finding"]
        assert gpu["figures"]["gpu_count"] == 0


def test_huge_pages_match_proc(tmp_path):
    _, report = doctor("--json", "--output-dir", str(tmp_path))
    huge = next(c for c in report["checks"] if c["id"] == "huge_pages")
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    assert huge["figures"]["pages_total"] == int(meminfo["HugePages_Total"])
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if os.path.exists(thp):
        mode = open(thp).read().split("[")[1].split("]")[0]
        assert mode in huge["finding"]


def test_table_and_failing_disk_exit_code(tmp_path):
    r, _ = doctor("--output-dir", str(tmp_path))
    assert r.returncode in (0, 1), r.stderr
    for title in ["CPU features", "NUMA nodes and RAM", "Huge pages", "GPU driver and CUDA",
                  "Free disk in the output directory", "Locale"]:
        assert title in r.stdout
    # A tiny tmpfs would make the disk check fail; a path under /proc has no free space at all.
    r, report = doctor("--json", "--output-dir", "/proc/tandem-doctor")
    assert next(c for c in report["checks"] if c["id"] == "disk")["status"] == "fail"
    assert report["status"] == "fail"
    assert r.returncode == 1
