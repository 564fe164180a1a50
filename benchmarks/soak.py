"""Soak test (`make soak`): mixed load against a real tritonserver for N minutes, then a report of requests
served, errors by kind and the RSS drift of every Python stub process.

The mix (each worker picks at random, seeded): greedy text through the ensemble and the BLS (output checked
against a reference taken at start), token ids to tensorrt_llm, streams cancelled part-way, bad requests
(must be refused), and classical inference, against its own server on free ports.
Exit code 1 when a good request failed or returned a different output, or a bad one was accepted.

    python benchmarks/soak.py --minutes 10 --workers 6
"""
from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "backends"), str(ROOT / "tests" / "integration")]

from robustness_helpers import (descendants, cmdline, ids_of, ids_tensors, rss_kib, stream_request,  # noqa: E402
                                text_of, text_tensors, unary_request, wait_idle)

PROMPT_IDS = list(range(10, 40))


def stub_rss(server_pid: int) -> dict[str, int]:
    out = {}
    for pid in descendants(server_pid):
        cmd = cmdline(pid)
        if "triton_python_backend_stub" in cmd:
            out[cmd.split()[1].split("/")[-3]] = rss_kib(pid)
    return out


class Soak:
    def __init__(self, grpc_url: str, seed: int):
        self.url, self.seed = grpc_url, seed
        self.counts: collections.Counter = collections.Counter()
        self.errors: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self.ref_text = text_of(stream_request(grpc_url, "ensemble", text_tensors("Once upon a time", 32))[0])
        self.ref_ids = ids_of(stream_request(grpc_url, "tensorrt_llm", ids_tensors(PROMPT_IDS, 32))[0])

    def _count(self, kind: str, error: str | None = None) -> None:
        with self.lock:
            self.counts[kind] += 1
            if error:
                self.errors[f"{kind}: {error[:90]}"] += 1

    def one(self, rng: random.Random) -> None:
        kind = rng.choice(["ensemble", "bls", "ids", "cancel", "bad", "classical"])
        try:
            if kind in ("ensemble", "bls"):
                model = "ensemble" if kind == "ensemble" else "tensorrt_llm_bls"
                chunks, err = stream_request(self.url, model, text_tensors("Once upon a time", 32), timeout=120)
                bad = str(err) if err else (None if text_of(chunks) == self.ref_text else "wrong text")
            elif kind == "ids":
                chunks, err = stream_request(self.url, "tensorrt_llm", ids_tensors(PROMPT_IDS, 32), timeout=120)
                bad = str(err) if err else (None if ids_of(chunks) == self.ref_ids else "wrong ids")
            elif kind == "cancel":
                from robustness_helpers import grpc_inputs
                import tritonclient.grpc as grpcclient
                client = grpcclient.InferenceServerClient(self.url)
                client.start_stream(callback=lambda result, error: None)
                client.async_stream_infer("tensorrt_llm", grpc_inputs(ids_tensors(PROMPT_IDS, 500, stream=True)))
                time.sleep(rng.uniform(0, 0.5))
                client.stop_stream(cancel_requests=True)
                client.close()
                bad = None
            elif kind == "bad":
                _, err = stream_request(self.url, "tensorrt_llm", ids_tensors([5, 10 ** 6], 4), timeout=60)
                bad = None if err is not None and "input_ids" in str(err) else f"bad input accepted/unclear: {err}"
            else:
                model, width = rng.choice([("tabular_rf", 16), ("tabular_hgb", 30)])
                _, err = unary_request(self.url, model, {"input": np.zeros((4, width), np.float32)})
                bad = str(err) if err else None
        except Exception as e:  # a hang (queue.Empty) or a transport error is a failure of its own kind
            bad = f"{type(e).__name__}: {e}"
        self._count(kind, bad)

    def run(self, minutes: float, workers: int) -> None:
        deadline = time.monotonic() + minutes * 60

        def loop(w: int) -> None:
            rng = random.Random(self.seed * 1000 + w)
            while time.monotonic() < deadline:
                self.one(rng)

        threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "build" / "soak" / "report.json"))
    args = ap.parse_args(argv)

    from tritonllm.serving.launcher import TritonServer, find_free_ports
    http, grpc, metrics = find_free_ports(3)
    server = TritonServer(http, grpc, metrics, log_path=ROOT / "build" / "logs" / f"soak-{http}.log")
    server.start(timeout=300)
    try:
        soak = Soak(server.grpc_url, args.seed)
        rss0 = stub_rss(server.process.pid)
        t0 = time.monotonic()
        soak.run(args.minutes, args.workers)
        elapsed = time.monotonic() - t0
        idle = wait_idle(server.metrics_url, timeout=60, required=False)  # the report says what was left
        rss1 = stub_rss(server.process.pid)
    finally:
        code = server.stop()
    report = {
        "minutes": round(elapsed / 60, 2), "workers": args.workers,
        "requests": dict(soak.counts), "total": sum(soak.counts.values()),
        "errors": dict(soak.errors), "error_total": sum(soak.errors.values()),
        "rss_kib_start": rss0, "rss_kib_end": rss1,
        "rss_drift_kib": {k: rss1.get(k, 0) - v for k, v in rss0.items()},
        "stubs_lost": sorted(set(rss0) - set(rss1)),
        "kv_usage_after": idle.get("llm_kv_cache_usage_ratio"), "running_after": idle.get("llm_requests_running"),
        "server_exit_code": code,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    ok = (not report["errors"] and not report["stubs_lost"] and report["kv_usage_after"] == 0.0
          and report["running_after"] == 0)
    print(f"soak: {'OK' if ok else 'FAILED'} ({report['total']} requests, {report['error_total']} errors) "
          f"-> {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
