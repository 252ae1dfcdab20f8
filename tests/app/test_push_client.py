"""The pusher's HTTP client loads its transport before the push's clock starts.

httpx imports anyio's event-loop backend at the first request of an async client; in `hwtui push`
that was the first prepare request, inside the push's own timing and on its critical path (the
"prepared" step of a warm push measured 44-62 ms, 12-16 ms once loaded before). Run in a fresh
interpreter so what is imported is that process's alone.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import asyncio, http.server, json, sys, threading

class Answer(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "11")
        self.end_headers()
        self.wfile.write(b'{"ok":true}')

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
threading.Thread(target=server.serve_forever, daemon=True).start()

from hwtui.app.push.client import PushClient

async def main(load):
    client = PushClient(None, False)
    try:
        if load:
            before = set(sys.modules)
            await client.load_transport()
            loaded_by_it = sorted(set(sys.modules) - before)
        else:
            loaded_by_it = []
        before = set(sys.modules)
        status, doc = await client.post(f"http://127.0.0.1:{server.server_address[1]}/v1/push/prepare", {}, timeout=10)
        loaded_by_request = sorted(set(sys.modules) - before)
    finally:
        await client.aclose()
    print(json.dumps({"status": status, "doc": doc, "by_load": loaded_by_it, "by_request": loaded_by_request}))

asyncio.run(main(sys.argv[1] == "load"))
"""


def _first_request(how: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, how], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc: dict = json.loads(out.stdout.strip().splitlines()[-1])
    assert (doc["status"], doc["doc"]) == (200, {"ok": True}), doc
    return doc


def test_the_first_request_imports_nothing_once_the_transport_is_loaded():
    cold = _first_request("cold")
    backend = [m for m in cold["by_request"] if m.startswith("anyio._backends")]
    assert backend, f"an httpx that no longer loads anyio's backend at the first request: {cold['by_request']}"
    warm = _first_request("load")
    assert set(backend) <= set(warm["by_load"]), warm
    assert warm["by_request"] == [], "the first request still loaded modules inside the push's clock"
