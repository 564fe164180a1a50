"""`make test`: install what is missing, build what the tests serve, run pytest, and print where the time went.

Phases, each timed (a phase with nothing to do takes a second or less):
  install   the serving venv (.venv) first; then the Dynamo venv and genai-perf's venv (Makefile targets:
            reinstalled only when their inputs change), downloading beside the build below, their output in
            build/logs/make-test-<target>.log
  build     build_all.py --toy: native kernels (cached by source hash), the default model, the test toy (untrained,
            seconds), classical models, configs; one row per step
  pytest    `pytest tests` with PYTEST_ARGS, one row per test directory (setup + call + teardown of its tests), and
            the rest of the session's wall time (collection, imports, session teardown)
The table is printed at the end whether pytest passed or not, with the wall-clock total (rows that ran beside
others add up to more). pytest's exit code 5 (no test collected, e.g. a -k that matches nothing) is reported and not
a failure; every other code is make test's.

Runs with any Python 3 (stdlib only): it is what creates the venv.
Usage: python3 build_scripts/make_test.py [--pytest-args "-k render -x"]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
VENV = ("serving venv (.venv)", "venv")
BESIDE_BUILD = (("Dynamo venv (build/dynamo-venv)", "dynamo-venv"),
                ("genai-perf venv (build/perf/genai-venv)", "build/perf/genai-venv/bin/genai-perf"))
PHASES_ENV = "TRITONLLM_TEST_PHASES"  # tests/conftest.py writes {test directory: seconds} there


def _timed(rows: list[tuple[str, str, float]], phase: str, what: str, argv: list[str], env=None) -> int:
    print(f"==> [test] {phase}: {what}", flush=True)
    start = time.monotonic()
    code = subprocess.call(argv, cwd=ROOT, env=env)
    rows.append((phase, what, time.monotonic() - start))
    return code


def table(rows: list[tuple[str, str, float]], wall: float) -> str:
    width = max(len(what) for _, what, _ in rows)
    lines = [f"{'phase':<8} {'what':<{width}} {'seconds':>8}"]
    lines += [f"{phase:<8} {what:<{width}} {took:>8.1f}" for phase, what, took in rows]
    lines.append(f"{'total':<8} {'wall clock':<{width}} {wall:>8.1f}")
    return "\n".join(lines)


class Beside:
    """Make targets installing in the background (network and disk) while the build compiles (CPU)."""

    def __init__(self, make: list[str]):
        (ROOT / "build" / "logs").mkdir(parents=True, exist_ok=True)
        self.jobs = []
        for what, target in BESIDE_BUILD:
            log = ROOT / "build" / "logs" / f"make-test-{target.split('/')[-1]}.log"
            print(f"==> [test] install: {what}, beside the build (log {log.relative_to(ROOT)})", flush=True)
            with open(log, "w") as out:
                proc = subprocess.Popen(make + [target], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
            took: list[float] = []  # its own duration, measured when it ends (not when the build is done)
            start = time.monotonic()
            waiter = threading.Thread(target=lambda p=proc, t=took, s=start: (p.wait(), t.append(time.monotonic() - s)),
                                      daemon=True)
            waiter.start()
            self.jobs.append((what, target, log, proc, waiter, took))

    def wait(self, rows: list[tuple[str, str, float]]) -> bool:
        ok = True
        for what, target, log, proc, waiter, took in self.jobs:
            waiter.join()
            code = proc.returncode
            rows.append(("install", what, took[0]))
            if code != 0:
                ok = False
                print(f"==> [test] install of {what} failed (`make {target}`, exit {code}):\n"
                      f"{log.read_text(errors='replace')[-3000:]}", file=sys.stderr, flush=True)
        return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pytest-args", default="", help="passed to pytest (make test PYTEST_ARGS=...)")
    args = p.parse_args(argv)
    rows: list[tuple[str, str, float]] = []
    make = ["make", "--no-print-directory"]
    began = time.monotonic()
    try:
        what, target = VENV
        if _timed(rows, "install", what, make + [target]) != 0:
            print(f"==> [test] install of {what} failed: `make {target}` says why above", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory(prefix="make-test-") as tmp:
            build_times, phases = Path(tmp) / "build.json", Path(tmp) / "pytest.json"
            beside = Beside(make)
            print("==> [test] build: build_scripts/build_all.py --toy", flush=True)
            code = subprocess.call([str(PY), "build_scripts/build_all.py", "--toy", "--timings", str(build_times)],
                                   cwd=ROOT)
            rows += [("build", title, took) for title, took in json.loads(build_times.read_text()).items()] \
                if build_times.is_file() else []
            installed = beside.wait(rows)
            if code != 0:
                return code
            if not installed:
                return 2
            start = time.monotonic()
            # the slowest tests are listed every run: the budget (15 minutes for all of make test) is kept by them
            pytest_args = ["--durations=15", *shlex.split(args.pytest_args)]
            print(f"==> [test] pytest tests {' '.join(pytest_args)}", flush=True)
            code = subprocess.call([str(PY), "-m", "pytest", "tests", *pytest_args], cwd=ROOT,
                                   env={**os.environ, PHASES_ENV: str(phases)})
            wall = time.monotonic() - start
            by_dir = json.loads(phases.read_text()) if phases.is_file() else {}
            rows += [("pytest", folder, took) for folder, took in sorted(by_dir.items())]
            rows.append(("pytest", "collection, imports, session teardown", max(0.0, wall - sum(by_dir.values()))))
        if code == 5:
            print("==> [test] pytest collected no tests")
            return 0
        return code
    finally:
        if rows:
            print("\n==> [test] where the time went\n" + table(rows, time.monotonic() - began), flush=True)


if __name__ == "__main__":
    sys.exit(main())
