"""Stopping the server is always clean: the whole repository started and stopped several times, each stop sent while
requests are in flight. Each stop drains them (full answers), exits 0 within the exit timeout, and leaves no stub
crash in the log: our models print a Python fault trace on a fatal signal (triton_kit.trace_crashes), so a stub that
dies on the way out (as ~MetricFamily did, reaching a stub already gone) shows as "Fatal Python error" here."""
from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import READY_TIMEOUT_S
from tritonllm.serving.launcher import TritonServer, find_free_ports

ROOT = Path(__file__).resolve().parents[2]
CYCLES = 3
EXIT_TIMEOUT_S = 10
CRASH = re.compile(r"Fatal Python error|Segmentation fault|Signal \(11\)|Exit timeout expired|core dumped")


def _generate(server, model: str, answers: list) -> None:
    body = json.dumps({"text_input": "Name three colours.", "max_tokens": 24, "end_id": -1}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/generate", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        answers.append((r.status, json.loads(r.read())["text_output"]))


@pytest.mark.parametrize("cycle", range(CYCLES))
def test_stop_under_load_drains_and_no_stub_crashes(built_repository, cycle):
    http, grpc, metrics = find_free_ports(3)
    server = TritonServer(http, grpc, metrics, exit_timeout_s=EXIT_TIMEOUT_S,
                          log_path=ROOT / "build" / "logs" / f"pytest-shutdown-{cycle}-{http}.log")
    server.start(timeout=READY_TIMEOUT_S)
    try:
        answers: list = []
        clients = [threading.Thread(target=_generate, args=(server, model, answers))
                   for model in ("ensemble", "tensorrt_llm_bls", "ensemble")]
        for c in clients:
            c.start()
        time.sleep(0.3)  # the requests are in the engine when the stop arrives
        began = time.monotonic()
        code = server.stop(timeout=EXIT_TIMEOUT_S + 20)
        took = time.monotonic() - began
        for c in clients:
            c.join(30)
    finally:
        server.stop()
    log = server.read_log()
    crashes = [line for line in log.splitlines() if CRASH.search(line)]
    assert not crashes, f"{server.log_path}: {crashes}"
    assert code == 0 and took < EXIT_TIMEOUT_S, (code, took, server.log_path)
    assert len(answers) == 3 and all(status == 200 and text for status, text in answers), answers
