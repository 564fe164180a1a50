"""Stopping the server is always clean: the whole repository started and stopped several times, each stop sent while
requests are in flight. Each stop drains them (full answers), exits 0 within the exit timeout, and leaves no stub
crash in the log: our models print a Python fault trace on a fatal signal (triton_kit.trace_crashes), so a stub that
dies on the way out (as ~MetricFamily did, reaching a stub already gone) shows as "Fatal Python error" here."""
from __future__ import annotations

import json
import queue
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import READY_TIMEOUT_S
from robustness_helpers import wait_idle
from tritonllm.serving.launcher import TritonServer, find_free_ports

ROOT = Path(__file__).resolve().parents[2]
CYCLES = 3
EXIT_TIMEOUT_S = 10
CRASH = re.compile(r"Fatal Python error|Segmentation fault|Signal \(11\)|Exit timeout expired|core dumped")


def _started(tag: str) -> TritonServer:
    http, grpc, metrics = find_free_ports(3)
    server = TritonServer(http, grpc, metrics, exit_timeout_s=EXIT_TIMEOUT_S,
                          log_path=ROOT / "build" / "logs" / f"pytest-shutdown-{tag}-{http}.log")
    server.start(timeout=READY_TIMEOUT_S)
    return server


def _assert_clean_stop(server: TritonServer, code: int, took: float) -> None:
    crashes = [line for line in server.read_log().splitlines() if CRASH.search(line)]
    assert not crashes, f"{server.log_path}: {crashes}"
    assert code == 0 and took < EXIT_TIMEOUT_S, (code, took, server.log_path)


def _generate(server, model: str, answers: list, started: threading.Event) -> None:
    """A streamed request (SSE); ``started`` is set at its first event, when the engine is generating it."""
    body = json.dumps({"text_input": "Name three colours.", "max_tokens": 48, "end_id": -1, "stream": True}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/generate_stream", body,
                                     {"Content-Type": "application/json"})
    text = ""
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            for line in r:
                if line.startswith(b"data:"):
                    started.set()
                    event = json.loads(line[5:])
                    assert "error" not in event, event
                    text += event["text_output"]
        answers.append((r.status, text))
    finally:
        started.set()  # a request that failed before its first event must not leave the test waiting


@pytest.mark.parametrize("cycle", range(CYCLES))
def test_stop_under_load_drains_and_no_stub_crashes(built_repository, cycle):
    server = _started(str(cycle))
    try:
        answers: list = []
        started = [threading.Event() for _ in range(3)]
        clients = [threading.Thread(target=_generate, args=(server, model, answers, event))
                   for model, event in zip(("ensemble", "tensorrt_llm_bls", "ensemble"), started)]
        for c in clients:
            c.start()
        assert all(event.wait(60) for event in started)  # every request is generating when the stop arrives
        began = time.monotonic()
        code = server.stop(timeout=EXIT_TIMEOUT_S + 20)
        took = time.monotonic() - began
        for c in clients:
            c.join(30)
    finally:
        server.stop()
    _assert_clean_stop(server, code, took)
    assert len(answers) == 3 and all(status == 200 and text for status, text in answers), answers


def _leave_after_first_token(server, i: int, left: list) -> None:
    """A streamed tensorrt_llm request whose client cancels its gRPC stream after the first response (as the OpenAI
    server does when its own client leaves or every sequence met a stop string)."""
    def tensor(name, array):
        t = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == bool else "INT32")
        t.set_data_from_numpy(array)
        return t

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("tensorrt_llm", [
        tensor("input_ids", np.array([[1, 2, 3, 4 + i]], np.int32)), tensor("input_lengths", np.array([[4]], np.int32)),
        tensor("request_output_len", np.array([[48]], np.int32)), tensor("streaming", np.array([[True]]))],
        request_id=f"leaver-{i}", enable_empty_final_response=True)
    result, error = got.get(timeout=60)
    client.stop_stream(cancel_requests=True)
    client.close()
    left.append(error is None and result is not None)


def test_clients_that_cancel_their_streams_do_not_hold_the_model_at_stop(built_repository):
    """Many streams to tensorrt_llm cancelled at once (12 at a time, 96 in all): every cancelled request is answered
    and released, so the stop that follows unloads every model within the exit timeout. (Through the ensemble or the
    BLS, Triton 2.51 itself can keep the front model loaded after such cancellations until the exit timeout: see
    docs/nvidia_clients.md, "Cancelled streams and shutdown".)"""
    server = _started("cancelled")
    try:
        left: list = []
        with ThreadPoolExecutor(12) as pool:
            list(pool.map(lambda i: _leave_after_first_token(server, i, left), range(96)))
        wait_idle(server.metrics_url)  # every cancellation seen and answered, every block back
        began = time.monotonic()
        code = server.stop(timeout=EXIT_TIMEOUT_S + 20)
        took = time.monotonic() - began
    finally:
        server.stop()
    assert len(left) == 96 and all(left)
    _assert_clean_stop(server, code, took)
