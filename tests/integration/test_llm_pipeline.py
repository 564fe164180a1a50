"""The LLM pipeline on the real tritonserver: `ensemble`, `tensorrt_llm_bls` and raw `tensorrt_llm`, over HTTP
(/generate, /generate_stream SSE) and gRPC streaming.

What is proven here (fixture `triton_server`, the demo model, greedy unless said otherwise):
- exact streaming: for every prompt, the non-streamed text equals the concatenated streamed deltas, on
  both protocols and both text models, equals the BLS's text, and equals decode() of the raw
  tensorrt_llm ids; seeded sampling (random-ish tokens, incl. multi-byte characters split across
  tokens) streams exactly too;
- stop strings (BLS): the text ends just before the first stop string, also one that straddles tokens,
  and generation stops early (num_output_tokens);
- 8 concurrent requests are each answered exactly as when sent alone;
- cancelling streams of tensorrt_llm_bls / tensorrt_llm frees the engine: with every sequence slot taken
  by long streams that are then cancelled, a new request is served at once (an ensemble stream ends for
  its client, but Triton 2.51 does not tell the running tensorrt_llm step: see that test);
- bad input: an error naming the client's input, and the server keeps serving.
"""
from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[2]
TEXT_MODELS = ("ensemble", "tensorrt_llm_bls")
PROMPTS = ("Once upon a time", "The little dog", "The \u201cquote\u201d is", "caf\u00e9 na\u00efve")
MAX_TOKENS = 24
TIMEOUT_S = 60

_GRPC_DTYPES = {np.dtype(object): "BYTES", np.dtype(np.int32): "INT32", np.dtype(np.bool_): "BOOL",
                np.dtype(np.float32): "FP32", np.dtype(np.uint64): "UINT64"}


# --------------------------------------------------------------------------- clients

def http_post(server, path: str, payload: dict) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def generate(server, model: str, **payload) -> dict:
    status, body = http_post(server, f"/v2/models/{model}/generate", payload)
    assert status == 200, f"{model} {payload}: HTTP {status} {body}"
    return json.loads(body)


def generate_stream(server, model: str, **payload) -> list[dict]:
    """Every SSE event of /generate_stream, in order (errors arrive as {"error": ...} events)."""
    status, body = http_post(server, f"/v2/models/{model}/generate_stream", {**payload, "stream": True})
    assert status == 200, f"{model} {payload}: HTTP {status} {body}"
    return [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]


def text_tensors(prompt: str | bytes, max_tokens: int = MAX_TOKENS, stream: bool = False, **extra) -> dict:
    """Client tensors of the ensemble / BLS (batch 1); extra values are taken as given (np arrays)."""
    raw = prompt.encode() if isinstance(prompt, str) else prompt
    return {"text_input": np.array([[raw]], dtype=object), "max_tokens": np.array([[max_tokens]], dtype=np.int32),
            "stream": np.array([[stream]]), **extra}


class GrpcStream:
    """One gRPC bidirectional stream (one client) carrying one request; collects its responses."""

    def __init__(self, server, model: str, tensors: dict):
        self.responses: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))
        inputs = []
        for name, arr in tensors.items():
            t = grpcclient.InferInput(name, list(arr.shape), _GRPC_DTYPES[arr.dtype])
            t.set_data_from_numpy(arr)
            inputs.append(t)
        self.client.async_stream_infer(model, inputs, enable_empty_final_response=True)

    def next(self):
        """(result, error, final) of the next response."""
        result, error = self.responses.get(timeout=TIMEOUT_S)
        if error is not None:
            return None, error, True
        return result, None, result.get_response().parameters["triton_final_response"].bool_param

    def collect(self) -> tuple[list, Exception | None]:
        results = []
        try:
            while True:
                result, error, final = self.next()
                if error is not None:
                    return results, error
                if result.get_response().outputs:
                    results.append(result)
                if final:
                    return results, None
        finally:
            self.close()

    def cancel(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def grpc_text(server, model: str, tensors: dict) -> list[str]:
    results, error = GrpcStream(server, model, tensors).collect()
    assert error is None, f"{model}: {error}"
    return [r.as_numpy("text_output").reshape(-1)[0].decode("utf-8") for r in results]


@pytest.fixture(scope="module")
def tokenizer(triton_server):
    """The tokenizer the server uses (preprocessing's tokenizer_dir, relative to its model directory)."""
    from tritonllm.model_files import load_hf_tokenizer

    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        value = client.get_model_config("preprocessing", as_json=True)["config"]["parameters"]["tokenizer_dir"]
    finally:
        client.close()
    path = Path(value["string_value"])
    path = path if path.is_absolute() else ROOT / "model_repository" / "preprocessing" / path
    return load_hf_tokenizer(path.resolve())


def llm_tensors(tokenizer, prompt: str, stream: bool, max_tokens: int = MAX_TOKENS) -> dict:
    ids = tokenizer.encode(prompt)  # add_special_tokens, as preprocessing does by default
    return {"input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
            "request_output_len": np.array([[max_tokens]], dtype=np.int32),
            "end_id": np.array([[tokenizer.eos_token_id]], dtype=np.int32), "streaming": np.array([[stream]])}


def llm_ids(server, tokenizer, prompt: str, stream: bool, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    results, error = GrpcStream(server, "tensorrt_llm", llm_tensors(tokenizer, prompt, stream, max_tokens)).collect()
    assert error is None, error
    return [r.as_numpy("output_ids").reshape(-1).tolist() for r in results]


@pytest.fixture(scope="module")
def greedy(triton_server) -> dict[str, str]:
    """Reference: the ensemble's non-streamed greedy text of each prompt."""
    return {p: generate(triton_server, "ensemble", text_input=p, max_tokens=MAX_TOKENS)["text_output"] for p in PROMPTS}


# --------------------------------------------------------------------------- exact streaming

@pytest.mark.parametrize("prompt", PROMPTS)
def test_every_path_gives_the_same_exact_text(triton_server, greedy, tokenizer, prompt):
    expected = greedy[prompt]
    assert expected, f"empty output for {prompt!r}"
    for model in TEXT_MODELS:
        assert generate(triton_server, model, text_input=prompt, max_tokens=MAX_TOKENS)["text_output"] == expected, model
        events = generate_stream(triton_server, model, text_input=prompt, max_tokens=MAX_TOKENS)
        assert not [e for e in events if "error" in e], events
        assert "".join(e["text_output"] for e in events) == expected, (model, [e["text_output"] for e in events])
        deltas = grpc_text(triton_server, model, text_tensors(prompt, stream=True))
        assert len(deltas) > 1 and "".join(deltas) == expected, (model, deltas)
        assert grpc_text(triton_server, model, text_tensors(prompt, stream=False)) == [expected], model
    streamed = llm_ids(triton_server, tokenizer, prompt, stream=True)
    whole = llm_ids(triton_server, tokenizer, prompt, stream=False)
    assert len(whole) == 1 and sum(streamed, []) == whole[0]
    assert tokenizer.decode(whole[0], skip_special_tokens=True) == expected


def test_demo_model_output_is_word_like(greedy):
    text = " ".join(greedy.values())
    letters = sum(c.isascii() and (c.isalpha() or c.isspace()) for c in text)
    assert letters / len(text) > 0.8, text
    assert sum(w.isalpha() and len(w) > 1 for w in text.split()) >= 8, text


def test_seeded_sampling_streams_exactly_including_multibyte_characters(triton_server):
    """Sampling draws byte-level tokens that split UTF-8 characters (and invalid byte runs, which both
    paths show as U+FFFD alike); a seed makes streamed and non-streamed runs draw the same tokens.
    The demo model rarely samples non-ASCII, so seeds are tried until one does (about 1 in 4 at this
    temperature). top_p=1: with NVIDIA's semantics top_k=0 and top_p=0 (the defaults) mean greedy."""
    non_ascii = ""
    for seed in range(16):
        params = dict(text_input=PROMPTS[2], max_tokens=48, temperature=2.5, top_p=1.0, seed=seed)
        whole = {m: generate(triton_server, m, **params)["text_output"] for m in TEXT_MODELS}
        assert whole["ensemble"] == whole["tensorrt_llm_bls"], (seed, whole)
        for model in TEXT_MODELS:
            events = generate_stream(triton_server, model, **params)
            assert "".join(e["text_output"] for e in events) == whole[model], (model, seed)
        non_ascii += "".join(c for c in whole["ensemble"] if not c.isascii())
        if non_ascii.strip("\ufffd"):  # a real multi-byte character went through: proven
            break
    assert non_ascii, "16 seeds sampled no non-ASCII character: the test proves less than it claims"


# --------------------------------------------------------------------------- stop strings (BLS)

def _straddling_stop(text: str) -> str:
    """A 3-character piece of ``text`` around a space in its middle (so it spans two tokens)."""
    middle = len(text) // 2
    i = text.find(" ", middle)
    i = i if i > 0 else text.find(" ", 1)
    assert i > 0, f"no space to build a stop string from in {text!r}"
    return text[i - 1:i + 2]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_end_generation_and_are_cut(triton_server, greedy, stream):
    full = greedy[PROMPTS[0]]
    stop = _straddling_stop(full)
    expected = full[: full.index(stop)]
    params = dict(text_input=PROMPTS[0], max_tokens=MAX_TOKENS, stop_words=[stop, "\u2603never\u2603"],
                  return_num_output_tokens=True)
    if stream:
        events = generate_stream(triton_server, "tensorrt_llm_bls", **params)
        text = "".join(e["text_output"] for e in events)
        used = sum(e.get("num_output_tokens", 0) for e in events)  # NVIDIA's: each response's own tokens
    else:
        out = generate(triton_server, "tensorrt_llm_bls", **params)
        text, used = out["text_output"], out["num_output_tokens"]
    assert text == expected, (stop, text)
    assert used < MAX_TOKENS, "generation did not stop at the stop string"
    # No stop string in the text: all of it.
    out = generate(triton_server, "tensorrt_llm_bls", text_input=PROMPTS[0], max_tokens=MAX_TOKENS, stop_words=["\u2603"])
    assert out["text_output"] == full


# --------------------------------------------------------------------------- concurrency, cancellation

def test_eight_concurrent_requests_are_each_exact(triton_server, greedy):
    jobs = [(TEXT_MODELS[i % 2], PROMPTS[i % len(PROMPTS)], i % 3 == 0) for i in range(8)]

    def run(job):
        model, prompt, stream = job
        if stream:
            return "".join(grpc_text(triton_server, model, text_tensors(prompt, stream=True)))
        return generate(triton_server, model, text_input=prompt, max_tokens=MAX_TOKENS)["text_output"]

    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(run, jobs))
    assert texts == [greedy[p] for _, p, _ in jobs]


def _sequence_slots(server) -> int:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        params = client.get_model_config("tensorrt_llm", as_json=True)["config"]["parameters"]
    finally:
        client.close()
    return int(params["max_num_sequences"]["string_value"])


@pytest.mark.parametrize("model", ["tensorrt_llm", "tensorrt_llm_bls"])
def test_cancelled_streams_free_the_engine(triton_server, greedy, tokenizer, model):
    """Fill every sequence slot of the engine with long streams, cancel them after their first token:
    a new request must then run at once. Were the cancelled ones still generating (1500 tokens each),
    it would wait for a free slot far beyond the deadline."""
    long_tokens = 1500
    slots = _sequence_slots(triton_server)
    streams = []
    for i in range(slots):
        tensors = (llm_tensors(tokenizer, PROMPTS[i % len(PROMPTS)], True, long_tokens) if model == "tensorrt_llm"
                   else text_tensors(PROMPTS[i % len(PROMPTS)], long_tokens, stream=True))
        streams.append(GrpcStream(triton_server, model, tensors))
    for s in streams:  # every one is generating: it has sent something (and is not finished)
        result, error, final = s.next()
        assert error is None and not final, error
    for s in streams:
        s.cancel()
    start = time.monotonic()
    out = generate(triton_server, "ensemble", text_input=PROMPTS[1], max_tokens=MAX_TOKENS)
    elapsed = time.monotonic() - start
    assert out["text_output"] == greedy[PROMPTS[1]]
    assert elapsed < 8.0, f"a request after cancelling {slots} streams took {elapsed:.1f}s: slots not freed"


def test_cancelled_ensemble_stream_ends_for_the_client(triton_server, greedy):
    """Triton 2.51 checks an ensemble request's cancellation only between steps: the in-flight
    tensorrt_llm step is not told, so the engine finishes that sequence (up to max_tokens) while the
    client's stream ends at once. Cancellable generation needs tensorrt_llm_bls (or tensorrt_llm)."""
    stream = GrpcStream(triton_server, "ensemble", text_tensors(PROMPTS[0], 200, stream=True))
    result, error, final = stream.next()
    assert error is None and not final
    stream.cancel()
    assert generate(triton_server, "ensemble", text_input=PROMPTS[0], max_tokens=MAX_TOKENS)["text_output"] == greedy[PROMPTS[0]]


# --------------------------------------------------------------------------- bad input

BAD_HTTP = [
    ("missing text_input", {"max_tokens": 8}, "text_input"),
    ("empty text", {"text_input": "", "max_tokens": 8}, "text_input"),
    ("max_tokens zero", {"text_input": "hi", "max_tokens": 0}, "max_tokens"),
    ("max_tokens negative", {"text_input": "hi", "max_tokens": -4}, "max_tokens"),
    ("max_tokens beyond the model", {"text_input": "hi", "max_tokens": 1_000_000}, "max_tokens"),
    ("stop word too long", {"text_input": "hi", "max_tokens": 8, "stop_words": ["x" * 5000]}, "stop_words"),
]
BAD_GRPC = [
    ("invalid UTF-8 text", text_tensors(b"caf\xc3(\xff"), "text_input"),
    ("invalid UTF-8 stop word", text_tensors("hi", stop_words=np.array([[b"ok", b"\xe2\x82"]], dtype=object)),
     "stop_words"),
    ("stop words not strings", text_tensors("hi", stop_words=np.array([[1, 2]], dtype=np.int32)), "stop_words"),
]


@pytest.mark.parametrize("model", TEXT_MODELS)
def test_bad_input_names_the_input_and_the_server_keeps_serving(triton_server, greedy, model):
    for case, payload, name in BAD_HTTP:
        status, body = http_post(triton_server, f"/v2/models/{model}/generate", payload)
        assert status == 400, (case, status, body)
        assert name in json.loads(body)["error"], (case, body)
    for case, tensors, name in BAD_GRPC:
        results, error = GrpcStream(triton_server, model, tensors).collect()
        assert error is not None and not results, (case, results)
        assert name in str(error), (case, str(error))
    assert generate(triton_server, model, text_input=PROMPTS[0], max_tokens=MAX_TOKENS)["text_output"] == greedy[PROMPTS[0]]
