#!/usr/bin/env python3
"""Baseline for benchmarks/classical_bench.py: a plain Python HTTP server calling scikit-learn per request.

Speaks the subset of the KServe v2 HTTP/JSON protocol the benchmark uses (POST
/v2/models/<model>/infer with JSON `data`; GET /v2/health/ready), so the same client drives it and
Triton. The model is retrained in-process by build_classical's own trainer (same seed, same
model): nothing is unpickled. Each request runs `predict_proba` and takes the argmax over
`classes_`, which is exactly what `predict` does, so label + probabilities cost one model call.

Usage: python benchmarks/sklearn_server.py --port PORT [--model tabular_rf]
ThreadingHTTPServer: one thread per connection, so concurrent clients contend on the GIL exactly
as a naive Flask-style deployment would.
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build_scripts"))


def _descriptions(name: str, model) -> tuple[dict, dict]:
    """KServe v2 model metadata and a Triton-style config, enough for perf_analyzer to drive us."""
    n_feat, n_cls = int(model.n_features_in_), len(model.classes_)
    metadata = {
        "name": name, "versions": ["1"], "platform": "sklearn",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, n_feat]}],
        "outputs": [{"name": "label", "datatype": "INT64", "shape": [-1, 1]},
                    {"name": "probabilities", "datatype": "FP32", "shape": [-1, n_cls]}],
    }
    config = {
        "name": name, "platform": "sklearn", "backend": "", "max_batch_size": 64,
        "input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [n_feat]}],
        "output": [{"name": "label", "data_type": "TYPE_INT64", "dims": [1]},
                   {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [n_cls]}],
    }
    return metadata, config


def make_handler(name: str, model):
    classes = model.classes_
    metadata, config = _descriptions(name, model)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like Triton's HTTP endpoint
        # Headers and body go out as two writes; with Nagle on, the second waits for the client's
        # delayed ACK (~40 ms) and the baseline would measure TCP, not scikit-learn.
        disable_nagle_algorithm = True

        def log_message(self, *args):  # the default logs every request to stderr
            pass

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in ("/v2/health/ready", "/v2/health/live"):
                self._reply(200, {})
            elif self.path == "/v2":
                self._reply(200, {"name": "sklearn_http_baseline", "version": "0", "extensions": []})
            elif self.path in (f"/v2/models/{name}", f"/v2/models/{name}/versions/1"):
                self._reply(200, metadata)
            elif self.path in (f"/v2/models/{name}/config", f"/v2/models/{name}/versions/1/config"):
                self._reply(200, config)
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self):
            if self.path not in (f"/v2/models/{name}/infer", f"/v2/models/{name}/versions/1/infer"):
                self._reply(404, {"error": f"unknown model path {self.path}"})
                return
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            inp = req["inputs"][0]
            x = np.asarray(inp["data"], dtype=np.float32).reshape(inp["shape"])
            proba = model.predict_proba(x)
            label = classes[np.argmax(proba, axis=1)]
            self._reply(
                200,
                {
                    "model_name": name,
                    "outputs": [
                        {"name": "label", "datatype": "INT64", "shape": [len(x), 1], "data": label.tolist()},
                        {"name": "probabilities", "datatype": "FP32", "shape": list(proba.shape),
                         "data": proba.astype(np.float32).ravel().tolist()},
                    ],
                },
            )

    return Handler


class _Server(ThreadingHTTPServer):
    # The stdlib default backlog of 5 refuses connections from 16 concurrent clients.
    request_queue_size = 128
    daemon_threads = True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="tabular_rf", choices=["tabular_rf", "tabular_hgb"])
    args = p.parse_args()
    import build_classical

    model, _ = build_classical.train(args.model)
    server = _Server(("127.0.0.1", args.port), make_handler(args.model, model))
    print(f"sklearn server for {args.model} on port {args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
