"""The README's `make` targets that no other test runs, each run as written on a tiny budget: `make configs` /
`make check-configs` on the checkout, `make clean` / `make distclean` on a scratch tree laid out like a used
checkout (what each removes and what it keeps), `make serve-prod` refusing to start without its key, `make soak` for
a few seconds of load. `make serve` / `make openai` are test_readme.py's, `make perf` test_perf_llm.py's, `make test`
is this run; `make demo` (training), `make bench*` (minutes of load against peers built under build/peers) and
`make serve-dynamo` (test_dynamo.py runs the module it starts) are not run here."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}  # not an outer make's flags
    return subprocess.run(["make", "--no-print-directory", *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def test_make_configs_and_check_configs():
    rendered = make("configs")
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    assert "render_configs:" in rendered.stdout
    checked = make("check-configs")
    assert checked.returncode == 0 and "up to date" in checked.stdout, checked.stdout + checked.stderr


def _used_checkout(root: Path) -> None:
    shutil.copy(ROOT / "Makefile", root / "Makefile")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    for path in ("build/models/m/w.bin", "build/logs/x.log", "build/peers/llama.cpp/keep", "build/dynamo-venv/keep",
                 "build/perf/genai-venv/keep", "build/perf/summary.json", ".pytest_cache/v", ".venv/bin/python",
                 "model_repository/tabular_rf/1/model.onnx", "model_repository/tabular_rf/config.pbtxt",
                 "backends/x/__pycache__/m.pyc", "tritonllm.egg-info/PKG-INFO"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("x")


def test_make_clean_keeps_what_is_slow_to_rebuild_and_distclean_removes_everything(tmp_path):
    _used_checkout(tmp_path)
    cleaned = make("clean", cwd=tmp_path)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    left = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert left == {"Makefile", "pyproject.toml", "build/peers/llama.cpp/keep", "build/dynamo-venv/keep",
                    "build/perf/genai-venv/keep", ".venv/bin/python", "model_repository/tabular_rf/config.pbtxt",
                    "tritonllm.egg-info/PKG-INFO"}, left
    gone = make("distclean", cwd=tmp_path)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    left = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert left == {"Makefile", "pyproject.toml", "model_repository/tabular_rf/config.pbtxt"}, left


def test_make_serve_prod_refuses_to_start_without_its_key():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_ADMIN_KEY"}
    refused = subprocess.run(["make", "--no-print-directory", "serve-prod"], cwd=ROOT, capture_output=True,
                             text=True, timeout=600, env={k: v for k, v in env.items() if not k.startswith("MAKE")})
    assert refused.returncode != 0
    assert "serve-prod: set TRITON_ADMIN_KEY (see docs/security.md)" in refused.stdout + refused.stderr


def test_make_soak_for_a_few_seconds(tmp_path):
    """Mixed load against its own server, the report written and clean; then the reliability tests and the random
    contract fuzz it runs are collected, not run (this suite runs them already; the fuzz's option is accepted)."""
    report = tmp_path / "report.json"
    soak = make("soak", "SOAK_MINUTES=0.1", "SOAK_WORKERS=3", f"SOAK_ARGS=--out {report}",
                "PYTEST_ARGS=--collect-only -q -p no:cacheprovider", timeout=900)
    assert soak.returncode == 0, soak.stdout[-4000:] + soak.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["total"] > 0 and data["error_total"] == 0 and data["stubs_lost"] == [], data
    assert data["server_exit_code"] == 0 and data["running_after"] == 0, data
    assert "test_contract_fuzz.py::test_contract_fuzz" in soak.stdout, soak.stdout[-2000:]
    assert "test_overload_faults.py::test_overload_4x_is_served_exactly_or_refused_at_once" in soak.stdout
