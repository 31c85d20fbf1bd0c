"""Hostile input against a real `tandem serve` with no API key (the default), on test_serve.py's small random
Qwen3-MoE: every rule of docs/serve.md's "Security" section, and a bounded storm (nested bodies, slow headers,
a 300 MiB request line, 200 MiB of headers, hundreds of idle and short connections) during which the server
still answers /health and a real chat completion within a second each, and after which its resident memory
returns to within RSS_TOLERANCE of what it was before."""

import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

from test_serve import fixture_dirs  # noqa: F401 (a fixture: the model and adapter dirs)

TANDEM = os.environ["TANDEM_BIN"]
NESTED = "[" * 100_000 + "]" * 100_000  # 200 KB
RSS_TOLERANCE_MIB = 64  # glibc keeps some freed memory in per-thread arenas; a leak of the storm's bytes is GBs


def start(fixture_dirs, log_path, *args, env=None):  # noqa: F811
    """`tandem serve` on a free port; returns (process, port) once it listens."""
    log = open(log_path, "w")
    proc = subprocess.Popen([TANDEM, "serve", "--model", str(fixture_dirs["model"]), "--template", "qwen3_nothink",
                             "--dtype", "fp32", "--port", "0", "--queue", "8", "--threads", "2", *args],
                            stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = re.search(r"listening on http://[^:]+:(\d+)/v1", line)
        if match:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, int(match.group(1))
    proc.kill()
    raise AssertionError("tandem serve did not start: " + open(log_path).read()[-3000:])


@pytest.fixture(scope="module")
def server(fixture_dirs, tmp_path_factory):  # noqa: F811
    log_path = tmp_path_factory.mktemp("hostile") / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    proc, port = start(fixture_dirs, log_path, env=env)
    yield {"proc": proc, "port": port, "log": log_path}
    proc.kill()
    proc.wait()
    assert proc.returncode == -9, "the server died before the end: " + log_path.read_text()[-3000:]


def request(port, path, body=None, headers=None, timeout=10.0, method=None):
    """(status, parsed JSON body) of one request; headers default to a JSON POST with no key."""
    data = body.encode() if isinstance(body, str) else body
    all_headers = {"Content-Type": "application/json"} if data is not None else {}
    all_headers.update(headers or {})
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=all_headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat_body(max_tokens=4, **extra):
    return json.dumps({"model": "base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
                       "temperature": 0, **extra})


def assert_answers_within_a_second(port):
    status, body = request(port, "/health", timeout=1.0)
    assert status == 200 and body == {"status": "ok"}
    status, body = request(port, "/v1/chat/completions", chat_body(), timeout=1.0)
    assert status == 200 and body["choices"][0]["finish_reason"] in ("length", "stop")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) / 1024


def raw_status(port, data):
    """Sends raw bytes on a new connection; the status code of the answer, or None when it was closed unanswered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        answer = s.recv(64)
    return int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else None


def test_nested_bodies_get_400_and_the_server_lives(server):
    head = '{"model": "base", "messages": [{"role": "user", "content": "hi"}], '
    for body in (head + '"response_format": {"type": ' + NESTED + "}}",
                 head + '"response_format": ' + NESTED + "}",
                 head + '"max_tokens": ' + NESTED + ', "max_completion_tokens": ' + NESTED + "}"):
        status, answer = request(server["port"], "/v1/chat/completions", body)
        assert status == 400 and answer["error"]["code"] == "invalid_json"
        assert len(answer["error"]["message"]) < 400
    # What a web page may send without asking (a "simple" cross-site request): refused before its body is read.
    status, answer = request(server["port"], "/v1/chat/completions", NESTED,
                             headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert status == 403 and answer["error"]["code"] == "cross_origin_refused"
    status, answer = request(server["port"], "/v1/chat/completions", NESTED, headers={"Content-Type": "text/plain"})
    assert status == 415 and answer["error"]["code"] == "unsupported_media_type"
    assert_answers_within_a_second(server["port"])


def test_host_origin_and_content_type_rules(server):
    port = server["port"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        assert request(port, "/health", headers={"Host": host})[0] == 200
    status, answer = request(port, "/health", headers={"Host": f"attacker.example:{port}"})
    assert status == 421 and answer["error"]["code"] == "invalid_host"
    assert request(port, "/health", headers={"Host": "127.0.0.1"})[0] == 421  # not this port
    assert request(port, "/v1/chat/completions", chat_body(), headers={"Origin": f"http://127.0.0.1:{port}"})[0] == 200
    assert request(port, "/v1/models", headers={"Origin": "https://evil.example"})[0] == 403
    assert request(port, "/v1/chat/completions", chat_body(), headers={"Content-Type": "application/x-www-form-urlencoded"})[0] == 415
    assert raw_status(port, b"GET /health HTTP/1.1\r\nHost: evil.example\r\n\r\n") == 421


def test_a_plain_client_that_leaves_cancels_its_generation(server):
    # Greedy on this model runs to max_tokens without an eos: seconds of generation for nobody.
    body = chat_body(max_tokens=2048).encode()
    with socket.create_connection(("127.0.0.1", server["port"])) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (server["port"], len(body)) + body)
        time.sleep(0.5)  # let it start generating, then leave without reading
    deadline = time.time() + 30
    while "cancelled" not in server["log"].read_text() and time.time() < deadline:
        time.sleep(0.1)
    assert re.search(r"chat \S+ model=base: \d+ prompt \+ \d+ completion tokens, cancelled", server["log"].read_text())
    assert_answers_within_a_second(server["port"])


def storm(port, stop, counts):
    """Runs the hostile clients until `stop` is set; counts what each did."""
    def slow_headers():  # 40 sockets trickling a header a byte per second, reopened when the server cuts them
        socks = []
        while not stop.is_set():
            while len(socks) < 40:
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
                socks.append(s)
            for s in list(socks):
                try:
                    s.send(b"a")
                except OSError:
                    counts["slow_cut"] += 1
                    socks.remove(s)
                    s.close()
            stop.wait(1.0)
        for s in socks:
            s.close()

    def flood(head, chunk, total):  # one connection sending `total` bytes without a line end where it matters
        with socket.create_connection(("127.0.0.1", port)) as s:
            sent = 0
            try:
                s.sendall(head)
                while sent < total and not stop.is_set():
                    s.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                counts["flood_cut"] += 1

    def idle_and_short():  # 300 idle sockets held open, and connections opened and closed at once
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
        while not stop.is_set():
            for _ in range(50):
                socket.create_connection(("127.0.0.1", port)).close()
                counts["short"] += 1
            stop.wait(0.2)
        for s in idle:  # by now (> 5 s idle) the server has closed each: reading gives EOF at once
            s.settimeout(5)
            try:
                counts["idle_closed"] += s.recv(1) == b""
            except OSError:
                counts["idle_closed"] += 1
            s.close()

    def nested():
        while not stop.is_set():
            status, _ = request(port, "/v1/chat/completions", '{"model": "base", "max_tokens": ' + NESTED + "}")
            counts["nested" if status == 400 else "nested_not_400"] += 1

    header = b"X-Big: " + b"b" * 1000 + b"\r\n"
    workers = [threading.Thread(target=slow_headers), threading.Thread(target=idle_and_short),
               threading.Thread(target=nested),
               threading.Thread(target=flood, args=(b"GET /", b"a" * (1 << 20), 300 << 20)),
               threading.Thread(target=flood, args=(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode(),
                                                    header * 1000, 200 << 20))]
    for w in workers:
        w.start()
    return workers


def test_a_storm_does_not_stall_or_bloat_the_server(server):
    port, pid = server["port"], server["proc"].pid
    for _ in range(3):  # warm: the model's first answers allocate what later ones reuse
        assert_answers_within_a_second(port)
    baseline = rss_mib(pid)
    stop, counts = threading.Event(), {"slow_cut": 0, "flood_cut": 0, "short": 0, "nested": 0, "nested_not_400": 0,
                                        "idle_closed": 0}
    workers = storm(port, stop, counts)
    try:
        started = time.time()
        while time.time() - started < 15:  # past the 10 s read deadline and the 5 s idle timeout
            time.sleep(1.0)
            assert_answers_within_a_second(port)
        peak = rss_mib(pid)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=30)
    assert counts["slow_cut"] >= 40, counts  # every slow client was cut off at the read deadline
    assert counts["flood_cut"] == 2, counts  # the long line and the header flood were refused, not read
    assert counts["nested"] > 0 and counts["nested_not_400"] == 0 and counts["short"] > 0, counts
    assert counts["idle_closed"] == 300, counts  # idle connections are closed after 5 s
    assert_answers_within_a_second(port)
    deadline = time.time() + 15
    while rss_mib(pid) > baseline + RSS_TOLERANCE_MIB and time.time() < deadline:
        time.sleep(0.5)
    after = rss_mib(pid)
    print(f"VmRSS: {baseline:.0f} MiB before, {peak:.0f} MiB during, {after:.0f} MiB after the storm")
    assert after <= baseline + RSS_TOLERANCE_MIB, (baseline, peak, after)


def test_the_key_comes_from_a_file_or_the_environment_never_the_command_line(fixture_dirs, tmp_path):  # noqa: F811
    key_file = tmp_path / "key"
    key_file.write_text("file-key-123\n")
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    proc, port = start(fixture_dirs, tmp_path / "a.log", "--api-key-file", str(key_file), env=env)
    try:
        assert request(port, "/v1/models")[0] == 401
        assert request(port, "/v1/models", headers={"Authorization": "Bearer file-key-123"})[0] == 200
        assert request(port, "/health")[0] == 200
        assert b"file-key-123" not in open(f"/proc/{proc.pid}/cmdline", "rb").read()
    finally:
        proc.kill()
        proc.wait()
    proc, port = start(fixture_dirs, tmp_path / "b.log", env=dict(env, TANDEM_API_KEY="env-key-456"))
    try:
        assert request(port, "/v1/models")[0] == 401
        assert request(port, "/v1/models", headers={"Authorization": "Bearer env-key-456"})[0] == 200
    finally:
        proc.kill()
        proc.wait()


def test_a_keyless_server_on_a_public_address_warns(fixture_dirs, tmp_path):  # noqa: F811
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    proc, _ = start(fixture_dirs, tmp_path / "c.log", "--host", "0.0.0.0", env=env)
    proc.kill()
    proc.wait()
    assert "warning: listening on 0.0.0.0 without an API key" in (tmp_path / "c.log").read_text()
    proc, _ = start(fixture_dirs, tmp_path / "d.log", env=env)
    proc.kill()
    proc.wait()
    assert "warning" not in (tmp_path / "d.log").read_text()


def test_key_options_that_cannot_both_hold_are_refused_before_loading(fixture_dirs, tmp_path):  # noqa: F811
    key_file = tmp_path / "key"
    key_file.write_text("k\n")
    serve = [TANDEM, "serve", "--model", str(fixture_dirs["model"]), "--port", "0"]
    both = subprocess.run(serve + ["--api-key-file", str(key_file), "--api-key", "k"], capture_output=True,
                          text=True, timeout=60)
    assert both.returncode != 0 and "both --api-key and --api-key-file" in both.stderr
    key_file.write_text("k" * 5000)
    big = subprocess.run(serve + ["--api-key-file", str(key_file)], capture_output=True, text=True, timeout=60)
    assert big.returncode != 0 and "larger than 4 KiB" in big.stderr
    key_file.write_text("  \n")
    empty = subprocess.run(serve + ["--api-key-file", str(key_file)], capture_output=True, text=True, timeout=60)
    assert empty.returncode != 0 and "holds no key" in empty.stderr
