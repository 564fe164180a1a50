"""Content-stamped, atomic, concurrency-safe builds of one output folder (shared by the build scripts).

Invariants:
- Up to date iff ``<out>/.build_stamp`` equals the caller's stamp (a hash of everything that determines the
  output) and every expected file is there; then nothing is imported or rebuilt.
- Atomic: the folder is built in a sibling temp dir and renamed into place; the old folder stays whole
  until the new one is complete; the stamp is written last.
- Concurrent builders of the same output serialise on a lock file; the second finds the stamp matching.
"""
from __future__ import annotations

import fcntl
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

STAMP = ".build_stamp"


def is_up_to_date(out: Path, stamp: str, files: Iterable[str]) -> bool:
    out = Path(out)
    return (out / STAMP).is_file() and (out / STAMP).read_text().strip() == stamp \
        and all((out / name).is_file() for name in files)


def build_atomically(out: Path, stamp: str, files: Iterable[str], build: Callable[[Path], None],
                     force: bool = False) -> bool:
    """Runs ``build(tmp_dir)`` unless up to date; returns True when it built."""
    files = tuple(files)
    out = Path(out).resolve()
    if not force and is_up_to_date(out, stamp, files):
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_up_to_date(out, stamp, files):
            return False
        for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a killed build (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            build(tmp)
            (tmp / STAMP).write_text(stamp + "\n")
            for path in [tmp, *tmp.rglob("*")]:  # mkdtemp (and safetensors) create owner-only modes
                path.chmod(0o755 if path.is_dir() else 0o644)
            old = out.with_name(f".{out.name}.tmp-old")
            if out.exists():
                out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True
