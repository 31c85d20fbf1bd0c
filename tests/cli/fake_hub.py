"""A local server that answers as the Hugging Face Hub does, for `tandem download`'s tests and the
studio's download dialog test: the revision API with blob ids and LFS sha256, /resolve/ URLs
redirecting to a CDN on another port, range requests, connections cut in the middle of a file,
corrupted files and gated repos.

As a program (the studio test starts it): `python3 fake_hub.py [--cut PATH:BYTES:TIMES]` prints
"API_PORT CDN_PORT" and serves until stdin closes."""
import hashlib
import json
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_test_secret"


def blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """The API + resolve server and a CDN server on another port. `cut[path] = [n, times]`: the
    next `times` requests of that file get at most its first n bytes, then the connection closes;
    `corrupt` paths are served with their bytes changed."""

    def __init__(self):
        rng = random.Random(7)
        self.files = {
            "config.json": json.dumps({"model_type": "qwen3_moe"}).encode(),
            "model.safetensors": bytes(rng.getrandbits(8) for _ in range(3 << 20)),
            "gguf/model-Q4_K_M.gguf": bytes(rng.getrandbits(8) for _ in range(1 << 20)),
        }
        self.lfs = {"model.safetensors", "gguf/model-Q4_K_M.gguf"}
        self.gated = set()
        self.cut = {}
        self.corrupt = set()
        self.log = []  # (server, path, range header, authorization header)
        hub = self

        class Api(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.log.append(("api", self.path, self.headers.get("Range"), self.headers.get("Authorization")))
                parts = self.path.split("?")[0].strip("/").split("/")
                repo = "/".join(parts[2:4]) if parts[:2] == ["api", "models"] else "/".join(parts[0:2])
                if repo in hub.gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self.send_error(401)
                if parts[:2] == ["api", "models"] and parts[4:5] == ["revision"]:
                    siblings = []
                    for name, data in hub.files.items():
                        s = {"rfilename": name, "size": len(data), "blobId": blob_sha1(data)}
                        if name in hub.lfs:
                            s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                        "pointerSize": 134}
                        siblings.append(s)
                    body = json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    return self.wfile.write(body)
                if len(parts) >= 5 and parts[2] == "resolve" and parts[3] == COMMIT:
                    name = "/".join(parts[4:])
                    if name not in hub.files:
                        return self.send_error(404)
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{hub.cdn.server_port}/cdn/{name}?sig=x")
                    self.send_header("Content-Length", "0")
                    return self.end_headers()
                self.send_error(404)

        class Cdn(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.split("?")[0][len("/cdn/"):]
                hub.log.append(("cdn", name, self.headers.get("Range"), self.headers.get("Authorization")))
                data = hub.files[name]
                if name in hub.corrupt:
                    data = bytes(b ^ 0x55 for b in data[:16]) + data[16:]
                start = 0
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].split("=")[1].split("-")[0])
                    if start >= len(data):
                        return self.send_error(416)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                end = len(data)
                if hub.cut.get(name, [0, 0])[1] > 0:
                    hub.cut[name][1] -= 1
                    end = hub.cut[name][0]
                self.wfile.write(data[start:max(start, end)])
                if end < len(data):
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)

        self.api = ThreadingHTTPServer(("127.0.0.1", 0), Api)
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), Cdn)
        for server in (self.api, self.cdn):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self):
        self.api.shutdown()
        self.cdn.shutdown()


if __name__ == "__main__":
    hub = FakeHub()
    args = sys.argv[1:]
    while args:
        if args[0] == "--cut":
            path, size, times = args[1].rsplit(":", 2)
            hub.cut[path] = [int(size), int(times)]
            args = args[2:]
        else:
            sys.exit(f"unknown argument {args[0]}")
    print(hub.api.server_port, hub.cdn.server_port, flush=True)
    sys.stdin.read()
    hub.close()
