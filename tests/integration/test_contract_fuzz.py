"""Property-based fuzzing (hypothesis) of NVIDIA's contract as their clients can send it, on the real servers.

Each example is one request to ``ensemble``, ``tensorrt_llm_bls`` or ``tensorrt_llm`` (decoupled server,
gRPC stream; or the unary server, plain ``infer()``) built from the declared inputs of ``tritonllm.contract``:
a well-formed request (batch 1-3, required inputs, up to five optional ones with values a client would
send), then 0-2 mutations (a wild value of the right dtype: huge, negative, NaN, invalid UTF-8; a
missing input; a wrong dtype; a batch size of its own; an unknown input); then completed, cancelled at a
random moment, or stopped with NVIDIA's stop request (same stream, same id).

Properties: no request hangs; every refusal names an input, and is INVALID_ARG where the transport carries
a status (unary calls; in-stream errors are a message only on Triton 2.51 without the ``triton_grpc_error``
header, which crashed 2.51 under some sequences of errors and is not used); a cancelled request ends
CANCELLED or normally; and afterwards both servers are ready, every KV block is free and nothing is running.
``make test`` runs a bounded, derandomized set; ``--fuzz-examples 1500`` (``make soak``) a long random one.
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
def _wild(draw, t: C.Tensor, shape):
    """Any value of the input's dtype: huge, negative, NaN, invalid UTF-8, unknown guide types..."""
    n = int(np.prod(shape))
    if t.dtype == "TYPE_STRING":
        pool = st.one_of(st.text(max_size=12).map(lambda s: s.encode()), st.binary(max_size=6),
                         st.sampled_from([b"", b"\xff\xfe", b"json", b"regex", b"[a-z]+", b"{}", b"nonsense"]))
        return np.array([draw(pool) for _ in range(n)], dtype=object).reshape(shape)
    if t.dtype == "TYPE_BOOL":
        return np.array([draw(st.booleans()) for _ in range(n)], dtype=bool).reshape(shape)
    if t.dtype == "TYPE_UINT64":
        return np.array([draw(st.sampled_from([0, 1, 7, 2**63, 2**64 - 1])) for _ in range(n)], np.uint64).reshape(shape)
    if t.dtype in ("TYPE_FP32", "TYPE_FP16"):
        pool = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5, float("nan"), float("inf"), 1e9]),
                         st.floats(-3, 3, allow_nan=False, width=16))
        return np.array([draw(pool) for _ in range(n)], np.float16 if t.dtype == "TYPE_FP16" else np.float32).reshape(shape)
    pool = st.one_of(st.integers(-2, 8), st.sampled_from([0, -1, 4095, 4096, 10**6, 2**31 - 1]))
    return np.array([draw(pool) for _ in range(n)], np.int32).reshape(shape)


# Values a well-behaved client sends (name -> element strategy); inputs not listed are only sent wild.
TAME = {
    "max_tokens": st.integers(1, 6), "request_output_len": st.integers(1, 6), "min_tokens": st.integers(0, 3),
    "top_k": st.integers(0, 5), "runtime_top_k": st.integers(0, 5), "top_p": st.floats(0, 1),
    "runtime_top_p": st.floats(0, 1), "temperature": st.floats(0, 2), "repetition_penalty": st.floats(1, 1.3),
    "presence_penalty": st.floats(0, 0.5), "frequency_penalty": st.floats(0, 0.5), "length_penalty": st.just(1.0),
    "len_penalty": st.just(1.0), "seed": st.integers(0, 99), "end_id": st.integers(0, 4095),
    "pad_id": st.integers(0, 4095), "beam_width": st.just(1), "num_return_sequences": st.just(1),
    "lora_task_id": st.just(1), "exclude_input_in_output": st.booleans(), "return_log_probs": st.booleans(),
    "return_perf_metrics": st.booleans(), "return_num_input_tokens": st.booleans(),
    "return_num_output_tokens": st.booleans(), "stream": st.booleans(), "streaming": st.booleans(),
    "stop_words": st.sampled_from([b"the", b"a", b"", b" of"]), "bad_words": st.sampled_from([b"the", b""]),
    "runtime_top_p_decay": st.just(1.0), "runtime_top_p_min": st.floats(0, 1), "early_stopping": st.booleans(),
    "beam_search_diversity_rate": st.just(0.0), "draft_input_ids": st.integers(3, 4095),
    "decoder_input_lengths": st.just(1), "decoder_input_ids": st.integers(0, 4095),
}


def _tame(draw, t: C.Tensor, batch: int, width: int):
    dtype = np.dtype(C.numpy_dtype(t.dtype))
    if t.name in ("stop_words_list", "bad_words_list"):  # one word of `width` ids per row
        ids = [[draw(st.integers(3, 4095)) for _ in range(width)] for _ in range(batch)]
        return np.array([[row, [width] + [-1] * (width - 1)] for row in ids], np.int32)
    if t.name == "embedding_bias":
        return np.zeros((batch, 0), np.float32)
    dims = [width if d == -1 else d for d in t.dims]
    n = batch * int(np.prod(dims))
    return np.array([draw(TAME[t.name]) for _ in range(n)], dtype=dtype).reshape([batch, *dims])


@st.composite
def requests(draw):
    """A well-formed request of a random model, then 0-2 mutations (see the module docstring)."""
    model = draw(st.sampled_from(MODELS))
    inputs = C.by_name(C.MODEL_TENSORS[model][0])
    batch, width = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    if model == C.TENSORRT_LLM:
        tensors = {"input_ids": np.array([[draw(st.integers(3, 4095)) for _ in range(width)] for _ in range(batch)], np.int32),
                   "input_lengths": np.full((batch, 1), width, np.int32)}
    else:
        tensors = {"text_input": np.array([[draw(st.text(min_size=1, max_size=20)).encode()] for _ in range(batch)], dtype=object)}
    optional = sorted(n for n in TAME if n in inputs and n not in tensors)
    for name in ["max_tokens" if model != C.TENSORRT_LLM else "request_output_len",
                 *draw(st.lists(st.sampled_from(optional), max_size=5, unique=True))]:
        tensors[name] = _tame(draw, inputs[name], batch, width)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        kind = draw(st.sampled_from(["wild", "wild", "wild", "drop", "dtype", "batch", "bogus"]))
        name = draw(st.sampled_from(sorted(inputs)))
        t = inputs[name]
        dims = [width if d == -1 else d for d in t.dims]
        if kind == "wild":
            tensors[name] = _wild(draw, t, [batch, *dims])
        elif kind == "drop" and tensors:
            tensors.pop(draw(st.sampled_from(sorted(tensors))))
        elif kind == "dtype" and name in tensors:
            arr = tensors[name]
            tensors[name] = np.zeros(arr.shape, np.int32) if arr.dtype == object else arr.astype(_WRONG[t.dtype])
        elif kind == "batch":
            tensors[name] = _wild(draw, t, [draw(st.integers(1, 4)), *dims])
        elif kind == "bogus":
            tensors["bogus_input"] = np.zeros((batch, 1), np.int32)
    action = draw(st.sampled_from(["complete"] * 4 + ["cancel", "stop"] + ["unary"] * 2))
    if action == "cancel":  # long enough to be cancelled mid-generation (see _stream)
        for name in ("max_tokens", "request_output_len"):
            if name in tensors and tensors[name].dtype == np.int32 and tensors[name].size:
                tensors[name] = np.where(tensors[name] > 0, 64, tensors[name]).astype(np.int32)
    return model, tensors, action, draw(st.floats(0.0, 0.3))


# NVIDIA's stop request (inflight_batcher_llm_client.py): garbage input_ids, zero lengths, stop true.
NVIDIA_STOP = {"input_ids": np.empty([1, 1], np.int32), "input_lengths": np.zeros([1, 1], np.int32),
               "request_output_len": np.array([[0]], np.int32), "stop": np.array([[True]])}


def _names_an_input(message: str) -> bool:
    return any(re.search(rf"(?<![A-Za-z_]){re.escape(n)}(?![A-Za-z_])", message) for n in NAMES)


def _stream(server, model, tensors, action, delay):
    """(error or None, whether we cancelled). Raises queue.Empty on a hang (60 s without a response)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    cancelled = False
    try:
        client.async_stream_infer(model, grpc_inputs(tensors), request_id="fuzz", enable_empty_final_response=True)
        expected, finals = 1, 0
        if action == "stop":  # also reaches an ensemble's tensorrt_llm step, which carries the client's id
            time.sleep(delay)  # NVIDIA's stop request, on the same stream with the same id
            try:
                client.async_stream_infer(C.TENSORRT_LLM, grpc_inputs(NVIDIA_STOP), request_id="fuzz",
                                          enable_empty_final_response=True)
                expected = 2
            except InferenceServerException:  # the stream is gone (the request failed): nothing to stop
                pass
        if action == "cancel":
            # Mid-generation (64 tokens to go), so the cancellation meets a running request rather than the
            # completion of its last response, which Triton 2.51's gRPC frontend is known to race
            # (triton-inference-server/server #8034, #7368; fixed in 24.12 / 25.02).
            try:
                result, error = q.get(timeout=delay)
                if error is not None:
                    return error, False
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return None, False  # it was done already
                time.sleep(delay)
            except queue.Empty:
                pass
            cancelled = True
            client.stop_stream(cancel_requests=True)
            return None, True
        while finals < expected:
            result, error = q.get(timeout=60)
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


def _check(model, tensors, action, delay, decoupled, unary) -> str:
    """Runs one case; its outcome: answered, refused, cancelled."""
    if action == "unary":
        error, cancelled = _unary(unary, model, {k: v for k, v in tensors.items() if k not in ("stream", "streaming")}), False
    else:
        error, cancelled = _stream(decoupled, model, tensors, action, delay)
    if error is None:
        return "cancelled" if cancelled else "answered"
    status, message = str(error.status()), error.message()
    if cancelled and "CANCELLED" in status:
        return "cancelled"
    if "request has 0 inputs" in message:  # Triton's, for an ensemble request none of whose inputs reach its
        return "refused"                  # first step (no name to give: the request has none of its inputs)
    assert status == "None" or "INVALID_ARGUMENT" in status, (model, sorted(tensors), status, message)
    assert _names_an_input(message), (model, sorted(tensors), message)
    return "refused"


def _fuzz(decoupled, unary, examples, derandomize):
    outcomes: dict[tuple[str, str, str], int] = {}

    @settings(max_examples=examples, deadline=None, derandomize=derandomize, database=None,
              suppress_health_check=list(HealthCheck))
    @given(requests())
    def run(case):
        key = (case[0], case[2], _check(*case, decoupled, unary))
        outcomes[key] = outcomes.get(key, 0) + 1

    run()
    print(f"\ncontract fuzz: {sum(outcomes.values())} cases (model, action, outcome): "
          + ", ".join(f"{'/'.join(k)} {n}" for k, n in sorted(outcomes.items())))
    for server in (decoupled, unary):
        m = wait_idle(server.metrics_url, timeout=60)
        assert m.get("llm_kv_cache_usage_ratio") == 0.0 and m.get("llm_requests_running") == 0, m
        assert server.is_ready()


def test_contract_fuzz(triton_server, unary_server, pytestconfig):
    """80 derandomized examples (the same every run), or ``--fuzz-examples N`` random ones (`make soak`)."""
    random_examples = pytestconfig.getoption("--fuzz-examples")
    _fuzz(triton_server, unary_server, examples=random_examples or 80, derandomize=not random_examples)
