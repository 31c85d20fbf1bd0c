"""`tandem download` against a local server that answers as the Hugging Face Hub does
(fake_hub.py): the revision API with blob ids and LFS sha256, /resolve/ URLs redirecting to a CDN
on another port, range requests, connections cut in the middle of a file."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_hub import COMMIT, TOKEN, FakeHub  # noqa: E402

TANDEM = os.environ["TANDEM_BIN"]


@pytest.fixture
def hub():
    h = FakeHub()
    yield h
    h.close()


def download(hub, tmp_path, *args, token=None):
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{hub.api.server_port}/",
           "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([TANDEM, "download", *args], capture_output=True, text=True, timeout=120, env=env)


def snapshot(tmp_path, repo="acme/tiny-moe"):
    owner, name = repo.split("/")
    return tmp_path / "hf" / "hub" / f"models--{owner}--{name}" / "snapshots" / COMMIT


def test_a_cut_transfer_is_resumed_with_a_range_request_and_every_file_checked(hub, tmp_path):
    hub.cut["model.safetensors"] = [1_000_000, 1]
    r = download(hub, tmp_path, "acme/tiny-moe")
    assert r.returncode == 0, r.stderr
    assert "3 file(s), 4.00 MiB" in r.stdout, r.stdout  # the size, said before the transfer
    for name, data in hub.files.items():
        assert (snapshot(tmp_path) / name).read_bytes() == data, name
    assert not list(snapshot(tmp_path).rglob("*.incomplete"))
    assert (tmp_path / "hf" / "hub" / "models--acme--tiny-moe" / "refs" / "main").read_text() == COMMIT
    ranges = [rng for server, name, rng, _ in hub.log if server == "cdn" and name == "model.safetensors"]
    assert ranges[0] is None and ranges[1] == "bytes=1000000-", ranges
    assert "resuming from byte 1000000" in r.stderr
    # Everything there: a second run fetches nothing.
    hub.log.clear()
    again = download(hub, tmp_path, "acme/tiny-moe")
    assert again.returncode == 0 and "3 already there" in again.stdout, again.stdout
    assert not [entry for entry in hub.log if entry[0] == "cdn"]


def test_a_failed_run_keeps_what_arrived_and_the_next_run_resumes_there(hub, tmp_path):
    hub.cut["gguf/model-Q4_K_M.gguf"] = [400_000, 100]  # every attempt stops there
    first = download(hub, tmp_path, "acme/tiny-moe", "--include", "*.gguf")
    assert first.returncode == 1
    assert "run the same command again: it resumes there" in first.stderr, first.stderr
    partial = snapshot(tmp_path) / "gguf" / "model-Q4_K_M.gguf.incomplete"
    assert partial.stat().st_size == 400_000
    del hub.cut["gguf/model-Q4_K_M.gguf"]
    hub.log.clear()
    second = download(hub, tmp_path, "acme/tiny-moe", "--include", "*.gguf")
    assert second.returncode == 0, second.stderr
    assert (snapshot(tmp_path) / "gguf" / "model-Q4_K_M.gguf").read_bytes() == hub.files["gguf/model-Q4_K_M.gguf"]
    assert [rng for server, _, rng, _ in hub.log if server == "cdn"] == ["bytes=400000-"]
    assert not (snapshot(tmp_path) / "config.json").exists()  # --include left it out


def test_a_file_whose_checksum_differs_is_refused_and_removed(hub, tmp_path):
    hub.corrupt.add("model.safetensors")
    r = download(hub, tmp_path, "acme/tiny-moe", "--include", "model.safetensors")
    assert r.returncode == 1
    assert "does not match the Hub's checksum" in r.stderr, r.stderr
    assert not (snapshot(tmp_path) / "model.safetensors").exists()
    assert not (snapshot(tmp_path) / "model.safetensors.incomplete").exists()


def test_a_gated_repo_needs_a_token_which_the_cdn_never_sees(hub, tmp_path):
    hub.gated.add("acme/tiny-moe")
    r = download(hub, tmp_path, "acme/tiny-moe", "--include", "config.json")
    assert r.returncode == 1 and "gated or private" in r.stderr and "--save-token" in r.stderr, r.stderr
    saved = subprocess.run([TANDEM, "download", "--save-token"], input=TOKEN + "\n", capture_output=True,
                           text=True, timeout=60, env={**os.environ, "HF_HOME": str(tmp_path / "hf")})
    assert saved.returncode == 0, saved.stderr
    token_file = tmp_path / "hf" / "token"
    assert token_file.read_text() == TOKEN and (token_file.stat().st_mode & 0o777) == 0o600
    ok = download(hub, tmp_path, "acme/tiny-moe")
    assert ok.returncode == 0, ok.stderr
    assert all(auth == f"Bearer {TOKEN}" for server, _, _, auth in hub.log if server == "api" and auth)
    assert all(auth is None for server, _, _, auth in hub.log if server == "cdn")


def test_bad_repo_ids_and_missing_repos_say_what_to_do(hub, tmp_path):
    r = download(hub, tmp_path, "../../etc")
    assert r.returncode == 1 and "not a Hugging Face repo id" in r.stderr
    r = download(hub, tmp_path, "acme/tiny-moe", "--include", "*.bin")
    assert r.returncode == 1 and "no file of acme/tiny-moe matches --include" in r.stderr
    r = download(hub, tmp_path, "acme/tiny-moe", "--dry-run")
    assert r.returncode == 0 and "gguf/model-Q4_K_M.gguf" in r.stdout
    assert not snapshot(tmp_path).exists() or not any(snapshot(tmp_path).iterdir())
