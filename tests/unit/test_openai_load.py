"""benchmarks/openai_load.py: percentiles and the SSE reader, against a local HTTP server that streams
OpenAI-style completion chunks (the benchmark's own parsing; the real servers are run by bench_dynamo.py)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import openai_load  # noqa: E402


def test_percentile_is_nearest_rank():
    xs = list(range(1, 101))
    assert openai_load.percentile(xs, 50) == 50 and openai_load.percentile(xs, 99) == 99
    assert openai_load.percentile([7.0], 99) == 7.0


class _Chunks(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(body["max_tokens"]):
            time.sleep(0.01)
            chunk = {"choices": [{"index": 0, "text": f"t{i}"}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": body["max_tokens"]}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args):
        pass


@pytest.fixture()
def port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chunks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_stream_one_and_run_level_read_chunks_and_usage(port):
    r = openai_load.stream_one(port, "m", "hi", 4)
    assert r["tokens"] == 4 and r["chunks"] == 4 and len(r["gaps"]) == 3 and r["prompt_tokens"] == 5
    assert r["ttft"] >= 0.009 and all(g >= 0.005 for g in r["gaps"])
    row = openai_load.run_level(port, "m", ["a", "b", "c"], 3, 2)
    assert row["requests"] == 3 and row["chunks_per_token"] == 1.0 and row["itl_p50_ms"] >= 5
