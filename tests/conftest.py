"""Shared pytest fixtures: a real tritonserver over this repository, and the `slow` marker.

- ``triton_server`` (session): runs build_scripts/build_all.py once, starts the real ``tritonserver``
  through ``tritonllm.serving.launcher`` on free ports with ``model_repository`` + ``ensembles`` (the default
  deployment: SmolLM2-135M-Instruct from its GGUF), waits for ``/v2/health/ready`` (300 s) and yields the
  ``TritonServer`` (``http_url``, ``grpc_url``, ``metrics_url`` as "localhost:PORT", ``log_path``). A failed start
  fails the test with the names of the models that did not load and the log tail. Torn down (drained) at the end
  of the session.
- ``toy_server`` (session): the same repository rendered with the LLM on the demo toy (tests/toy_repository.py):
  its trained LoRA adapter as lora_task_id 1, and serving-mechanics tests whose many or long generations the real
  model would take minutes for on 2 cores.
- ``unary_server`` (session): the same repository served with ``--model-config-name unary`` (profile
  ``unary``: tensorrt_llm and tensorrt_llm_bls not decoupled, NVIDIA's ``decoupled_mode: false``), for
  plain ``infer()`` / ModelInfer / HTTP ``/infer`` clients; started on first use.
- ``int4_server`` (module): the toy repository with profile ``int4`` (tensorrt_llm over the toy's INT4 AWQ
  checkpoint).
- ``@pytest.mark.slow`` tests are skipped unless ``--run-slow`` is given.
- Stub deaths: Triton 2.51's Python backend occasionally loses a stub under concurrent BLS calls and
  cancellations (seen on fast machines, in the tensorrt_llm_bls stub); the launcher's stub watchdog then
  restarts the server, as it does in production. A test that fails while that happens is run once more
  (pytest-rerunfailures, condition: the watchdog recorded a stub death during the attempt), and every test
  starts only once a restart under way has finished, so one lost stub costs one rerun, not every test that
  would meet the restarting server. Reruns show as ``R`` and are counted in pytest's summary.
No mocks: the fixture is the server the README tells people to run.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from tritonllm.serving.launcher import ServerStartError, TritonServer, find_free_ports  # noqa: E402

READY_TIMEOUT_S = 300
WATCHDOG_NOTICE_S = 2.0  # the stub watchdog polls every 0.5 s and confirms a death for 0.5 s
SERVERS: list = []       # every server the fixtures started: whose watchdog events decide a rerun


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test, skipped unless --run-slow")
    # Run in the background by a non-interactive shell (CI), pytest inherits SIGINT ignored, and every process it
    # starts would too (an ignored signal survives exec): tests that stop a server with Ctrl-C would wait in vain.
    # A handled signal is reset to its default at exec, so handling it here gives every child the default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _watchdog_events() -> int:
    return sum(len(s.watchdog.events) for s in SERVERS if s.watchdog is not None)


def _stub_died_during(item):
    """rerunfailures' condition, asked after a failed attempt: did a server lose a stub meanwhile?"""
    def condition(error) -> bool:
        if error is None:  # asked after passing attempts too: nothing to wait for
            return False
        deadline = time.monotonic() + WATCHDOG_NOTICE_S
        while True:
            if _watchdog_events() != getattr(item, "_watchdog_events_at_start", None) or \
                    any(s.restarting for s in SERVERS):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
    return condition


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" in item.nodeid.split("::")[0]:
            item.add_marker(pytest.mark.flaky(reruns=1, condition=_stub_died_during(item)))
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: pass --run-slow to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _servers_steady(request):
    """Start each test on servers that are not in the middle of a watchdog restart."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while any(s.restarting for s in SERVERS) and time.monotonic() < deadline:
        time.sleep(0.2)
    request.node._watchdog_events_at_start = _watchdog_events()
    yield


@pytest.fixture(scope="session")
def built_repository() -> Path:
    """Everything the repository serves is built (default model, classical models, rendered configs), and the demo
    toy the LoRA / AWQ tests use."""
    proc = subprocess.run([sys.executable, str(ROOT / "build_scripts" / "build_all.py"), "--demo"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        pytest.fail(f"build_scripts/build_all.py failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}",
                    pytrace=False)
    return ROOT


def _serve(name: str, extra_args=(), root: Path | None = None):
    http_port, grpc_port, metrics_port = find_free_ports(3)
    repos = {} if root is None else {"repositories": [root / "model_repository", root / "ensembles"]}
    server = TritonServer(
        http_port, grpc_port, metrics_port, extra_args=list(extra_args), **repos,
        log_path=ROOT / "build" / "logs" / f"pytest-{name}-{http_port}.log",
        exit_timeout_s=5,  # the session is over: don't wait long on idle client connections
    )
    try:
        server.start(timeout=READY_TIMEOUT_S)
    except ServerStartError as e:
        pytest.fail(f"tritonserver did not start (log: {server.log_path}):\n{e}", pytrace=False)
    SERVERS.append(server)
    return server


@pytest.fixture(scope="session")
def triton_server(built_repository):
    server = _serve("tritonserver")
    try:
        yield server
    finally:
        server.stop()


def _profile_server(profile: str, root: Path | None = None):
    server = _serve(profile, ["--model-config-name", profile], root)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def unary_server(built_repository):
    yield from _profile_server("unary")


@pytest.fixture(scope="session")
def toy_root(built_repository):
    from toy_repository import toy_repository

    root = toy_repository()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def toy_server(toy_root):
    server = _serve("toy", root=toy_root)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def int4_server(toy_root):
    """Profile ``int4`` of the toy repository: tensorrt_llm over the toy's AWQ variant (build/models/demo-int4-awq)."""
    yield from _profile_server("int4", toy_root)
