"""Property-based fuzzing (hypothesis) of NVIDIA's contract as their clients can send it, on the real servers.

Each example is one request to ``ensemble``, ``tensorrt_llm_bls`` or ``tensorrt_llm`` (decoupled server,
gRPC stream; or the unary server, plain ``infer()``) built from the declared inputs of ``tritonllm.contract``:
random subsets, batch sizes 1-3 (sometimes inconsistent across inputs), shapes, dtypes, values (huge,
negative, NaN, invalid UTF-8), missing required inputs and unknown extra ones; then completed, cancelled at a
random moment, or (tensorrt_llm) stopped with NVIDIA's stop request.

Properties: no request hangs; every refusal is INVALID_ARG whose message names an input (streams carry
Triton's ``triton_grpc_error`` header, so in-stream errors have a status too); a cancelled request ends
CANCELLED or normally; and afterwards both servers are ready, every KV block is free and nothing is running.
``make test`` runs a bounded, derandomized set; ``--run-slow`` a long random one (count in the closing note).
"""
from __future__ import annotations

import queue
import re
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from robustness_helpers import grpc_inputs, wait_idle
from tritonllm import contract as C

MODELS = (C.ENSEMBLE, C.BLS, C.TENSORRT_LLM)
# Every name an error may legitimately cite: any tensor of the pipeline, and the unknown one we send.
NAMES = sorted({t.name for ins, outs in C.MODEL_TENSORS.values() for t in (*ins, *outs)} | {"bogus_input"},
               key=len, reverse=True)
_WRONG = {"TYPE_INT32": np.float32, "TYPE_FP32": np.int32, "TYPE_BOOL": np.int32, "TYPE_UINT64": np.float32,
          "TYPE_STRING": np.int32, "TYPE_FP16": np.float32}
LENGTH_LIKE = {"max_tokens", "request_output_len", "min_tokens", "input_lengths"}
# Triton core checks a request against the config before any backend sees it (INVALID_ARG in its source);
# on a stream it reports those failures in-band even in triton_grpc_error mode, i.e. without a status.
# An ensemble request with none of preprocessing's inputs gets core's "request has 0 inputs" for that step.
CORE_CHECKS = re.compile(r"unexpected inference input|unexpected datatype|data-type is|unexpected shape|"
                         r"expected number of inputs|missing required input|batch size|inconsistent|"
                         r"exceeds maximum batch|request has 0 inputs")


def _values(draw, t: C.Tensor, shape):
    n = int(np.prod(shape))
    if t.dtype == "TYPE_STRING":
        if t.name.startswith("guided_decoding_guide_type"):
            pool = [b"json", b"regex", b"json_schema", b"ebnf_grammar", b"nonsense", b""]
            items = [draw(st.sampled_from(pool)) for _ in range(n)]
        else:
            items = [draw(st.one_of(st.text(max_size=12).map(lambda s: s.encode()), st.binary(max_size=6),
                                    st.sampled_from([b"", b"\xff\xfe", b"[a-z]+", b"{}"]))) for _ in range(n)]
        return np.array(items, dtype=object).reshape(shape)
    if t.dtype == "TYPE_BOOL":
        return np.array([draw(st.booleans()) for _ in range(n)], dtype=bool).reshape(shape)
    if t.dtype == "TYPE_UINT64":
        return np.array([draw(st.sampled_from([0, 1, 7, 2**63, 2**64 - 1])) for _ in range(n)], np.uint64).reshape(shape)
    if t.dtype in ("TYPE_FP32", "TYPE_FP16"):
        pool = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5, float("nan"), float("inf"), 1e9]),
                         st.floats(-3, 3, allow_nan=False, width=16))
        return np.array([draw(pool) for _ in range(n)], np.float16 if t.dtype == "TYPE_FP16" else np.float32).reshape(shape)
    if t.name in LENGTH_LIKE:
        pool = st.one_of(st.integers(1, 6), st.sampled_from([0, -1, 10**6]))
    elif t.name in ("input_ids", "draft_input_ids", "decoder_input_ids"):
        pool = st.one_of(st.integers(0, 4095), st.sampled_from([-1, 4096, 2**31 - 1]))
    else:
        pool = st.one_of(st.integers(-2, 8), st.sampled_from([2, 3, 4095, 10**6]))
    return np.array([draw(pool) for _ in range(n)], np.int32).reshape(shape)


@st.composite
def requests(draw):
    model = draw(st.sampled_from(MODELS))
    inputs = C.MODEL_TENSORS[model][0]
    batch = draw(st.integers(1, 3))
    width = draw(st.integers(1, 6))
    tensors = {}
    for t in inputs:
        if not draw(st.booleans() if t.optional else st.sampled_from([True] * 9 + [False])):
            continue
        b = batch if draw(st.integers(0, 9)) else draw(st.integers(1, 4))  # sometimes a batch size of its own
        dims = [width if d == -1 else d for d in t.dims]
        if t.name in ("stop_words_list", "bad_words_list"):
            dims = [2, width]
        if t.name == "embedding_bias":
            dims = [draw(st.sampled_from([0, 0, 3]))]
        tensors[t.name] = _values(draw, t, [b, *dims])
    if draw(st.integers(0, 9)) == 0 and tensors:  # a declared input with the wrong dtype
        name = draw(st.sampled_from(sorted(tensors)))
        tensors[name] = tensors[name].astype(_WRONG[C.by_name(inputs)[name].dtype]) if tensors[name].dtype != object \
            else np.zeros(tensors[name].shape, np.int32)
    if draw(st.integers(0, 14)) == 0:
        tensors["bogus_input"] = np.zeros((batch, 1), np.int32)
    action = draw(st.sampled_from(["complete"] * 4 + ["cancel", "stop"] + ["unary"] * 2))
    return model, tensors, action, draw(st.floats(0.0, 0.3))


def _names_an_input(message: str) -> bool:
    return any(re.search(rf"(?<![A-Za-z_]){re.escape(n)}(?![A-Za-z_])", message) for n in NAMES)


def _stream(server, model, tensors, action, delay):
    """(error or None, whether we cancelled). Raises queue.Empty on a hang (60 s without a response)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)),
                        headers={"triton_grpc_error": "true"})
    cancelled = False
    try:
        client.async_stream_infer(model, grpc_inputs(tensors), request_id="fuzz", enable_empty_final_response=True)
        expected, finals, t0 = 1, 0, time.monotonic()
        if action == "stop" and model == C.TENSORRT_LLM:
            time.sleep(delay)  # NVIDIA's stop request, on the same stream with the same id
            try:
                client.async_stream_infer(model, grpc_inputs({"stop": np.array([[True]])}), request_id="fuzz",
                                          enable_empty_final_response=True)
                expected = 2
            except InferenceServerException:  # the request failed and its error closed the stream
                pass
        while finals < expected:
            if action == "cancel" and time.monotonic() - t0 >= delay:
                cancelled = True
                client.stop_stream(cancel_requests=True)
                return None, True
            try:
                result, error = q.get(timeout=0.02 if action == "cancel" else 60)
            except queue.Empty:
                if action == "cancel":
                    continue
                raise
            if error is not None:
                return error, False
            finals += result.get_response().parameters["triton_final_response"].bool_param
        return None, False
    finally:
        if not cancelled:
            client.stop_stream()
        client.close()


def _unary(server, model, tensors):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.infer(model, grpc_inputs(tensors), client_timeout=60)
        return None
    except InferenceServerException as e:
        return e
    finally:
        client.close()


def _check(model, tensors, action, delay, decoupled, unary):
    if action == "unary":
        error, cancelled = _unary(unary, model, {k: v for k, v in tensors.items() if k not in ("stream", "streaming")}), False
    else:
        error, cancelled = _stream(decoupled, model, tensors, action, delay)
    if error is None:
        return
    status, message = str(error.status()), error.message()
    if cancelled and "CANCELLED" in status:
        return
    if "request has 0 inputs" in message:  # Triton core, see CORE_CHECKS
        assert "INVALID_ARGUMENT" in status or status == "None", (model, sorted(tensors), status, message)
        return
    if status == "None":  # in-band on a stream: only Triton core's own request checks come this way
        assert CORE_CHECKS.search(message), (model, sorted(tensors), message)
    else:
        assert "INVALID_ARGUMENT" in status, (model, sorted(tensors), status, message)
    assert _names_an_input(message), (model, sorted(tensors), message)


def _fuzz(decoupled, unary, examples, derandomize):
    @settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
              suppress_health_check=list(HealthCheck))
    @given(requests())
    def run(case):
        _check(*case, decoupled, unary)

    run()
    for server in (decoupled, unary):
        m = wait_idle(server.metrics_url, timeout=60)
        assert m.get("llm_kv_cache_usage_ratio") == 0.0 and m.get("llm_requests_running") == 0, m
        assert server.is_ready()


def test_contract_fuzz_bounded(triton_server, unary_server):
    _fuzz(triton_server, unary_server, examples=80, derandomize=True)


@pytest.mark.slow
def test_contract_fuzz_long(triton_server, unary_server):
    _fuzz(triton_server, unary_server, examples=1500, derandomize=False)
