"""``make serve``: the real ``tritonserver`` over this repository in the foreground, until Ctrl-C.

    python -m tritonllm.serving.launcher --http-port 8000 ... [-- extra tritonserver args such as
        --model-config-name unary]

The server itself (start, readiness, drain, kill, the stub watchdog, the guard against orphans) is
``tritonserver.TritonServer``, re-exported here with ``ServerStartError``, ``find_free_ports``, ``find_tritonserver``
and ``failed_models`` for the callers that start servers (tests, benchmarks). ``--stub-watchdog off`` disables the
watchdog. Ctrl-C drains; a second Ctrl-C kills at once. SIGTERM is treated as Ctrl-C.

This module imports nothing from Triton.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Iterable

from tritonllm.serving.discovery import REPO_ROOT, find_free_ports, find_tritonserver
from tritonllm.serving.server_log import failed_models, failure_summary
from tritonllm.serving.tritonserver import DEFAULT_REPOSITORIES, ServerStartError, TritonServer

__all__ = ["TritonServer", "ServerStartError", "find_free_ports", "find_tritonserver", "failed_models", "main"]


def serve_foreground(server: TritonServer, timeout: float) -> int:
    """Run until Ctrl-C: the log goes to the terminal and to ``server.log_path``; readiness is announced.
    A restart by the stub watchdog keeps the foreground session going."""
    server.echo = True
    ready = threading.Event()
    code = None
    try:
        try:
            server.launch()
        except ServerStartError as e:
            print(f"\n{e}", file=sys.stderr, flush=True)
            return 1
        deadline = time.monotonic() + timeout
        while server.process is not None and server.process.poll() is None and time.monotonic() < deadline:
            if server.is_ready():
                ready.set()
                break
            time.sleep(0.5)
        if ready.is_set():
            print(f"\n*** tritonserver READY  http://{server.http_url}  grpc {server.grpc_url}  "
                  f"metrics http://{server.metrics_url}/metrics  (Ctrl-C stops)\n", flush=True)
            if server.watchdog is not None:
                server.watchdog.start()
        elif server.process is not None and server.process.poll() is None:
            print(f"\n*** tritonserver not ready after {timeout:.0f} s\n", flush=True)
        while True:  # the watchdog may swap the process: wait while one runs or a restart is under way
            proc = server.process
            if proc is not None and proc.poll() is None:
                time.sleep(0.5)
            elif server.watchdog is not None and server.watchdog.busy.locked():
                time.sleep(0.5)
            else:
                break
    except KeyboardInterrupt:
        # The server runs in its own session, so the terminal's Ctrl-C reaches only us: forward it and wait
        # while Triton drains; a second Ctrl-C kills it at once.
        print("\n*** stopping: draining in-flight requests (Ctrl-C again to kill now)", file=sys.stderr, flush=True)
        if server.watchdog is not None:
            server.watchdog.stop()
        try:
            if server.process is not None:
                server.process.send_signal(signal.SIGINT)
                server.process.wait()
        except KeyboardInterrupt:
            print("*** killed", file=sys.stderr, flush=True)
            server.kill()
    finally:
        try:
            code = server.stop()
        except KeyboardInterrupt:  # Ctrl-C while stop() drains
            code = server.kill()
    if not ready.is_set():
        print("\n" + failure_summary(server.read_log(), server.port_options()), file=sys.stderr)
        return code or 1
    return 0


def _raise_interrupt(*_) -> None:
    raise KeyboardInterrupt


def default_ports(repo_root: Path = REPO_ROOT) -> dict[str, int]:
    """Ports for the CLI: $HTTP_PORT/$GRPC_PORT/$METRICS_PORT, else deployment.yaml's ``server:``, else 8000-8002."""
    ports = {"http_port": 8000, "grpc_port": 8001, "metrics_port": 8002}
    try:
        import yaml  # only the CLI needs it; the library part of this module stays stdlib-only

        with open(repo_root / "deployment.yaml") as f:
            server = (yaml.safe_load(f) or {}).get("server") or {}
        ports.update({k: int(v) for k, v in server.items() if k in ports})
    except (OSError, ImportError):
        pass
    for key in ports:
        env = os.environ.get(key.upper())
        if env:
            ports[key] = int(env)
    return ports


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonllm.serving.launcher",
        description="Run tritonserver over this repository (foreground). Arguments after `--` go to tritonserver.",
    )
    ports = default_ports()
    parser.add_argument("--http-port", type=int, default=ports["http_port"])
    parser.add_argument("--grpc-port", type=int, default=ports["grpc_port"])
    parser.add_argument("--metrics-port", type=int, default=ports["metrics_port"])
    parser.add_argument("--host", default=os.environ.get("HOST") or None,
                        help="address the three endpoints bind (env HOST; default tritonserver's 0.0.0.0: every "
                             "interface); 127.0.0.1 serves this machine only")
    parser.add_argument("--model-repository", action="append", dest="repositories",
                        help="repeatable; default: model_repository and ensembles")
    parser.add_argument("--log-path", default=None, help="default build/logs/tritonserver-<http port>.log")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--exit-timeout", type=int, default=30, help="seconds Triton drains on Ctrl-C")
    parser.add_argument("--repo-root", default=str(REPO_ROOT))
    parser.add_argument("--stub-watchdog", choices=("auto", "reload", "restart", "off"), default="auto",
                        help="on a dead Python stub: reload its model, restart the server, or both as "
                             "needed (auto); see tritonllm.serving.watchdog")
    args, extra = parser.parse_known_args(list(argv) if argv is not None else None)
    extra = [a for a in extra if a != "--"]
    if args.host:
        extra = [f"--{kind}-address={args.host}" for kind in ("http", "grpc", "metrics")] + extra
    server = TritonServer(
        args.http_port, args.grpc_port, args.metrics_port,
        repositories=args.repositories or DEFAULT_REPOSITORIES, log_path=args.log_path,
        extra_args=extra, exit_timeout_s=args.exit_timeout, repo_root=args.repo_root,
        stub_watchdog=None if args.stub_watchdog == "off" else args.stub_watchdog,
    )
    print(f"tritonserver: {server.binary}\nlog: {server.log_path}\n$ {' '.join(server.command(Path('build/backends')))}",
          flush=True)
    # SIGTERM (e.g. from `timeout` or a container runtime) is treated like Ctrl-C so the server drains. SIGINT gets
    # Python's handler even when our parent ignored it (a job started in the background by a non-interactive shell
    # inherits SIGINT ignored, and Python then leaves it so): Ctrl-C or `kill -INT` always stops the server.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return serve_foreground(server, args.ready_timeout)


if __name__ == "__main__":
    sys.exit(main())
