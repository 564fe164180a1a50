"""Start a real ``tritonserver`` for this repository, wait until it is ready, stop it cleanly.

Invariants:
- Before every start ``build/backends/`` is assembled and the environment prepared (see ``discovery``).
- ``start()`` returns only once ``/v2/health/ready`` answers 200; otherwise it stops the process and
  raises ``ServerStartError`` whose message names the models that failed to load and ends with the log tail.
- ``stop()`` drains: SIGINT (Triton waits for in-flight requests), then waits, then kills the whole
  process group (the Python stubs included). It is idempotent.
- Ports are always given by the caller (tests use ``find_free_ports``); nothing here picks a fixed port.

CLI (foreground, for ``make serve``): ``python -m tritonllm.serving.launcher --http-port 8000 ... [-- extra
tritonserver args such as --model-config-name trtllm]``.

This module imports nothing from Triton; it talks HTTP with the standard library only.
"""
from __future__ import annotations

import argparse
import atexit
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable, Sequence

from tritonllm.serving.discovery import REPO_ROOT, assemble_backends, find_free_ports, find_tritonserver, server_env
from tritonllm.serving.server_log import describe_failure, failed_models, failure_summary

__all__ = ["TritonServer", "ServerStartError", "find_free_ports", "find_tritonserver", "failed_models", "main"]

DEFAULT_REPOSITORIES = ("model_repository", "ensembles")


class ServerStartError(RuntimeError):
    """tritonserver did not become ready; the message names failed models and ends with the log tail."""


# --------------------------------------------------------------------------- the server

class TritonServer:
    """One tritonserver process over this repository's model repositories.

    ``start()`` blocks until ready (or raises ``ServerStartError``); ``stop()`` drains and is idempotent.
    Usable as a context manager.
    """

    def __init__(
        self,
        http_port: int,
        grpc_port: int,
        metrics_port: int,
        repositories: Sequence[str | os.PathLike] = DEFAULT_REPOSITORIES,
        log_path: str | os.PathLike | None = None,
        extra_args: Sequence[str] = (),
        exit_timeout_s: int = 10,
        repo_root: str | os.PathLike = REPO_ROOT,
        tritonserver: str | os.PathLike | None = None,
    ):
        self.repo_root = Path(repo_root).resolve()
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.repositories = [self._abs(r) for r in repositories]
        self.log_path = self._abs(log_path or f"build/logs/tritonserver-{http_port}.log")
        self.extra_args = list(extra_args)
        # Triton waits this long on SIGINT for in-flight requests *and* idle keep-alive connections.
        self.exit_timeout_s = exit_timeout_s
        self.binary = Path(tritonserver) if tritonserver else find_tritonserver()
        self.process: subprocess.Popen | None = None
        self._log_file = None

    def _abs(self, p: str | os.PathLike) -> Path:
        path = Path(p)
        return path if path.is_absolute() else self.repo_root / path

    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"localhost:{self.metrics_port}"

    def command(self, backend_dir: Path) -> list[str]:
        cmd = [str(self.binary)]
        for repo in self.repositories:
            cmd += ["--model-repository", str(repo)]
        cmd += [
            "--backend-directory", str(backend_dir),
            "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
        ]
        cmd += ["--exit-timeout-secs", str(self.exit_timeout_s)]
        return cmd + self.extra_args

    def launch(self, stdout=None) -> subprocess.Popen:
        """Start the process without waiting. ``stdout`` defaults to the log file."""
        backend_dir = assemble_backends(self.binary, self.repo_root)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if stdout is None:
            self._log_file = open(self.log_path, "wb")
            stdout = self._log_file
        # A new session makes the server and its Python stubs one process group, so stop() can reach all.
        self.process = subprocess.Popen(
            self.command(backend_dir), cwd=self.repo_root, env=server_env(self.binary, self.repo_root),
            stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        # The server lives in its own session, so a crashing caller would orphan it: stop it at exit.
        atexit.register(self.stop)
        return self.process

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerStartError(
                    f"tritonserver exited with code {self.process.returncode}\n" + describe_failure(self.read_log())
                )
            if self.is_ready():
                return
            time.sleep(0.25)
        raise ServerStartError(f"tritonserver not ready after {timeout:.0f} s\n" + describe_failure(self.read_log()))

    def start(self, timeout: float = 300.0) -> "TritonServer":
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def read_log(self) -> str:
        if self._log_file is not None:
            self._log_file.flush()
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.read_log().splitlines()[-lines:])

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGINT, wait up to ``timeout`` s (default: the exit timeout + 10 s), then SIGKILL the process group.

        Returns the server's exit code (0 after a clean drain), or None when it was not running.
        """
        timeout = self.exit_timeout_s + 10 if timeout is None else timeout
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:  # stubs left behind by a killed or crashed server still belong to the group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self.process = None
        return code

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------- foreground CLI

def serve_foreground(server: TritonServer, timeout: float) -> int:
    """Run until Ctrl-C: the log goes to the terminal and to ``server.log_path``; readiness is announced."""
    server.log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = server.launch(stdout=subprocess.PIPE)
    ready = threading.Event()

    def announce() -> None:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if server.is_ready():
                ready.set()
                print(f"\n*** tritonserver READY  http://{server.http_url}  grpc {server.grpc_url}  "
                      f"metrics http://{server.metrics_url}/metrics  (Ctrl-C stops)\n", flush=True)
                return
            time.sleep(0.5)
        if proc.poll() is None:
            print(f"\n*** tritonserver not ready after {timeout:.0f} s\n", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    with open(server.log_path, "wb") as log:
        def pump() -> None:
            for chunk in iter(proc.stdout.readline, b""):
                log.write(chunk)
                log.flush()
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()

        try:
            pump()
        except KeyboardInterrupt:
            # The server runs in its own session, so the terminal's Ctrl-C reaches only us: forward it
            # and keep echoing while Triton drains; a second Ctrl-C falls through to the kill in stop().
            proc.send_signal(signal.SIGINT)
            try:
                pump()
            except KeyboardInterrupt:
                pass
        finally:
            code = server.stop()
    if not ready.is_set():
        print("\n" + failure_summary(server.read_log()), file=sys.stderr)
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
    parser.add_argument("--model-repository", action="append", dest="repositories",
                        help="repeatable; default: model_repository and ensembles")
    parser.add_argument("--log-path", default=None, help="default build/logs/tritonserver-<http port>.log")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--exit-timeout", type=int, default=30, help="seconds Triton drains on Ctrl-C")
    parser.add_argument("--repo-root", default=str(REPO_ROOT))
    args, extra = parser.parse_known_args(list(argv) if argv is not None else None)
    extra = [a for a in extra if a != "--"]
    server = TritonServer(
        args.http_port, args.grpc_port, args.metrics_port,
        repositories=args.repositories or DEFAULT_REPOSITORIES, log_path=args.log_path,
        extra_args=extra, exit_timeout_s=args.exit_timeout, repo_root=args.repo_root,
    )
    print(f"tritonserver: {server.binary}\nlog: {server.log_path}\n$ {' '.join(server.command(Path('build/backends')))}",
          flush=True)
    # SIGTERM (e.g. from `timeout` or a container runtime) is treated like Ctrl-C so the server drains.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    return serve_foreground(server, args.ready_timeout)


if __name__ == "__main__":
    sys.exit(main())
