#!/usr/bin/env python3
"""Throughput of a classical model: Triton with dynamic batching vs without vs a plain sklearn server.

Three targets, one client, single-row KServe v2 HTTP/JSON requests, closed loop at concurrency 1..16.
The client is perf_analyzer when it runs (tritonclient's wheel; needs `apt-get install libb64-0d`
and `pip install nvidia-cuda-runtime-cu12`; random inputs, count windows), else a
Python load generator (threads with keep-alive connections, held-out rows as inputs):
- triton_batched   `tabular_rf` through our onnxruntime_cpu backend with dynamic_batching
- triton_unbatched the same ONNX file and backend, config without dynamic_batching
- sklearn_http     benchmarks/sklearn_server.py: ThreadingHTTPServer + predict_proba per request

Both Triton models live in one server started by tritonllm.serving.launcher over a generated
repository under build/bench/classical_repo (configs rendered by build_scripts/classical_configs).
Ports are free ports picked at run time. Prints req/s, p50/p99 latency and the ratios.

The load generator shares the machine's cores with the servers, so absolute numbers are a floor;
the ratios are the result (same client, same payload, same wire format for every target).

Usage: python benchmarks/classical_bench.py [--client auto|perf_analyzer|python] [--seconds 3]
       [--concurrency 1,2,4,8,16] [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import glob
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build_scripts"))

MODEL = "tabular_rf"


def make_repo(out: Path) -> Path:
    """Repository with MODEL (dynamic batching) and MODEL_nobatch (none) over the same model.onnx."""
    from classical_configs import cpu_config, render

    src = ROOT / "model_repository" / MODEL / "1" / "model.onnx"
    shutil.rmtree(out, ignore_errors=True)
    for name, batching in ((MODEL, True), (f"{MODEL}_nobatch", False)):
        (out / name / "1").mkdir(parents=True)
        os.symlink(src, out / name / "1" / "model.onnx")
        cfg = cpu_config(name, src, allow_nan=False)
        if not batching:
            cfg.ClearField("dynamic_batching")
        (out / name / "config.pbtxt").write_text(render(cfg))
    return out


def payload(x: np.ndarray) -> bytes:
    return json.dumps(
        {
            "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
            "outputs": [{"name": "label"}, {"name": "probabilities"}],
        }
    ).encode()


def load(host: str, port: int, path: str, bodies: list[bytes], concurrency: int, seconds: float, warmup: float):
    """Closed loop: `concurrency` workers send back-to-back requests; returns (req/s, latencies in s)."""
    stop_at = time.perf_counter() + warmup + seconds
    measure_from = time.perf_counter() + warmup
    lat: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[str] = []

    def worker(k: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        i = k
        try:
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at:
                    return
                conn.request("POST", path, body=bodies[i % len(bodies)], headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                t1 = time.perf_counter()
                if resp.status != 200:
                    errors.append(data.decode(errors="replace")[:200])
                    return
                if t0 >= measure_from:
                    lat[k].append(t1 - t0)
                i += concurrency
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{path}: {errors[0]}")
    all_lat = np.array([v for per in lat for v in per])
    return len(all_lat) / seconds, all_lat


def _perf_analyzer_env() -> dict | None:
    """Environment in which perf_analyzer starts (it links libcudart even for CPU-only use), or None."""
    exe = shutil.which("perf_analyzer")
    if exe is None:
        return None
    env = dict(os.environ)
    libs = [p for sp in sys.path for p in glob.glob(os.path.join(sp, "nvidia", "cuda_runtime", "lib"))]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")])
    probe = subprocess.run([exe, "--help"], env=env, capture_output=True, text=True)
    # --help exits non-zero on some versions; a missing shared library is what rules it out.
    return None if "error while loading shared libraries" in probe.stderr else env


def perf_analyzer(env: dict, port: int, model: str, concurrency: int, requests: int) -> dict:
    """One perf_analyzer point; returns rps and p50/p99 in ms from its CSV export (last stable window)."""
    out = ROOT / "build" / "bench" / f"pa_{model}_{port}_{concurrency}.csv"
    cmd = ["perf_analyzer", "-m", model, "-u", f"localhost:{port}", "-i", "http", "-b", "1",
           "--concurrency-range", str(concurrency),
           # count windows: perf_analyzer's own throughput over windows of `requests` requests, taken
           # when 3 windows agree within 2x (a shared 2-core box never meets the default 10%).
           "--measurement-mode", "count_windows", "--measurement-request-count", str(requests), "-s", "100", "-r", "6",
           "--input-tensor-format", "json", "--output-tensor-format", "json", "-f", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed: {proc.stdout[-800:]}{proc.stderr[-800:]}")
    with open(out) as f:
        row = next(csv.DictReader(f))
    return {"rps": float(row["Inferences/Second"]), "p50_ms": float(row["p50 latency"]) / 1e3,
            "p99_ms": float(row["p99 latency"]) / 1e3}


def wait_ready(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"server on port {port} not ready after {timeout} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--client", choices=["auto", "perf_analyzer", "python"], default="auto")
    p.add_argument("--requests", type=int, default=0,
                   help="perf_analyzer requests per window (default: ~seconds/3 x a rough rate per target)")
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    pa_env = _perf_analyzer_env() if args.client != "python" else None
    if args.client == "perf_analyzer" and pa_env is None:
        raise SystemExit("perf_analyzer not found or cannot start (libb64-0d, nvidia-cuda-runtime-cu12?)")
    client = "perf_analyzer" if pa_env else "python"
    from build_classical import ensure_built
    from tritonllm.serving.launcher import TritonServer, find_free_ports

    ensure_built()
    repo = make_repo(ROOT / "build" / "bench" / "classical_repo")
    x = np.load(ROOT / "build" / "classical" / MODEL / "inputs.npy")
    bodies = [payload(x[i : i + 1]) for i in range(len(x))]

    http_port, grpc_port, metrics_port, sk_port = find_free_ports(4)
    server = TritonServer(http_port, grpc_port, metrics_port, repositories=[repo],
                          log_path=ROOT / "build" / "bench" / "tritonserver.log")
    sk = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "sklearn_server.py"), "--port", str(sk_port)],
                          stdout=subprocess.DEVNULL)
    targets = {
        "triton_batched": (http_port, f"/v2/models/{MODEL}/infer"),
        "triton_unbatched": (http_port, f"/v2/models/{MODEL}_nobatch/infer"),
        "sklearn_http": (sk_port, f"/v2/models/{MODEL}/infer"),
    }
    results: dict[str, dict[int, dict]] = {t: {} for t in targets}

    def measure(c: int, name: str, port: int, path: str) -> dict:
        if pa_env:
            rough_rate = 60 if name == "sklearn_http" else 1500  # sizes 3 windows to ~seconds
            per_window = args.requests or max(4 * c, int(args.seconds * rough_rate / 3))
            return perf_analyzer(pa_env, port, path.split("/")[3], c, per_window)
        rps, lat = load("127.0.0.1", port, path, bodies, c, args.seconds, args.warmup)
        return {"rps": rps, "p50_ms": 1e3 * float(np.percentile(lat, 50)), "p99_ms": 1e3 * float(np.percentile(lat, 99))}

    try:
        print(f"starting tritonserver (log {server.log_path}) and the sklearn baseline ...", flush=True)
        server.start()
        wait_ready(sk_port)
        print(f"client: {client}", flush=True)
        for c in levels:
            for name, (port, path) in targets.items():
                try:
                    r = measure(c, name, port, path)
                except (RuntimeError, subprocess.TimeoutExpired) as e:  # one failed point should not lose the others
                    print(f"  c={c:<2} {name:<17} FAILED: {str(e)[-300:]}", flush=True)
                    results[name][c] = {"error": str(e)[-2000:]}
                    continue
                results[name][c] = r
                print(f"  c={c:<2} {name:<17} {r['rps']:8.1f} req/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms",
                      flush=True)
    finally:
        server.stop()
        sk.terminate()
        sk.wait()

    print(f"\n{MODEL}, single-row requests, client {client}, ~{args.seconds:g} s per point, {os.cpu_count()} CPUs")
    print(f"{'conc':>4} | {'batched':>9} {'unbatched':>9} {'sklearn':>9} req/s | batched/unbatched  batched/sklearn")
    for c in levels:
        b, u, s = (results[t][c].get("rps", float("nan")) for t in targets)
        print(f"{c:>4} | {b:9.1f} {u:9.1f} {s:9.1f}       | {b / u:17.2f}x {b / s:15.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": MODEL, "client": client, "seconds": args.seconds, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
