"""``make serve-dynamo``: Dynamo's frontend (OpenAI API) plus N workers of our engine on this machine.

    python -m tritonllm.dynamo.launch --replicas 2 --port 8080 --router kv
    python -m tritonllm.dynamo.launch --replicas 1 --prefill-workers 1    # disaggregated prefill / decode

Invariants:
- Everything listens on loopback only: the frontend's HTTP on 127.0.0.1, Dynamo's request and response
  planes pinned there (``DYN_TCP_RPC_HOST``, ``DYN_TCP_RESPONSE_STREAM_HOST``, ``DYN_EVENT_PLANE_HOST``),
  and the event plane in broker mode through ``tritonllm.dynamo.broker`` on 127.0.0.1 (Dynamo 1.6.1's
  direct mode binds every publisher on 0.0.0.0); NIXL's UCX (KV handoff between prefill and decode
  workers) on ``lo`` (``disagg.LOOPBACK_UCX``); discovery is a private folder (``--discovery-backend
  file``, ``DYN_FILE_KV``), so no etcd or NATS, and two launches never see each other's workers.
- Workers split the CPU threads evenly; ``READY`` is printed once the frontend lists the model with every
  worker registered.
- Ctrl-C or SIGTERM (to this process or its process group) stops every child: SIGTERM first (Dynamo
  workers drain), SIGKILL after ``--grace`` seconds. A child that dies on its own is reported; the
  frontend keeps serving on the other workers (``--exit-on-worker-death`` stops everything instead).
- Each child runs in a process group of its own, registered with this process's guard (``serving/orphans``):
  a launcher killed outright (SIGKILL) still takes every child, and what they started, with it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..serving.discovery import find_free_ports
from ..serving.orphans import LIFELINE
from .broker import broker_url
from .disagg import LOOPBACK_UCX

REPO = Path(__file__).resolve().parents[3]
LOOPBACK_ENV = {"DYN_TCP_RPC_HOST": "127.0.0.1", "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
                "DYN_EVENT_PLANE_HOST": "127.0.0.1", "DYN_HTTP_HOST": "127.0.0.1"}
ROUTERS = ("kv", "round-robin")


def dynamo_python() -> str:
    """The interpreter that has Dynamo: build/dynamo-venv (``make dynamo-venv``), else this one."""
    venv = REPO / "build" / "dynamo-venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def child_env(store: str, broker: str) -> dict[str, str]:
    env = {**os.environ, **LOOPBACK_ENV, **LOOPBACK_UCX, "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": store,
           "DYN_EVENT_PLANE": "zmq", "DYN_ZMQ_BROKER_URL": broker,
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "backends"), os.environ.get("PYTHONPATH")) if p)}
    env.pop("DYN_SYSTEM_PORT", None)  # no worker status server: nothing else listens
    return env


def commands(replicas: int, port: int, router: str, threads: int, deployment: str | None,
             served_name: str | None, python: str, prefill_workers: int = 0) -> list[list[str]]:
    """[frontend, worker 0, ..., prefill worker 0, ...] argv (pure; tested). With prefill workers the
    ``replicas`` workers are decode workers."""
    if replicas < 1:
        raise ValueError("--replicas must be >= 1")
    if prefill_workers < 0:
        raise ValueError("--prefill-workers must be >= 0")
    if router not in ROUTERS:
        raise ValueError(f"--router must be one of {ROUTERS}")
    frontend = [python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                "--router-mode", router, "--discovery-backend", "file"]
    worker = [python, "-m", "tritonllm.dynamo", "--discovery-backend", "file", "--num-threads", str(threads)]
    if deployment:
        worker += ["--deployment", deployment]
    if served_name:
        worker += ["--served-model-name", served_name]
    if router != "kv":
        worker += ["--no-kv-events"]
    if not prefill_workers:
        return [frontend] + [list(worker) for _ in range(replicas)]
    return ([frontend] + [worker + ["--disaggregation-mode", "decode"] for _ in range(replicas)]
            + [worker + ["--disaggregation-mode", "prefill"] for _ in range(prefill_workers)])


def models(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
        return json.loads(r.read())


SERVING = "dynamo_backend_common::worker"  # a worker's log line "Serving <model> on <endpoint>" comes from here


def workers_serving(logs: list[Path]) -> bool:
    """Every worker logged that it serves its endpoint (Dynamo's Worker, after registration)."""
    for log in logs:
        text = log.read_text(errors="replace") if log.exists() else ""
        if not any(SERVING in line and "Serving " in line for line in text.splitlines()):
            return False
    return True


def wait_ready(port: int, procs: list[subprocess.Popen], timeout: float, worker_logs: list[Path]) -> str:
    """The served model's name once every worker serves and the frontend lists the model; raises if a
    child dies first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{' '.join(p.args[:3])} exited with {p.returncode} before READY")
        try:
            data = models(port).get("data") or []
            if data and workers_serving(worker_logs):
                return data[0]["id"]
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the frontend did not list a model within {timeout:.0f} s")


def spawn(cmd: list[str], **kwargs) -> subprocess.Popen:
    """A child in a process group of its own (so stop() reaches whatever it starts), registered with this process's
    guard: should the launcher be killed outright, the guard stops the group (serving/orphans.py)."""
    proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
    LIFELINE.add(proc.pid)
    return proc


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(procs: list[subprocess.Popen], grace: float) -> None:
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        _signal_group(p, signal.SIGKILL)  # the child and anything it started
        p.wait(5)
        LIFELINE.remove(p.pid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--prefill-workers", type=int, default=0,
                    help="disaggregated serving: this many prefill workers, and --replicas decode workers")
    ap.add_argument("--router", default="kv", choices=ROUTERS)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per worker (default: cores / workers)")
    ap.add_argument("--deployment", default=None)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--grace", type=float, default=10.0)
    ap.add_argument("--log-dir", default=str(REPO / "build" / "logs"))
    ap.add_argument("--exit-on-worker-death", action="store_true")
    args = ap.parse_args(argv)
    threads = args.threads or max(1, (os.cpu_count() or 1) // (args.replicas + args.prefill_workers))
    cmds = commands(args.replicas, args.port, args.router, threads, args.deployment, args.served_model_name,
                    dynamo_python(), args.prefill_workers)
    store = tempfile.mkdtemp(prefix="dynamo-kv-")
    xsub, xpub = find_free_ports(2)
    env = child_env(store, broker_url(xsub, xpub))
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        broker_log = open(Path(args.log_dir) / f"dynamo-broker-{args.port}.log", "w")
        procs.append(spawn([dynamo_python(), "-m", "tritonllm.dynamo.broker", "--xsub-port", str(xsub),
                            "--xpub-port", str(xpub)], env=env, cwd=REPO, stdout=broker_log, stderr=subprocess.STDOUT))
        worker_logs = []
        for i, cmd in enumerate(cmds[1:] + cmds[:1]):  # workers first: the frontend finds them at once
            name = "frontend" if cmd is cmds[0] else f"prefill{i - args.replicas}" if i >= args.replicas else f"worker{i}"
            path = Path(args.log_dir) / f"dynamo-{name}-{args.port}.log"
            worker_logs += [] if cmd is cmds[0] else [path]
            log = open(path, "w")
            procs.append(spawn(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
        model = wait_ready(args.port, procs, args.ready_timeout, worker_logs)
        pids = " ".join(str(p.pid) for p in procs[1:-1])
        roles = (f"{args.replicas} decode + {args.prefill_workers} prefill worker(s)" if args.prefill_workers
                 else f"{args.replicas} worker(s)")
        print(f"*** dynamo READY  http://127.0.0.1:{args.port}/v1  model {model}  {roles} "
              f"(pids {pids}), router {args.router}  (Ctrl-C stops)", flush=True)
        reported: set[int] = set()
        while not stopping:
            for p in procs:
                if p.poll() is not None and p.pid not in reported:
                    reported.add(p.pid)
                    print(f"dynamo: {' '.join(p.args[1:3])} (pid {p.pid}) exited with {p.returncode}",
                          file=sys.stderr, flush=True)
                    if args.exit_on_worker_death or p is procs[-1] or p is procs[0]:  # frontend, broker, or asked
                        stopping = True
            time.sleep(0.5)
        return 0
    except (RuntimeError, TimeoutError) as e:
        print(f"dynamo: {e} (logs in {args.log_dir})", file=sys.stderr)
        return 1
    finally:
        stop(procs, args.grace)


if __name__ == "__main__":
    sys.exit(main())
