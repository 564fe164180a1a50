"""Watch tritonserver's Python backend stubs and recover when one dies (Triton 2.51 does not).

Why: Triton 2.51's Python backend restarts a dead stub only for *non-decoupled* models, and only when the
next request hits it. A dead stub of a decoupled model (``tensorrt_llm``, the BLS models) stays dead: later
requests fail at once with "Stub process '<instance>' is not healthy" while the model still reports READY
(upstream triton-inference-server/server#8604), and the streams that were in flight are orphaned. Their
response factories live in the server process, only the (dead) stub could finish them, and no API lets
anyone else do it; they also pin the old model version, so a graceful shutdown then waits the whole exit
timeout. The only thing that ends an orphaned stream server-side is the end of the server process (the
client then sees its connection close: gRPC UNAVAILABLE).

What this does (a thread in the launcher, stdlib only: /proc and Triton's HTTP API):
- Every ``interval_s`` it lists the server's descendant processes named ``triton_python_backend_stub``; the
  stub's argv names the model file (``<repository>/<model>/<version>/model.py``) and the instance
  (``<model>_<group>_<index>``). A stub seen alive is tracked by pid.
- A tracked stub that has exited (gone, or a zombie) while no other live stub serves the same instance and
  the model is still READY in the repository index (so it was not an unload or a reload) is a death.
  It is confirmed once more ``confirm_s`` later, then acted on, per ``policy``:
  - ``reload``: ``POST /v2/repository/models/<m>/load`` with the model's current config as an override
    (a plain load of an unchanged, loaded model is a no-op on 2.51). Needs ``--model-control-mode=explicit``.
    Later requests succeed once the new instance is up; orphaned streams are NOT ended (see above).
  - ``restart``: restart the whole server (``on_restart`` callback): orphaned streams end with a
    connection error, in-flight requests of healthy models are drained first.
  - ``auto`` (default): ``reload`` when nothing can be orphaned (the model is not decoupled, or the dead
    instance's ``llm_requests_running`` + ``llm_requests_waiting`` gauges read 0 and Triton started no
    request of the model in the last 2 s), else ``restart``.
  Without explicit model control a reload is impossible, so ``reload``/``auto`` restart instead.
- The server process itself may die too: on 2.51 a stub killed mid-stream can take tritonserver down
  (``terminate called after throwing an instance of 'boost::interprocess::lock_exception'``: the stub died
  holding a mutex in shared memory). A server that exits while the watchdog runs is restarted (event
  ``server_died``), whatever the policy.
- The admin key of a restricted model-repository API (``--http-restricted-api=...model-repository...:
  <header>=<key>``) is sent with every repository call.

Every action is appended to ``events`` (dicts with ``kind``, ``model``, ``instance``, ``t`` monotonic) and
printed to stderr.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

STUB_BINARY = "triton_python_backend_stub"
POLICIES = ("auto", "reload", "restart")


# --------------------------------------------------------------------------- server arguments

def arg_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag=value`` or ``--flag value`` in a tritonserver argument list (last one wins)."""
    value = None
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            value = a.split("=", 1)[1]
        elif a == flag and i + 1 < len(args):
            value = args[i + 1]
    return value


def admin_headers(args: Sequence[str]) -> dict[str, str]:
    """The header the model-repository API needs under ``--http-restricted-api`` (empty when unrestricted)."""
    headers: dict[str, str] = {}
    for i, a in enumerate(args):
        spec = a.split("=", 1)[1] if a.startswith("--http-restricted-api=") else (
            args[i + 1] if a == "--http-restricted-api" and i + 1 < len(args) else None)
        if not spec or ":" not in spec:
            continue
        apis, kv = spec.split(":", 1)
        if "model-repository" in [x.strip() for x in apis.split(",")] and "=" in kv:
            key, value = kv.split("=", 1)
            headers[key.strip()] = value
    return headers


# --------------------------------------------------------------------------- /proc

def descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def is_alive(pid: int) -> bool:
    """False when the process is gone or a zombie (exited, not yet reaped by Triton)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stub_identity(argv: list[str]) -> tuple[str, str] | None:
    """(model, instance) from a stub's argv: ``stub <repo>/<model>/<version>/model.py <shm> <size> <growth>
    <parent pid> <python lib> <ipc handle> <instance> [<runtime dir>]``. None for auto-complete stubs
    (named after the model, they exit by design) and anything else."""
    if len(argv) < 9 or not argv[0].endswith(STUB_BINARY):
        return None
    model, instance = Path(argv[1]).parent.parent.name, argv[8]
    if not model or instance == model or not instance.startswith(model + "_"):
        return None
    return model, instance


def live_stubs(server_pid: int) -> dict[int, tuple[str, str]]:
    out = {}
    for pid in descendants(server_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        ident = stub_identity([a for a in argv if a])
        if ident and is_alive(pid):
            out[pid] = ident
    return out


# --------------------------------------------------------------------------- the watchdog

class StubWatchdog:
    """Background thread; ``start()`` once the server is ready, ``stop()`` before stopping the server."""

    def __init__(self, server_pid: Callable[[], int | None], http_url: str, metrics_url: str | None,
                 server_args: Sequence[str], policy: str = "auto", on_restart: Callable[[], None] | None = None,
                 interval_s: float = 0.5, confirm_s: float = 0.5, log: Callable[[str], None] | None = None):
        if policy not in POLICIES:
            raise ValueError(f"stub watchdog policy must be one of {POLICIES}, got {policy!r}")
        self.server_pid, self.http_url, self.metrics_url = server_pid, http_url, metrics_url
        self.headers = admin_headers(server_args)
        self.can_reload = arg_value(server_args, "--model-control-mode") == "explicit"
        self.policy, self.on_restart = policy, on_restart
        self.interval_s, self.confirm_s = interval_s, confirm_s
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.events: list[dict] = []
        self._tracked: dict[int, tuple[str, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy = threading.Lock()  # held while acting; stop() waits for it

    # ---- lifecycle
    def start(self) -> "StubWatchdog":
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._tracked = {}
            pid = self.server_pid()
            if pid is not None:  # track the stubs up now, so a death right after start() is seen
                self._tracked.update(live_stubs(pid))
            self._thread = threading.Thread(target=self._run, name="stub-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception as e:  # never let the thread die silently
                self.log(f"[stub-watchdog] poll failed: {e!r}")

    # ---- one round
    def poll(self) -> None:
        pid = self.server_pid()
        if pid is None:
            return
        if not is_alive(pid):  # Triton itself died (see the module docstring): restart it
            if self.on_restart is not None and not self._stop.is_set():
                with self.busy:
                    self._event("server_died", "", "", pid=pid, action="restart")
                    self.on_restart()
                    self._tracked = live_stubs(self.server_pid() or pid)
                    self._event("restarted", "", "")
            return
        live = live_stubs(pid)
        self._tracked.update(live)
        dead = {p: ident for p, ident in self._tracked.items() if p not in live}
        for p in dead:
            del self._tracked[p]
        for model, instance in sorted(set(dead.values())):
            if (model, instance) not in live.values() and not self._stop.is_set():
                self._confirm_and_act(pid, model, instance)

    def _confirm_and_act(self, server_pid: int, model: str, instance: str) -> None:
        if self._stop.wait(self.confirm_s):
            return
        state = self.model_state(model)
        if (model, instance) in live_stubs(server_pid).values() or state != "READY":
            self.log(f"[stub-watchdog] stub of {instance!r} exited; model state {state}: not acting")
            return  # a reload or an unload (by someone else) replaced or removed it
        with self.busy:
            if self._stop.is_set():
                return
            orphans = self.orphaned_requests(model)
            decoupled = self.is_decoupled(model)
            action = self.policy
            if action == "auto":
                action = "reload" if (decoupled is False or orphans == 0) else "restart"
            if action == "reload" and not self.can_reload:
                action = "restart"
            self._event("stub_died", model, instance, orphans=orphans, decoupled=decoupled, action=action)
            if action == "restart" and self.on_restart is not None:
                self.on_restart()
                self._tracked = live_stubs(self.server_pid() or server_pid)
                self._event("restarted", model, instance)
            else:
                self.reload(model, instance)

    def _event(self, kind: str, model: str, instance: str, **extra) -> None:
        event = {"kind": kind, "model": model, "instance": instance, "t": time.monotonic(), **extra}
        self.events.append(event)
        self.log(f"[stub-watchdog] {kind}: model {model!r} instance {instance!r} "
                 + " ".join(f"{k}={v}" for k, v in extra.items()))

    # ---- Triton HTTP API
    def _request(self, method: str, path: str, body: dict | None = None, timeout: float = 10.0):
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        req = urllib.request.Request(f"http://{self.http_url}{path}", data=data, method=method,
                                     headers={**self.headers, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
        return json.loads(text) if text.strip() else None

    def model_state(self, model: str) -> str | None:
        try:
            index = self._request("POST", "/v2/repository/index", {})
        except (urllib.error.URLError, OSError, ValueError):
            return None
        states = [m.get("state") for m in index or [] if m.get("name") == model]
        return "READY" if "READY" in states else (states[0] if states else None)

    def is_decoupled(self, model: str) -> bool | None:
        try:
            config = self._request("GET", f"/v2/models/{model}/config")
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return bool((config or {}).get("model_transaction_policy", {}).get("decoupled", False))

    def orphaned_requests(self, model: str, quiet_s: float = 2.0) -> int | None:
        """Requests the dead instance still had: its last published llm_requests_running + _waiting. None
        (unknown) when the model publishes no such gauge, or when the gauge reads 0 but Triton started a
        request within ``quiet_s`` (the engine publishes every ~0.5 s, so a fresh request may be missing)."""
        if not self.metrics_url:
            return None
        try:
            stats = self._request("GET", f"/v2/models/{model}/stats")
            last_ms = max(int(m.get("last_inference", 0)) for m in (stats or {}).get("model_stats", [{}]))
        except (urllib.error.URLError, OSError, ValueError):
            return None
        try:
            with urllib.request.urlopen(f"http://{self.metrics_url}/metrics", timeout=5) as r:
                text = r.read().decode()
        except (urllib.error.URLError, OSError):
            return None
        total, seen = 0.0, False
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name in ("llm_requests_running", "llm_requests_waiting") and f'model="{model}"' in line:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
        if not seen or (total == 0 and time.time() * 1000 - last_ms < quiet_s * 1000):
            return None
        return int(total)

    def reload(self, model: str, instance: str, timeout: float = 600.0) -> bool:
        """Reload ``model`` with its current config (forces new instances even though nothing changed)."""
        t0 = time.monotonic()
        try:
            config = self._request("GET", f"/v2/models/{model}/config")
            self._request("POST", f"/v2/repository/models/{model}/load",
                          {"parameters": {"config": json.dumps(config)}}, timeout=timeout)
        except (urllib.error.URLError, OSError, ValueError) as e:
            detail = e.read().decode(errors="replace") if isinstance(e, urllib.error.HTTPError) else repr(e)
            self._event("reload_failed", model, instance, error=detail[:300])
            return False
        self._event("reloaded", model, instance, seconds=round(time.monotonic() - t0, 2))
        return True
