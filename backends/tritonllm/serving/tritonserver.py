"""One real ``tritonserver`` process for this repository: start it, wait until it is ready, stop it cleanly.

Invariants:
- Before every start ``build/backends/`` is assembled and the environment prepared (see ``discovery``).
- ``start()`` returns only once ``/v2/health/ready`` answers 200; otherwise it stops the process and
  raises ``ServerStartError`` whose message names the models that failed to load and ends with the log tail. A
  port some process already listens on is refused before launching, naming that process.
- ``stop()`` drains: SIGINT (Triton waits for in-flight requests), then waits, then kills the whole
  process group (the Python stubs included). ``kill()`` skips the drain. Both are idempotent; a kill removes the
  shared memory its stubs could not.
- The group is registered with this process's guard (``orphans.LIFELINE``): should the caller die without stopping
  it (SIGKILL included), the guard stops it.
- Ports are always given by the caller (tests use ``find_free_ports``); nothing here picks a fixed port.
- A stub watchdog (``tritonllm.serving.watchdog``, policy ``stub_watchdog``: auto / reload / restart, None
  = off) runs while the server is up: Triton 2.51 never restarts a dead stub of a decoupled model, the
  watchdog reloads that model or restarts the server. Reloads need explicit model control, which opens
  the load API (a load may override a model's config, paths included): this class never turns it on by
  itself; the production profile does, with that API behind the admin key. Otherwise the watchdog
  restarts the server (drained).

The foreground CLI (``make serve``) is ``launcher.py``. This module imports nothing from Triton; it talks HTTP with
the standard library only.
"""
from __future__ import annotations

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
from typing import Sequence

from tritonllm.serving.discovery import REPO_ROOT, assemble_backends, find_tritonserver, server_env
from tritonllm.serving.orphans import LIFELINE, listening, remove_shm, shm_regions
from tritonllm.serving.server_log import describe_failure, port_in_use
from tritonllm.serving.watchdog import StubWatchdog

DEFAULT_REPOSITORIES = ("model_repository", "ensembles")


class ServerStartError(RuntimeError):
    """tritonserver did not become ready; the message names failed models and ends with the log tail."""


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
        stub_watchdog: str | None = "auto",
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
        self.echo = False  # foreground CLI: also copy the server's output to our stdout
        self._launches = 0
        self.stub_watchdog = stub_watchdog
        self.restarting = False  # a watchdog restart is under way (tests wait it out)
        self.watchdog: StubWatchdog | None = None
        if stub_watchdog is not None:
            self.watchdog = StubWatchdog(lambda: self.process.pid if self.process else None, self.http_url,
                                         self.metrics_url, self.server_args(), policy=stub_watchdog,
                                         on_restart=self.restart)

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

    def port_options(self) -> dict[int, str]:
        """Each port -> how a user of `make serve` or of this launcher picks another."""
        return {self.http_port: f"make serve HTTP_PORT=... (launcher --http-port; HTTP, now {self.http_port})",
                self.grpc_port: f"make serve GRPC_PORT=... (launcher --grpc-port; gRPC, now {self.grpc_port})",
                self.metrics_port: f"make serve METRICS_PORT=... (launcher --metrics-port; metrics, now "
                                   f"{self.metrics_port})"}

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
        if not any(a.split("=")[0] in ("--disable-auto-complete-config", "--strict-model-config")
                   for a in self.server_args()):
            # Our configs are complete as rendered, and none of our models completes its config: with auto-complete
            # on, the Python backend starts a second stub per model only to ask it (11 s to READY instead of 6).
            cmd.append("--disable-auto-complete-config")
        return cmd + self.server_args()

    def server_args(self) -> list[str]:
        """The caller's extra arguments, as given: explicit model control (the watchdog's reload path) only
        where the caller chose it, as the production profile does with the load API behind a key."""
        return list(self.extra_args)

    def launch(self, stdout=None) -> subprocess.Popen:
        """Start the process without waiting. ``stdout`` defaults to the log file (appended to after a
        restart); with ``echo`` the output also goes to our stdout."""
        # A port already listened on would be taken by Triton's endpoint, and worse, readiness would be read from
        # whoever holds it (a server of ours left running answers /v2/health/ready): refuse, naming the holder.
        taken = [port for port in self.port_options() if listening(port)]
        if taken:
            raise ServerStartError("\n".join(port_in_use(port, self.port_options()) for port in taken))
        backend_dir = assemble_backends(self.binary, self.repo_root)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._launches += 1
        if stdout is None:
            self._log_file = open(self.log_path, "wb" if self._launches == 1 else "ab")
            stdout = subprocess.PIPE if self.echo else self._log_file
        # A new session makes the server and its Python stubs one process group, so stop() can reach all.
        self.process = subprocess.Popen(
            self.command(backend_dir), cwd=self.repo_root, env=server_env(self.binary, self.repo_root),
            stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        if self.echo and stdout is subprocess.PIPE:
            threading.Thread(target=_pump, args=(self.process.stdout, self._log_file), daemon=True).start()
        # The server lives in its own session, so a crashing caller would orphan it: stop it at exit, and should
        # the caller die without running exit handlers (SIGKILL), its guard stops the group (orphans.Lifeline).
        LIFELINE.add(self.process.pid)
        if self._launches == 1:
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
                    f"tritonserver exited with code {self.process.returncode}\n"
                    + describe_failure(self.read_log(), port_options=self.port_options())
                )
            if self.is_ready():
                return
            time.sleep(0.25)
        raise ServerStartError(f"tritonserver not ready after {timeout:.0f} s\n"
                               + describe_failure(self.read_log(), port_options=self.port_options()))

    def start(self, timeout: float = 300.0) -> "TritonServer":
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        if self.watchdog is not None:
            self.watchdog.start()
        return self

    def restart(self, timeout: float = 300.0) -> None:
        """Drain and restart (the watchdog's last resort). SIGINT lets in-flight requests of healthy models
        finish; once Triton logs that no inference is in flight, the process group is killed at once rather
        than after the exit timeout (a version pinned by orphaned streams never finishes unloading)."""
        self.restarting = True
        try:
            self._restart(timeout)
        finally:
            self.restarting = False

    def _restart(self, timeout: float) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            mark = len(self.read_log())
            proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + self.exit_timeout_s + 5
            while proc.poll() is None and time.monotonic() < deadline:
                if "All models are stopped" in self.read_log()[mark:]:
                    break
                time.sleep(0.1)
        self._kill_and_reap()
        self.launch()
        self.wait_ready(timeout)

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
        if self.watchdog is not None:
            self.watchdog.stop()
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        return self._kill_and_reap()

    def kill(self) -> int | None:
        """SIGKILL the process group now (no drain); returns the exit code, None when nothing ran. Idempotent."""
        if self.watchdog is not None:
            self.watchdog.stop()
        return self._kill_and_reap()

    def _kill_and_reap(self) -> int | None:
        proc = self.process
        if proc is None:
            return None
        regions = shm_regions(proc.pid) if proc.poll() is None else []
        try:  # stubs left behind by a killed or crashed server still belong to the group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = proc.wait()
        LIFELINE.remove(proc.pid)
        remove_shm(regions)  # what the killed stubs could not unlink themselves
        if proc.stdout is not None:
            time.sleep(0.2)  # let the pump copy the last lines
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self.process = None
        return code

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _pump(stream, log) -> None:
    """Copy the server's output to the log file and to our stdout (foreground CLI)."""
    for chunk in iter(stream.readline, b""):
        try:
            log.write(chunk)
            log.flush()
        except ValueError:  # the log was closed by stop()/restart(): keep echoing
            pass
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
