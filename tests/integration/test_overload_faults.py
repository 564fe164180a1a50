"""Overload, KV exhaustion, a cancellation storm and faults, each on a real tritonserver (issue 8, parts
2-5). All are slow (a dedicated server each, or hundreds of requests): run with ``--run-slow``.

What is asserted is what Triton 2.51 + our backends actually do; where that falls short of the issue's
wish (a killed stub), the test pins the real behaviour and its docstring says so.
"""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import tempfile
import threading
import time
import urllib.request
import json
from pathlib import Path

import numpy as np
import pytest

from robustness_helpers import (ROOT, ids_of, ids_tensors, llm_metrics, rss_kib, stream_request, stub_pids,
                                throwaway_repository, unary_request, wait_idle)
from tritonllm.serving.launcher import ServerStartError, TritonServer, find_free_ports

pytestmark = pytest.mark.slow
PROMPT = list(range(10, 40))


@contextlib.contextmanager
def dedicated_server(repo: Path, extra_args=(), timeout=180):
    http, grpc, metrics = find_free_ports(3)
    server = TritonServer(http, grpc, metrics, repositories=[repo], exit_timeout_s=10, extra_args=list(extra_args),
                          log_path=ROOT / "build" / "logs" / f"pytest-h8-{http}.log")
    try:
        server.start(timeout=timeout)
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def llm_server(overrides: dict, **kw):
    repo = throwaway_repository(overrides)
    try:
        with dedicated_server(repo, **kw) as server:
            yield server
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def _concurrently(fn, n):
    out = [None] * n
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(i)), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a request hangs"
    return out


# --------------------------------------------------------------------------- 2. overload

def test_overload_4x_is_served_exactly_or_refused_at_once(built_repository):
    """Capacity 4 (2 running + 2 queued); 16 concurrent requests: each is exact or refused UNAVAILABLE fast."""
    with llm_server({"max_num_sequences": "2", "max_queue_size": "2"}) as server:
        ref, err = stream_request(server.grpc_url, "tensorrt_llm", ids_tensors(PROMPT, 64))
        assert err is None
        ref_ids = ids_of(ref)
        stub = stub_pids(server.process.pid, "tensorrt_llm")[0]
        rss_before = rss_kib(stub)

        def one(_):
            t0 = time.monotonic()
            chunks, err = stream_request(server.grpc_url, "tensorrt_llm", ids_tensors(PROMPT, 64), timeout=120)
            return time.monotonic() - t0, chunks, err

        results = []
        for _ in range(3):  # three waves, so the refusal path is exercised repeatedly
            results += _concurrently(one, 16)
        admitted = [dt for dt, chunks, err in results if err is None]
        refused = [(dt, err) for dt, chunks, err in results if err is not None]
        for dt, chunks, err in results:
            if err is None:
                assert ids_of(chunks) == ref_ids
            else:
                assert not chunks, "refused after output"
                assert "queue" in str(err).lower(), err  # QueueFull's message, sent as UNAVAILABLE
                assert dt < 3.0, f"refusal took {dt:.2f} s"
        assert len(admitted) >= 8 and refused, (len(admitted), len(refused))
        p99 = float(np.percentile(admitted, 99))
        print(f"\noverload: {len(results)} requests, {len(admitted)} admitted (p50 "
              f"{np.percentile(admitted, 50):.2f} s, p99 {p99:.2f} s), {len(refused)} refused "
              f"(max {max(dt for dt, _ in refused):.3f} s): {refused[0][1]}")
        m = wait_idle(server.metrics_url)
        assert m["llm_kv_cache_usage_ratio"] == 0.0 and m["llm_requests_running"] == 0
        assert rss_kib(stub) - rss_before < 300 * 1024, "stub RSS grew by more than 300 MiB"


# --------------------------------------------------------------------------- 3. KV exhaustion

def test_kv_exhaustion_preempts_and_outputs_stay_identical(built_repository):
    """16 KV blocks; 6 requests needing 8 blocks each: preemption by recompute, same greedy outputs."""
    overrides = {"max_tokens_in_paged_kv_cache": "256", "tokens_per_block": "16", "max_num_sequences": "8",
                 "enable_kv_cache_reuse": "false"}
    prompts = [[11 + 7 * i + j for j in range(20)] for i in range(6)]
    with llm_server(overrides) as server:
        alone = []
        for p in prompts:
            chunks, err = stream_request(server.grpc_url, "tensorrt_llm", ids_tensors(p, 100))
            assert err is None, err
            alone.append(ids_of(chunks))
        before = llm_metrics(server.metrics_url).get("llm_preemptions_total", 0)
        together = _concurrently(
            lambda i: stream_request(server.grpc_url, "tensorrt_llm", ids_tensors(prompts[i], 100, stream=i % 2 == 0)),
            len(prompts))
        for i, (chunks, err) in enumerate(together):
            assert err is None, err
            assert ids_of(chunks) == alone[i], f"request {i} differs after preemption"
        m = wait_idle(server.metrics_url)
        preempted = m["llm_preemptions_total"] - before
        print(f"\nkv exhaustion: 6 x 120 tokens over 256 KV tokens, {preempted:.0f} preemptions, outputs identical")
        assert preempted > 0
        assert m["llm_kv_cache_usage_ratio"] == 0.0


# --------------------------------------------------------------------------- 4. cancellation storm

@pytest.mark.parametrize("model", ["tensorrt_llm", "tensorrt_llm_bls"])
def test_cancellation_storm_frees_every_block(triton_server, model):
    """200 streams cancelled at random points (20 at a time); afterwards KV usage 0 and serving is exact."""
    import queue

    import tritonclient.grpc as grpcclient
    from robustness_helpers import grpc_inputs, text_of, text_tensors

    if model == "tensorrt_llm":
        good = ids_tensors(PROMPT, 24)
        tensors = lambda: ids_tensors(PROMPT, 400, stream=True)  # noqa: E731
    else:
        good = text_tensors("Once upon a time", 24)
        tensors = lambda: text_tensors("Once upon a time", 400, stream=np.array([[True]]))  # noqa: E731
    ref, err = stream_request(triton_server.grpc_url, model, good)
    assert err is None
    rng = random.Random(8)
    plan = [rng.randint(0, 30) for _ in range(200)]
    t0 = time.monotonic()

    def worker(w):
        for k in plan[w::20]:
            client = grpcclient.InferenceServerClient(triton_server.grpc_url)
            q: queue.Queue = queue.Queue()
            client.start_stream(callback=lambda result, error: q.put((result, error)))
            client.async_stream_infer(model, grpc_inputs(tensors()), enable_empty_final_response=True)
            for _ in range(k):
                r, e = q.get(timeout=60)
                if e is not None or r.get_response().parameters["triton_final_response"].bool_param:
                    break
            client.stop_stream(cancel_requests=True)
            client.close()
        return True

    assert all(_concurrently(worker, 20))
    elapsed = time.monotonic() - t0
    m = wait_idle(triton_server.metrics_url, timeout=60)
    print(f"\ncancellation storm ({model}): 200 streams in {elapsed:.1f} s; after: {m}")
    assert m["llm_kv_cache_usage_ratio"] == 0.0 and m["llm_requests_running"] == 0
    assert elapsed < 240
    again, err = stream_request(triton_server.grpc_url, model, good)
    assert err is None
    assert (ids_of(again) == ids_of(ref)) if model == "tensorrt_llm" else (text_of(again) == text_of(ref))


# --------------------------------------------------------------------------- 5. faults

def test_killed_stub_fails_fast_afterwards_and_is_not_restarted(built_repository):
    """Triton 2.51's Python backend does not restart a dead stub of this decoupled model: streams that were
    in flight get no final response (they end only by the client's timeout), every later request fails at
    once with "Stub process 'tensorrt_llm_0_0' is not healthy", while the model still reports READY. The
    recovery is to restart the server (or, in explicit model-control mode, reload the model)."""
    with llm_server({}) as server:
        box = {}

        def inflight():
            t0 = time.monotonic()
            chunks, err = _stream_or_timeout(server.grpc_url, ids_tensors(PROMPT, 1800, stream=True), 20)
            box["r"] = (time.monotonic() - t0, chunks, err)

        t = threading.Thread(target=inflight, daemon=True)
        t.start()
        time.sleep(1.5)
        (stub,) = stub_pids(server.process.pid, "tensorrt_llm")
        os.kill(stub, signal.SIGKILL)
        t.join(timeout=60)
        dt, chunks, err = box["r"]
        print(f"\nkilled stub: in-flight stream got {len(chunks)} chunks, then {err!r} after {dt:.1f} s")
        assert err is not None
        for _ in range(3):
            t0 = time.monotonic()
            chunks, err = stream_request(server.grpc_url, "tensorrt_llm", ids_tensors(PROMPT, 8), timeout=30)
            assert err is not None and "is not healthy" in str(err) and time.monotonic() - t0 < 10, err
        assert stub_pids(server.process.pid, "tensorrt_llm") == []
        assert server.stop() is not None  # shuts down despite the dead stub


def _stream_or_timeout(url, tensors, timeout):
    import queue
    try:
        return stream_request(url, "tensorrt_llm", tensors, timeout=timeout)
    except queue.Empty:
        return [], TimeoutError(f"no response within {timeout} s")


def _broken_llm_copies(tmp: Path) -> dict[str, str]:
    """Three copies of tensorrt_llm whose checkpoints are broken; returns model name -> file to be named."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    demo = ROOT / "build" / "models" / "demo"
    broken = {}
    for name, damage in (("llm_corrupt", "safetensors"), ("llm_missing", "missing"), ("llm_badconfig", "config")):
        ckpt = tmp / f"ckpt_{name}"
        if damage != "missing":
            shutil.copytree(demo, ckpt)
        if damage == "safetensors":
            for f in ckpt.glob("*.safetensors"):
                f.write_bytes(b"\x00\x01garbage" * 100)
            broken[name] = "model.safetensors"
        elif damage == "config":
            (ckpt / "config.json").write_text("{ not json")
            broken[name] = "config.json"
        else:
            broken[name] = str(ckpt)
        cfg = model_config_pb2.ModelConfig()
        text_format.Parse((ROOT / "model_repository" / "tensorrt_llm" / "config.pbtxt").read_text(), cfg)
        cfg.name = name
        cfg.parameters["gpt_model_path"].string_value = str(ckpt)
        cfg.parameters["tokenizer_dir"].string_value = str(demo)
        (tmp / "repo" / name / "1").mkdir(parents=True)
        (tmp / "repo" / name / "config.pbtxt").write_text(text_format.MessageToString(cfg))
    return broken


def test_broken_checkpoints_name_the_file_and_spare_other_models(built_repository):
    tmp = Path(tempfile.mkdtemp(prefix="h8-broken-"))
    try:
        broken = _broken_llm_copies(tmp)
        good = throwaway_repository({}, models=("tabular_rf",))
        shutil.move(str(good / "tabular_rf"), str(tmp / "repo" / "tabular_rf"))
        shutil.rmtree(good)
        # default (exit on error): the launcher's error names every failed model and its file
        with pytest.raises(ServerStartError) as e:
            with dedicated_server(tmp / "repo"):
                pass
        for name, needle in broken.items():
            assert name in str(e.value), (name, str(e.value)[-3000:])
        # keep serving what loads
        with dedicated_server(tmp / "repo", ["--exit-on-error=false", "--strict-readiness=false"]) as server:
            out, err = unary_request(server.grpc_url, "tabular_rf", {"input": np.zeros((1, 16), np.float32)})
            assert err is None and out["label"].shape == (1, 1)
            req = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST")
            index = {m["name"]: m for m in json.loads(urllib.request.urlopen(req, timeout=10).read())}
            assert index["tabular_rf"]["state"] == "READY"
            unnamed = []
            for name, needle in broken.items():
                assert index[name]["state"] == "UNAVAILABLE", index[name]
                if needle not in index[name].get("reason", ""):
                    unnamed.append(name)
            print("\nbroken checkpoints:", {n: index[n]["reason"][:160] for n in broken})
            assert not unnamed, unnamed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_shutdown_drains_in_flight_requests(built_repository):
    with llm_server({}) as server:
        ref, err = stream_request(server.grpc_url, "tensorrt_llm", ids_tensors(PROMPT, 600))
        assert err is None
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", stream_request(
            server.grpc_url, "tensorrt_llm", ids_tensors(PROMPT, 600, stream=True), timeout=60)), daemon=True)
        t.start()
        time.sleep(0.5)
        code = server.stop()
        t.join(timeout=60)
        chunks, err = box["r"]
        assert err is None and ids_of(chunks) == ids_of(ref), err
        assert code == 0
