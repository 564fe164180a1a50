"""The `tensorrt_llm` model (our engine behind NVIDIA's contract) on the real server: streaming equals
non-streaming, bad input is INVALID_ARG naming the input, guided decoding through the ensemble,
cancellation frees the KV cache, and the LLM metrics on the metrics port move as they should."""
import json
import queue
import re
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from robustness_helpers import wait_idle

DTYPES = {np.int32: "INT32", np.bool_: "BOOL", np.float32: "FP32", np.uint64: "UINT64", np.object_: "BYTES"}


def _inputs(**arrays):
    out = []
    for name, arr in arrays.items():
        t = grpcclient.InferInput(name, list(arr.shape), DTYPES[arr.dtype.type])
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


class Stream:
    def __init__(self, url):
        self.client = grpcclient.InferenceServerClient(url)
        self.q: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.q.put((result, error)))

    def run(self, model, inputs, rid="r", timeout=120):
        """Returns (list of responses' arrays, error or None) of one request."""
        self.client.async_stream_infer(model, inputs, request_id=rid, enable_empty_final_response=True)
        chunks = []
        while True:
            result, error = self.q.get(timeout=timeout)
            if error is not None:
                return chunks, error
            resp = result.get_response()
            if resp.outputs:
                chunks.append({o.name: result.as_numpy(o.name) for o in resp.outputs})
            if resp.parameters["triton_final_response"].bool_param:
                return chunks, None

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)


def _ids_request(ids, n, **extra):
    arrays = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
              "request_output_len": np.array([[n]], np.int32), "end_id": np.array([[-1]], np.int32)}
    arrays.update(extra)
    return _inputs(**arrays)


def _metrics(server) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(llm_[a-z_]+)\{([^}]*)\} ([0-9.eE+-]+)$', line)
        if m and 'model="tensorrt_llm"' in m.group(2):
            key = m.group(1) + ("{" + re.search(r'le="[^"]*"', m.group(2)).group(0) + "}"
                                if "le=" in m.group(2) else "")
            out[key] = float(m.group(3))
    return out


def _metrics_when(server, condition, timeout: float = 30.0) -> dict[str, float]:
    """The first reading (polled; the adapter publishes about every 0.5 s) for which ``condition`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        m = _metrics(server)
        if condition(m):
            return m
        assert time.monotonic() < deadline, f"metrics never met the condition within {timeout:.0f} s: {m}"
        time.sleep(0.1)


def test_streaming_equals_non_streaming_ids(triton_server):
    s = Stream(triton_server.grpc_url)
    try:
        prompt = [5, 100, 200, 300, 42]
        full, err = s.run("tensorrt_llm", _ids_request(prompt, 12))
        assert err is None and len(full) == 1
        ids = full[0]["output_ids"].reshape(-1).tolist()
        assert len(ids) == 12 and full[0]["sequence_length"].reshape(-1)[0] == 12
        streamed, err = s.run("tensorrt_llm", _ids_request(prompt, 12, streaming=np.array([[True]])), "s")
        assert err is None
        assert [t for c in streamed for t in c["output_ids"].reshape(-1).tolist()] == ids
        assert streamed[-1]["is_final"].reshape(-1)[0]
        assert len({int(c["request_key"].reshape(-1)[0]) for c in streamed}) == 1
    finally:
        s.close()


def test_num_return_sequences_answer_on_their_own_with_sequence_index(triton_server):
    """NVIDIA's semantics (model_instance_state.cc): each sequence's responses carry sequence_index [1, 1],
    one final flag for the request; through the ensemble, each sequence is detokenized on its own."""
    s = Stream(triton_server.grpc_url)
    try:
        extra = dict(num_return_sequences=np.array([[3]], np.int32), temperature=np.array([[1.0]], np.float32),
                     runtime_top_k=np.array([[50]], np.int32), seed=np.array([[11]], np.uint64),
                     top_logprobs=np.array([[2]], np.int32), streaming=np.array([[True]]))
        chunks, err = s.run("tensorrt_llm", _ids_request([5, 100, 200, 300, 42], 8, **extra))
        assert err is None
        by_seq: dict[int, list[int]] = {}
        for c in chunks:
            ids = c["output_ids"].reshape(-1).tolist()
            by_seq.setdefault(int(c["sequence_index"].reshape(-1)[0]), []).extend(ids)
            assert c["top_log_prob_ids"].shape == (1, len(ids), 2) and c["top_log_probs"].shape == (1, len(ids), 2)
        # every sequence's 8 tokens came before the final flag, and nothing comes after it: one final flag
        assert sorted(by_seq) == [0, 1, 2] and all(len(v) == 8 for v in by_seq.values())
        with pytest.raises(queue.Empty):
            s.q.get(timeout=0.5)
        assert len({tuple(v) for v in by_seq.values()}) == 3  # seeds 11, 12, 13
        text, err = s.run("ensemble", _inputs(
            text_input=np.array([["Once upon a time"]], object), max_tokens=np.array([[6]], np.int32),
            num_return_sequences=np.array([[2]], np.int32), stream=np.array([[True]])), "e")
        assert err is None and {int(c["sequence_index"].reshape(-1)[0]) for c in text} == {0, 1}
        per_seq = ["".join(c["text_output"].reshape(-1)[0].decode() for c in text
                           if int(c["sequence_index"].reshape(-1)[0]) == i) for i in (0, 1)]
        assert per_seq[0] == per_seq[1] != ""  # greedy (NVIDIA's default): both sequences agree
    finally:
        s.close()


@pytest.mark.parametrize("extra,needle", [
    ({"input_ids": np.array([[5, 10 ** 6]], np.int32), "input_lengths": np.array([[2]], np.int32)},
     "outside the vocabulary"),
    ({"request_output_len": np.array([[0]], np.int32)}, "request_output_len"),
    ({"request_output_len": np.array([[10 ** 6]], np.int32)}, "max_seq_len"),
    ({"beam_width": np.array([[2]], np.int32)}, "beam_width"),
    ({"num_return_sequences": np.array([[17]], np.int32)}, "num_return_sequences"),
    ({"embedding_bias": np.array([[float("nan")] * 4], np.float32)}, "embedding_bias"),
    ({"top_logprobs": np.array([[21]], np.int32)}, "top_logprobs"),
    ({"priority": np.array([[1.5]], np.float32)}, "priority"),
    ({"temperature": np.array([[float("nan")]], np.float32)}, "temperature"),
    ({"runtime_top_p": np.array([[1.5]], np.float32)}, "runtime_top_p"),
    ({"stop_words_list": np.array([[[1, 2], [5, -1]]], np.int32)}, "stop_words_list"),
])
def test_bad_engine_input_is_invalid_arg(triton_server, extra, needle):
    s = Stream(triton_server.grpc_url)
    try:
        _, err = s.run("tensorrt_llm", _ids_request([5, 6, 7], 4, **extra))
        assert err is not None and needle in str(err), str(err)
        ok, err = s.run("tensorrt_llm", _ids_request([5, 6, 7], 4), "after")
        assert err is None and ok[0]["output_ids"].size == 4
    finally:
        s.close()


def test_guided_json_through_the_ensemble(triton_server):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
              "required": ["answer", "sure"], "additionalProperties": False}
    s = Stream(triton_server.grpc_url)
    try:
        chunks, err = s.run("ensemble", _inputs(
            text_input=np.array([["Is it a list?"]], object), max_tokens=np.array([[48]], np.int32),
            guided_decoding_guide_type=np.array([["json_schema"]], object),
            guided_decoding_guide=np.array([[json.dumps(schema)]], object)))
        assert err is None
        text = "".join(c["text_output"].reshape(-1)[0].decode() for c in chunks)
        obj = json.loads(text)
        assert obj["answer"] in ("yes", "no") and isinstance(obj["sure"], bool)
        _, err = s.run("ensemble", _inputs(
            text_input=np.array([["x"]], object), max_tokens=np.array([[8]], np.int32),
            guided_decoding_guide_type=np.array([["regex"]], object),
            guided_decoding_guide=np.array([["(unclosed"]], object)), "bad")
        assert err is not None and "guided_decoding_guide" in str(err)
    finally:
        s.close()


def test_guided_decoding_on_tensorrt_llm_itself(triton_server):
    """The same guide tensors straight to tensorrt_llm (token ids in and out): every output is in the language."""
    from clients.triton_llm import default_tokenizer_dir
    from dynamo_helpers import prompt_ids
    from tritonllm.model_files import load_hf_tokenizer

    tok = load_hf_tokenizer(default_tokenizer_dir())
    s = Stream(triton_server.grpc_url)
    try:
        for prompt in ("My favourite colour is", "The sky is"):
            chunks, err = s.run("tensorrt_llm", _ids_request(
                prompt_ids(prompt), 8, guided_decoding_guide_type=np.array([["regex"]], object),
                guided_decoding_guide=np.array([["(red|green|blue)!"]], object),
                end_id=np.array([[tok.eos_token_id]], np.int32)))
            assert err is None, err
            ids = [int(t) for c in chunks for t in c["output_ids"].reshape(-1)]
            assert tok.decode(ids, skip_special_tokens=True) in ("red!", "green!", "blue!"), ids
    finally:
        s.close()


def test_metrics_move_and_cancellation_frees_kv(triton_server):
    wait_idle(triton_server.metrics_url)  # what earlier tests generated is counted and published
    before = _metrics(triton_server)
    s = Stream(triton_server.grpc_url)
    try:
        _, err = s.run("tensorrt_llm", _ids_request(list(range(10, 40)), 16))
        assert err is None
    finally:
        s.close()
    ttft = "llm_time_to_first_token_seconds_count"
    after = _metrics_when(triton_server, lambda m: m[ttft] > before.get(ttft, 0) and m["llm_requests_running"] == 0
                          and m["llm_generation_tokens_total"] >= before.get("llm_generation_tokens_total", 0) + 16)
    assert after["llm_prompt_tokens_total"] - before.get("llm_prompt_tokens_total", 0) == 30
    assert after["llm_generation_tokens_total"] - before.get("llm_generation_tokens_total", 0) == 16
    assert after[ttft] == before.get(ttft, 0) + 1
    assert after['llm_time_to_first_token_seconds_bucket{le="+Inf"}'] == after[ttft]
    assert after["llm_cost_usd_total"] > before.get("llm_cost_usd_total", 0)
    assert after["llm_requests_running"] == 0 and after["llm_requests_waiting"] == 0
    assert after["llm_kv_cache_usage_ratio"] == 0.0

    # a long stream cancelled by the client: its blocks come back at once
    s = Stream(triton_server.grpc_url)
    s.client.async_stream_infer("tensorrt_llm", _ids_request(list(range(10, 60)), 1900,
                                                             streaming=np.array([[True]])), request_id="long")
    first, err = s.q.get(timeout=60)
    assert err is None
    _metrics_when(triton_server, lambda m: m["llm_requests_running"] >= 1)  # the long stream is running
    s.close(cancel=True)
    wait_idle(triton_server.metrics_url, timeout=20)  # no block and no request left
