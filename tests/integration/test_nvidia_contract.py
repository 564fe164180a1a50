"""NVIDIA's contract as their own clients use it, on the real (decoupled) server: each point of issue 14.

Written against what NVIDIA's scripts send and read (TensorRT-LLM ``triton_backend/inflight_batcher_llm/
client/*.py``, ``tools/inflight_batcher_llm/*.py``, ``ci/L0_backend_trtllm/*``), in our own words:
- ``text_output`` is flat: ``result.as_numpy("text_output")[0]`` is bytes, streamed or not;
- ``return_perf_metrics`` returns the ten perf tensors on every response, with TensorRT-LLM's meaning;
  ``num_input_tokens`` / ``num_output_tokens`` come when asked for, the latter per response;
- NVIDIA's stop request (garbage ``input_ids`` [1, 1], ``input_lengths`` 0, ``request_output_len`` 0,
  ``stop`` true, same request id, same stream) ends the running request normally and frees its blocks;
- a batch of N rows is answered row by row with ``batch_index``, by ensemble, BLS and tensorrt_llm;
- preprocessing emits NVIDIA's decoder ids, and tensorrt_llm takes them;
- errors of raw tensorrt_llm requests name its inputs only; through the ensemble also the ensemble's;
- NVIDIA's metric families exist with their labels and follow the engine; under load the Gateway API
  Inference Extension's readings (waiting requests, KV fraction) are right, and the iteration stats
  logged at verbose level equal the scraped values (what NVIDIA's custom-metrics test compares).
"""
from __future__ import annotations

import json
import queue
import random
import re
import shutil
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from robustness_helpers import (dedicated_server, grpc_inputs, ids_of, ids_tensors, stream_request, text_tensors,
                                throwaway_repository, unary_request, wait_idle)
from tritonllm import contract as C

BLOCK = 16  # deployment.yaml tokens_per_block
MAX_SEQS = 16  # deployment.yaml max_num_sequences


def _ids(n: int, seed: int) -> list[int]:
    """A prompt nobody else sends (the prefix cache must start cold for it)."""
    rng = random.Random(seed * 7919 + time.monotonic_ns())
    return [rng.randrange(10, 4000) for _ in range(n)]


def _ok(chunks_err):
    chunks, err = chunks_err
    assert err is None, err
    return chunks


# --------------------------------------------------------------------------- 1. text_output is flat

@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_text_output_is_flat_so_index_zero_is_bytes(triton_server, model):
    for stream in (False, True):
        chunks = _ok(stream_request(triton_server.grpc_url, model, text_tensors("My name is", 12, stream=np.array([[stream]]))))
        assert chunks
        for c in chunks:
            assert c["text_output"].shape == (1,), (model, stream, c["text_output"].shape)
            assert isinstance(c["text_output"][0], bytes)


# --------------------------------------------------------------------------- 2. perf metrics and counts

def test_perf_metrics_on_every_response_with_tensorrt_llm_meaning(triton_server):
    prompt = _ids(40, 1)
    perf = {t.name: np.dtype(C.numpy_dtype(t.dtype)) for t in C.PERF_OUTPUTS}
    runs = []
    for _ in range(2):
        t0 = time.monotonic_ns()
        chunks = _ok(stream_request(triton_server.grpc_url, "tensorrt_llm", ids_tensors(
            prompt, 12, stream=True, return_perf_metrics=np.array([[True]]))))
        t1 = time.monotonic_ns()
        for c in chunks:  # every response, as TensorRT-LLM's backend writes them
            for name, dtype in perf.items():
                assert c[name].shape == (1, 1) and c[name].dtype == dtype, name
        last = {k: v.item() for k, v in chunks[-1].items() if k in perf}
        # steady-clock nanoseconds (CLOCK_MONOTONIC is one clock for every process of the machine)
        assert t0 <= last["arrival_time_ns"] <= last["first_scheduled_time_ns"] <= last["first_token_time_ns"] \
            <= last["last_token_time_ns"] <= t1, last
        assert last["acceptance_rate"] == 0.0 and last["total_draft_tokens"] == last["total_accepted_draft_tokens"] == 0
        runs.append(last)
    cold, warm = runs
    assert cold["kv_cache_reused_blocks"] == 0 and cold["kv_cache_alloc_total_blocks"] == -(-40 // BLOCK)
    assert 0 <= cold["kv_cache_alloc_new_blocks"] <= cold["kv_cache_alloc_total_blocks"]
    # the second run reuses every full prompt block but the one holding the last token (recomputed)
    assert warm["kv_cache_reused_blocks"] == (40 - 1) // BLOCK
    assert warm["kv_cache_alloc_total_blocks"] == -(-40 // BLOCK) - (40 - 1) // BLOCK
    wait_idle(triton_server.metrics_url)


def test_perf_metrics_and_counts_only_when_asked_for(triton_server):
    prompt = _ids(20, 2)
    plain = _ok(stream_request(triton_server.grpc_url, "tensorrt_llm", ids_tensors(prompt, 8, stream=True)))
    never = {t.name for t in C.PERF_OUTPUTS} | {"num_input_tokens", "num_output_tokens", "cum_log_probs",
                                                 "output_log_probs", "batch_index", "context_logits"}
    assert all(not (set(c) & never) for c in plain), [sorted(c) for c in plain]
    asked = dict(return_num_input_tokens=np.array([[True]]), return_num_output_tokens=np.array([[True]]))
    for stream in (True, False):
        chunks = _ok(stream_request(triton_server.grpc_url, "tensorrt_llm", ids_tensors(prompt, 8, stream=stream, **asked)))
        assert all(c["num_input_tokens"].tolist() == [[20]] for c in chunks)
        # NVIDIA's num_output_tokens: the ids of *that* response
        assert [c["num_output_tokens"].item() for c in chunks] == [c["output_ids"].shape[-1] for c in chunks]
        assert sum(c["num_output_tokens"].item() for c in chunks) == 8
    ens = _ok(stream_request(triton_server.grpc_url, "ensemble", text_tensors(
        "Once upon a time", 8, return_perf_metrics=np.array([[True]]), **asked)))
    assert {t.name for t in C.PERF_OUTPUTS} <= set(ens[-1]) and ens[-1]["num_output_tokens"].item() == 8


# --------------------------------------------------------------------------- 3. NVIDIA's stop request

def _stop_tensors():
    return {"input_ids": np.empty([1, 1], np.int32), "input_lengths": np.zeros([1, 1], np.int32),
            "request_output_len": np.array([[0]], np.int32), "stop": np.array([[True]])}


def test_nvidia_stop_request_ends_the_running_request_normally(triton_server):
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", grpc_inputs(ids_tensors(_ids(12, 3), 1500, stream=True)),
                                  request_id="nvidia-stop", enable_empty_final_response=True)
        generated, stop_sent, stop_answered, final = 0, False, False, False
        while not (final and stop_answered):
            result, error = q.get(timeout=60)
            assert error is None, error
            if result.as_numpy("output_ids") is None:  # the stop request's own empty answer
                stop_answered = True
                continue
            generated += result.as_numpy("output_ids").shape[-1]
            final = result.get_response().parameters["triton_final_response"].bool_param
            if not stop_sent:
                client.async_stream_infer("tensorrt_llm", grpc_inputs(_stop_tensors()), request_id="nvidia-stop")
                stop_sent = True
        assert 0 < generated < 1500, generated  # ended early, normally (no error), with what it had
    finally:
        client.stop_stream()
        client.close()
    m = wait_idle(triton_server.metrics_url)
    assert m["llm_kv_cache_usage_ratio"] == 0.0


def test_a_stop_request_without_an_id_is_refused_by_name(triton_server, unary_server):
    _, err = stream_request(triton_server.grpc_url, "tensorrt_llm", _stop_tensors())
    assert err is not None and err.message().startswith("stop:"), err
    _, err = unary_request(unary_server.grpc_url, "tensorrt_llm", _stop_tensors())  # a unary call has the status
    assert err is not None and err.status() == "StatusCode.INVALID_ARGUMENT" and "stop:" in err.message(), err


# --------------------------------------------------------------------------- 4. batches

PROMPTS = ("My name is", "The little dog", "Once upon a time")


def _singles(server, model, n):
    return ["".join(c["text_output"][0].decode() for c in _ok(stream_request(server.grpc_url, model, text_tensors(p, n))))
            for p in PROMPTS]


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_a_batch_is_answered_row_by_row_with_batch_index(triton_server, model):
    want = _singles(triton_server, model, 10)
    batch = {"text_input": np.array([[p.encode()] for p in PROMPTS], dtype=object),
             "max_tokens": np.full((3, 1), 10, np.int32)}
    for stream in (False, True):
        chunks = _ok(stream_request(triton_server.grpc_url, model, {**batch, "stream": np.full((3, 1), stream)}))
        got = ["", "", ""]
        for c in chunks:
            if "text_output" in c:
                got[c["batch_index"].item()] += c["text_output"][0].decode()
        assert got == want, (model, stream)


def test_tensorrt_llm_batch_rows_equal_single_requests(triton_server):
    a, b = _ids(9, 4), _ids(5, 5)
    singles = [ids_of(_ok(stream_request(triton_server.grpc_url, "tensorrt_llm", ids_tensors(p, 6)))) for p in (a, b)]
    padded = np.array([a, b + [0] * 4], np.int32)
    chunks = _ok(stream_request(triton_server.grpc_url, "tensorrt_llm", {
        "input_ids": padded, "input_lengths": np.array([[9], [5]], np.int32),
        "request_output_len": np.array([[6], [6]], np.int32), "end_id": np.array([[-1], [-1]], np.int32)}))
    rows = {c["batch_index"].item(): c["output_ids"].reshape(-1).tolist() for c in chunks}
    assert rows == {0: singles[0], 1: singles[1]}


# --------------------------------------------------------------------------- 5. decoder ids

def test_preprocessing_emits_nvidia_decoder_ids_and_tensorrt_llm_takes_them(triton_server):
    out, err = unary_request(triton_server.grpc_url, "preprocessing", {
        "QUERY": np.array([[b"My name is"]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32),
        "BAD_WORDS_DICT": np.array([[b""]], dtype=object), "STOP_WORDS_DICT": np.array([[b""]], dtype=object)})
    assert err is None, err
    assert out["DECODER_INPUT_ID"].tolist() == out["OUT_PAD_ID"].tolist()  # [[pad]]: a decoder-only model
    assert out["REQUEST_DECODER_INPUT_LEN"].tolist() == [[1]]
    chunks = _ok(stream_request(triton_server.grpc_url, "tensorrt_llm", {
        "input_ids": out["INPUT_ID"], "decoder_input_ids": out["DECODER_INPUT_ID"],
        "input_lengths": out["REQUEST_INPUT_LEN"], "request_output_len": out["REQUEST_OUTPUT_LEN"],
        "end_id": out["OUT_END_ID"], "pad_id": out["OUT_PAD_ID"]}))
    assert len(ids_of(chunks)) == 4


# --------------------------------------------------------------------------- 6. error names

def test_raw_errors_name_tensorrt_llm_inputs_and_ensemble_errors_also_the_clients(triton_server):
    _, err = stream_request(triton_server.grpc_url, "tensorrt_llm", ids_tensors([5, 6], 100000))
    assert err is not None and "request_output_len 100000" in err.message(), err
    assert "max_tokens" not in err.message() and "text_input" not in err.message(), err
    _, err = stream_request(triton_server.grpc_url, "ensemble", text_tensors("My name is", 100000))
    assert err is not None and "request_output_len (max_tokens) 100000" in err.message(), err
    _, err = stream_request(triton_server.grpc_url, "tensorrt_llm_bls", text_tensors("My name is", 100000))
    assert err is not None and "max_tokens 100000" in err.message() and "request_output_len" not in err.message(), err


# --------------------------------------------------------------------------- 7. NVIDIA's metric families

def _scrape(server) -> tuple[str, dict[tuple[str, str], float]]:
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(nv_trt_llm_\w+|nv_llm_\w+)\{([^}]*)\} (\S+)$', line)
        if m and 'model="tensorrt_llm"' in m.group(2):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            key = next((f"{k}={v}" for k, v in labels.items() if k not in ("model", "version")), "")
            out[(m.group(1), key)] = float(m.group(3))
    return text, out


def _scrape_when(server, condition, timeout: float = 30.0) -> tuple[str, dict[tuple[str, str], float]]:
    """The first scrape (polled: the adapter publishes about every 0.5 s) for which ``condition(parsed)`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        text, m = _scrape(server)
        if condition(m):
            return text, m
        assert time.monotonic() < deadline, f"the metrics never met the condition within {timeout:.0f} s"
        time.sleep(0.1)


def test_nvidia_families_and_labels_exist_as_their_backend_reports_them(triton_server):
    from tritonllm.metrics import NVIDIA_GAUGES, NVIDIA_TOKEN_HISTOGRAMS, TOKEN_LEN_BUCKETS

    wanted = {(family, f"{label}={value}") for family, (_, _, label, values) in NVIDIA_GAUGES.items()
              for value, _ in values}
    _ok(stream_request(triton_server.grpc_url, "ensemble", text_tensors("My name is", 8)))
    text, m = _scrape_when(triton_server, lambda m: wanted <= set(m))
    for family, (kind, _, label, values) in NVIDIA_GAUGES.items():
        assert f"# TYPE {family} {kind}" in text
        for value, _ in values:
            assert (family, f"{label}={value}") in m, (family, value)
            assert re.search(rf'{family}\{{[^}}]*model="tensorrt_llm"[^}}]*version="1"', text)
    for family, (_, kind, _) in NVIDIA_TOKEN_HISTOGRAMS.items():
        assert f"# TYPE {family} histogram" in text
        for le in [*(str(int(b)) for b in TOKEN_LEN_BUCKETS), "+Inf"]:  # NVIDIA's exact label order
            assert f'{family}_bucket{{model="tensorrt_llm",response_metric_type="{kind}",version="1",le="{le}"}}' in text
    assert m[("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type=tokens_per")] == BLOCK
    assert m[("nv_trt_llm_request_metrics", "request_type=max")] == MAX_SEQS
    ts = m[("nv_trt_llm_general_metrics", "general_type=timestamp")]
    assert abs(ts / 1e6 - time.time()) < 120  # microseconds since the epoch


@pytest.fixture(scope="module")
def verbose_server(built_repository):
    """tensorrt_llm on a server of its own, verbose from the start (NVIDIA's iteration stats are logged at
    verbose level): switching the level at run time through /v2/logging while stub threads log preceded
    both Triton 2.51 stub segfaults seen in CI (pymalloc, allocate_from_new_pool)."""
    repo = throwaway_repository({}, models=(C.TENSORRT_LLM,))
    try:
        with dedicated_server(repo, extra_args=["--log-verbose=1"]) as server:
            yield server
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def test_nvidia_metrics_follow_load_and_the_gateway_readings_are_right(verbose_server):
    """24 concurrent requests against 16 sequence slots: waiting and KV fraction rise, then fall back."""
    triton_server = verbose_server
    _, before = _scrape(triton_server)
    n = 24
    # long enough that the load outlasts several ~0.5 s metric publications (24 x 64 tokens on the real model take
    # ~9 s on 2 cores; the 5M toy once finished 48-token requests between two publications)
    threads = [threading.Thread(target=stream_request, args=(triton_server.grpc_url, "tensorrt_llm",
                                                            ids_tensors(_ids(30, 100 + i), 64)), daemon=True)
               for i in range(n)]
    for t in threads:
        t.start()
    seen_waiting, seen_fraction = 0.0, 0.0
    deadline = time.monotonic() + 300
    while any(t.is_alive() for t in threads):
        assert time.monotonic() < deadline, "the 24 requests did not finish within 300 s"
        for _ in range(3):  # gauges are set one by one: a scrape between two sets reads a torn pair; the next not
            _, m = _scrape(triton_server)
            waiting = m[("nv_trt_llm_request_metrics", "request_type=waiting")]
            used = m[("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type=used")]
            total = m[("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type=max")]
            fraction = m[("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type=fraction")]
            if fraction == pytest.approx(used / total):
                break
        assert fraction == pytest.approx(used / total) and 0 <= waiting <= n, (fraction, used, total, waiting)
        assert m[("nv_trt_llm_request_metrics", "request_type=scheduled")] <= MAX_SEQS
        seen_waiting, seen_fraction = max(seen_waiting, waiting), max(seen_fraction, fraction)
        time.sleep(0.15)
    for t in threads:
        t.join(timeout=60)
    assert seen_waiting >= 1 and seen_fraction > 0, (seen_waiting, seen_fraction)
    wait_idle(triton_server.metrics_url)
    it = ("nv_trt_llm_general_metrics", "general_type=iteration_counter")
    _, after = _scrape_when(triton_server, lambda m: m[it] >= before[it] + 48)
    for family in ("nv_llm_input_token_len_count", "nv_llm_output_token_len_count"):
        key = next(k for k in after if k[0] == family)
        assert after[key] - before.get(key, 0) >= n
    assert after[("nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type=used")] == 0
    # Idle reads idle: the last step counted the requests it finished; a router must not see a busy replica.
    for family, key in (("nv_trt_llm_request_metrics", "request_type=active"),
                        ("nv_trt_llm_request_metrics", "request_type=scheduled"),
                        ("nv_trt_llm_request_metrics", "request_type=waiting"),
                        ("nv_trt_llm_request_metrics", "request_type=context"),
                        ("nv_trt_llm_inflight_batcher_metrics", "inflight_batcher_specific_metric=generation_requests"),
                        ("nv_trt_llm_inflight_batcher_metrics", "inflight_batcher_specific_metric=total_context_tokens")):
        assert after[(family, key)] == 0, (family, key, after[(family, key)])
    # What NVIDIA's custom-metrics test compares: the last iteration stats logged == the scraped values.
    from tritonllm.metrics import NVIDIA_GAUGES

    line = [ln for ln in triton_server.log_path.read_text(errors="replace").splitlines() if "Active Request Count" in ln][-1]
    logged = json.loads(re.search(r"({.*})", line).group(1).replace('\\"', '"'))
    for family, (_, _, label, values) in NVIDIA_GAUGES.items():
        for value, stat in values:
            if stat != "Timestamp":
                assert float(logged[stat]) == after[(family, f"{label}={value}")], stat
