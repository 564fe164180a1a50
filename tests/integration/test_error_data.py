"""Error codes travel between our models as data (tritonllm.errors), on the real server.

Triton 2.51 hands a BLS caller every error of a composing model as INTERNAL, and a gRPC stream carries only the
message: a caller of ours sets the request parameter ``errors_as_data`` and asks for ``error_code`` /
``error_message``, and our models answer a failure as a final response carrying them. Here: a refusal that starts
in the engine (a guide that does not compile) reaches a BLS caller as INVALID_ARG data through two hops, one
the BLS makes itself as data too, and tensorrt_llm answers its own refusals so; callers that do not ask (NVIDIA's
clients) keep getting Triton errors with the same message."""
from __future__ import annotations

import numpy as np

from robustness_helpers import stream_request, text_tensors

OURS = {"errors_as_data": True}
BLS, LLM = "tensorrt_llm_bls", "tensorrt_llm"
BLS_OUT = ["text_output", "finish_reason", "error_code", "error_message"]


def _s(value: str):
    return np.array([[value.encode()]], dtype=object)


def _data_failure(chunks, err):
    assert err is None, f"a Triton error, not data: {err}"
    (last,) = chunks
    assert set(last) == {"error_code", "error_message"}, last
    return last["error_code"].reshape(-1)[0].decode(), last["error_message"].reshape(-1)[0].decode()


def test_an_engine_refusal_reaches_a_bls_caller_of_ours_as_invalid_arg_data(triton_server):
    tensors = {**text_tensors("hi", 8), "guided_decoding_guide_type": _s("regex"), "guided_decoding_guide": _s("[a-")}
    code, message = _data_failure(*stream_request(triton_server.grpc_url, BLS, tensors, parameters=OURS,
                                                  outputs=BLS_OUT))
    assert code == "INVALID_ARG" and "guided_decoding_guide" in message, message
    chunks, err = stream_request(triton_server.grpc_url, BLS, tensors)  # NVIDIA's way: a Triton error
    assert not chunks and err is not None and message in str(err), err


def test_the_bls_and_tensorrt_llm_answer_their_own_refusals_as_data(triton_server):
    code, message = _data_failure(*stream_request(triton_server.grpc_url, BLS, text_tensors("hi", 0),
                                                  parameters=OURS, outputs=BLS_OUT))
    assert code == "INVALID_ARG" and "max_tokens" in message, message
    ids = {"input_ids": np.array([[5, 6, 7]], np.int32), "input_lengths": np.array([[3]], np.int32),
           "request_output_len": np.array([[4]], np.int32), "beam_width": np.array([[2]], np.int32)}
    code, message = _data_failure(*stream_request(triton_server.grpc_url, LLM, ids, parameters=OURS,
                                                  outputs=["output_ids", "error_code", "error_message"]))
    assert code == "INVALID_ARG" and "beam_width" in message, message
    # and a request that succeeds carries no error outputs
    chunks, err = stream_request(triton_server.grpc_url, BLS, text_tensors("hi", 4), parameters=OURS, outputs=BLS_OUT)
    assert err is None and chunks and not any("error_code" in c for c in chunks), chunks
