"""No process of ours outlives the process that started it; one that did is named by the ports it holds.

- ``Lifeline``: the servers we start run in their own process group (tritonserver and its Python stubs in one
  session, so a stop reaches them all). A launcher killed outright (SIGKILL, OOM) runs no ``finally`` and no
  ``atexit``, and the group would live on, holding the ports. So every group is registered with a guard process:
  a small Python process that reads a pipe whose only writer is the launcher. The kernel closes that pipe when the
  launcher dies, however it dies; the guard then interrupts each registered group (SIGINT, Triton's drain), gives
  it ``grace_s``, and kills what is left (SIGKILL to the group). A registered group the launcher stopped itself is
  unregistered first, so a reused process id is never signalled. The guard sits in a session of its own, so a
  signal to the launcher's group (a terminal's Ctrl-C) does not take it down before it has done its work.
  ``PR_SET_PDEATHSIG`` is not used for the servers: it follows the *thread* that forked the child, and the stub
  watchdog restarts servers from its own thread.
- ``port_holders(port)``: the processes listening on a TCP port (``/proc/net/tcp*`` inode -> ``/proc/<pid>/fd``),
  so a start that finds a port taken names the process, its command line and, for ours, how to stop it.
- ``shm_regions(pgid)`` / ``remove_shm``: the shared-memory regions of a group's Python backend stubs (named in their
  argv), which a stub unlinks on a clean exit and a killed one leaves in /dev/shm: a kill removes them after.

Linux only (``/proc``); elsewhere the guard still works and ``port_holders`` returns nothing.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

# The guard's whole program: stdlib only, started with -I -S (no site, no user paths: ~20 ms, ~8 MB).
_GUARD = r"""
import os, signal, sys, time
groups = set()
for line in sys.stdin:
    op, _, pgid = line.strip().partition(" ")
    if pgid.isdigit():
        (groups.add if op == "add" else groups.discard)(int(pgid))
def alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGINT)
    except (ProcessLookupError, PermissionError):
        pass
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline and any(alive(g) for g in groups):
    time.sleep(0.05)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


class Lifeline:
    """One guard process per launching process, started on first ``add``. Thread-safe."""

    def __init__(self, grace_s: float = 3.0):
        self.grace_s = grace_s
        self._guard: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _send(self, line: str) -> None:
        with self._lock:
            if self._guard is None or self._guard.poll() is not None:
                self._guard = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _GUARD, str(self.grace_s)], stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, text=True)
            try:
                self._guard.stdin.write(line + "\n")
                self._guard.stdin.flush()
            except (BrokenPipeError, OSError):  # the guard died: the next add starts another
                self._guard = None

    def add(self, pgid: int) -> None:
        """Stop process group ``pgid`` if this process dies before calling ``remove(pgid)``."""
        self._send(f"add {pgid}")

    def remove(self, pgid: int) -> None:
        """``pgid`` was stopped by its owner: the guard forgets it (its id may be reused)."""
        if self._guard is not None:
            self._send(f"del {pgid}")


LIFELINE = Lifeline()
"""The launching process's guard: a process has one parent, so one guard serves all the groups it starts."""


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listening(port: int) -> bool:
    """Some process listens on TCP ``port`` (any address, IPv4 or IPv6)."""
    return bool(_listening_inodes(port))


def port_holders(port: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process with a socket listening on TCP ``port`` (those we may read)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(_fd_target(fd) in wanted for fd in (proc / "fd").iterdir()):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append((int(proc.name), cmd))
        except OSError:  # the process is gone, or not ours to read
            continue
    return found


def _fd_target(fd: Path) -> str:
    """What an open file descriptor points at; "" when it closed since it was listed (a busy process, such as the
    one holding the port, opens and closes others all the time: one closed fd must not hide the rest)."""
    try:
        return os.readlink(fd)
    except OSError:
        return ""


def describe_holders(port: int) -> str:
    """", held by pid N (command)" naming each process listening on ``port``, with how to stop one of ours; "" when
    none is visible."""
    holders = port_holders(port)
    if not holders:
        return ""
    parts = []
    for pid, cmd in holders:
        ours = "tritonserver" in cmd or "tritonllm" in cmd or "openai_server" in cmd
        parts.append(f"pid {pid} ({cmd[:160]})" + (f": a server of ours left running; `kill {pid}` stops it"
                                                    if ours else ""))
    return ", held by " + "; ".join(parts)


_SHM_REGION = re.compile(r"^triton_\w+_shm_region_[0-9a-f-]{36}$")


def shm_regions(pgid: int) -> list[str]:
    """Names of the shared-memory regions the Python backend stubs of process group ``pgid`` were started with."""
    names = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            names += [a for a in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
                      if _SHM_REGION.match(a)]
        except (OSError, ProcessLookupError):
            continue
    return names


def remove_shm(names: list[str]) -> None:
    for name in names:
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:  # gone already (a stub that exited cleanly unlinks its own)
            pass
