"""Shared pytest fixtures: a real tritonserver over this repository, and the `slow` marker.

- ``triton_server`` (session): runs build_scripts/build_all.py once, starts the real ``tritonserver``
  through ``tritonllm.serving.launcher`` on free ports with ``model_repository`` + ``ensembles`` (the default
  deployment: SmolLM2-135M-Instruct from its GGUF), waits for ``/v2/health/ready`` (300 s) and yields the
  ``TritonServer`` (``http_url``, ``grpc_url``, ``metrics_url`` as "localhost:PORT", ``log_path``). A failed start
  fails the test with the names of the models that did not load and the log tail. Torn down (drained) at the end
  of the session.
- ``toy_server`` (session): the same repository rendered with the LLM on the test toy (tests/toy_repository.py,
  built by build_all.py --toy in seconds, nothing trained): its random LoRA adapter as lora_task_id 1, and its chat
  template with a tools section.
- ``unary_server`` (session): the same repository served with ``--model-config-name unary`` (profile
  ``unary``: tensorrt_llm and tensorrt_llm_bls not decoupled, NVIDIA's ``decoupled_mode: false``), for
  plain ``infer()`` / ModelInfer / HTTP ``/infer`` clients; started on first use.
- ``int4_server`` (module): the toy repository with profile ``int4`` (tensorrt_llm over the toy's INT4 AWQ
  checkpoint).
- ``--fuzz-examples N``: test_contract_fuzz runs N random examples instead of its bounded, derandomized set (what
  `make soak` runs after its load); nothing is skipped by default.
- Stub deaths: Triton 2.51's Python backend has lost a stub under concurrent BLS calls and cancellations (seen on
  fast machines, in the tensorrt_llm_bls stub); the launcher's stub watchdog then restarts the server, as it does in
  production. A test during which a session server lost a stub fails, naming the watchdog's events: nothing is run
  again, so a regression that kills stubs is seen at once.
No mocks: the fixture is the server the README tells people to run.
"""
from __future__ import annotations

import json
import os
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
SERVERS: list = []       # every server the fixtures started: a stub lost by one fails the test it happened in


def pytest_addoption(parser):
    parser.addoption("--fuzz-examples", type=int, default=0,
                     help="test_contract_fuzz: this many random examples instead of the bounded derandomized set")


def pytest_configure(config):
    # Run in the background by a non-interactive shell (CI), pytest inherits SIGINT ignored, and every process it
    # starts would too (an ignored signal survives exec): tests that stop a server with Ctrl-C would wait in vain.
    # A handled signal is reset to its default at exec, so handling it here gives every child the default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _watchdog_events() -> list:
    return [e for s in SERVERS if s.watchdog is not None for e in s.watchdog.events]


PHASE_SECONDS: dict[str, float] = {}  # test directory -> setup + call + teardown seconds (make test's phase table)


def pytest_runtest_logreport(report):
    folder = report.nodeid.split("::")[0].rsplit("/", 1)[0]
    PHASE_SECONDS[folder] = PHASE_SECONDS.get(folder, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    target = os.environ.get("TRITONLLM_TEST_PHASES")  # set by build_scripts/make_test.py
    if target:
        Path(target).write_text(json.dumps(PHASE_SECONDS) + "\n")


@pytest.fixture(autouse=True)
def _no_stub_lost():
    """A session server that loses a stub while a test runs fails that test (the watchdog's events are the cause)."""
    before = len(_watchdog_events())
    yield
    lost = _watchdog_events()[before:]  # a death in the test's last second is noticed by the next test's check
    assert not lost, f"a server lost a Python stub during this test (watchdog events: {lost}); logs: " + \
        ", ".join(str(s.log_path) for s in SERVERS)
    restarting = [s for s in SERVERS if s.restarting]
    deadline = time.monotonic() + READY_TIMEOUT_S
    while any(s.restarting for s in restarting) and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.fixture(scope="session")
def built_repository() -> Path:
    """Everything the repository serves is built (default model, classical models, rendered configs), and the test
    toy the LoRA / AWQ / tool-template tests use (`make test` built all of it already: this only checks stamps)."""
    proc = subprocess.run([sys.executable, str(ROOT / "build_scripts" / "build_all.py"), "--toy"], cwd=ROOT,
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
def default_model_reference(built_repository):
    """transformers' model of the default GGUF (its GGUF loader, dequantized to fp32; ~15 s to load on 2 cores): the
    reference of the real-model parity tests, loaded once for all of them (test_real_model's greedy text,
    test_openai_embeddings' hidden states through ``.model``)."""
    import torch
    import transformers as tf

    gguf = ROOT / "build" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return tf.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                   dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def triton_server(built_repository):
    server = _serve("tritonserver")
    try:
        yield server
    finally:
        server.kill()  # a clean stop is test_shutdown.py's subject; here it would cost ~4 s


def _profile_server(profile: str, root: Path | None = None):
    server = _serve(profile, ["--model-config-name", profile], root)
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def unary_server(built_repository):
    yield from _profile_server("unary")


@pytest.fixture(scope="session")
def exact_server(built_repository):
    """Profile ``exact`` (activation_quantization none): the default model served with the float arithmetic whose
    greedy text and hidden states equal transformers' (test_real_model, test_openai_embeddings)."""
    yield from _profile_server("exact")


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
        server.kill()


@pytest.fixture(scope="module")
def int4_server(toy_root):
    """Profile ``int4`` of the toy repository: tensorrt_llm over the toy's AWQ variant (build/models/toy-int4-awq)."""
    yield from _profile_server("int4", toy_root)
