"""Our engine as NVIDIA Dynamo workers, on the real processes (issue 16): Dynamo's frontend plus two
workers started by ``python -m tritonllm.dynamo.launch`` (what ``make serve-dynamo`` runs), loopback only,
file discovery, the event plane through our loopback broker. Clients: the ``openai`` SDK and plain HTTP.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from dynamo_helpers import DYNAMO_PY, Cluster, prompt_ids
from robustness_helpers import stream_request, text_tensors

PROMPT = "The future of AI is"


@pytest.fixture(scope="module")
def cluster(built_repository):
    if not DYNAMO_PY.exists():
        pytest.fail("build/dynamo-venv is missing: run `make dynamo-venv`", pytrace=False)
    c = Cluster("kv")
    try:
        yield c
    finally:
        c.stop()
    assert c.proc.returncode == 0, "".join(c.lines[-20:])
    for pid in c.worker_pids:  # every child gone with the process group's SIGTERM
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def _prompt_ids() -> list[int]:
    return prompt_ids(PROMPT)


def test_greedy_text_equals_make_serves_streamed_and_not(cluster, triton_server):
    """The same token ids (the frontend's /v1/completions encodes text without BOS, our preprocessing
    adds it: ids make the comparison exact) give make serve's text, through the openai SDK too."""
    want = stream_request(triton_server.grpc_url, "tensorrt_llm_bls", text_tensors(PROMPT, 10))[0][-1]["text_output"][0]
    ids = _prompt_ids()
    out = cluster.client.completions.create(model=cluster.model, prompt=ids, max_tokens=10, temperature=0)
    assert out.choices[0].text == want.decode() and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), 10)
    chunks = list(cluster.client.completions.create(model=cluster.model, prompt=ids, max_tokens=10, temperature=0, stream=True))
    assert len(chunks) >= 5 and "".join(c.choices[0].text for c in chunks if c.choices) == want.decode()
    chat = cluster.client.chat.completions.create(model=cluster.model, messages=[{"role": "user", "content": PROMPT}],
                                                   max_tokens=8, temperature=0)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 8


def test_unsupported_options_are_refused_by_name(cluster):
    out = cluster.completion(_prompt_ids(), 4, n=17)
    assert out.get("status") in (400, 422) and "n" in json.dumps(out), out
    out = cluster.completion(_prompt_ids(), 4, use_beam_search=True)
    assert out.get("status") == 400 and "use_beam_search" in json.dumps(out), out


def test_n_sequences_are_tritons(cluster, triton_server):
    """n > 1 as make serve serves num_return_sequences (lifecycle.Sequences on both fronts): sequence i samples
    with seed + i, so the same seeded request gives Triton's texts, choice by choice."""
    ids = _prompt_ids()
    kw = dict(max_tokens=12, temperature=1.0, top_p=0.9, seed=7)
    out = cluster.client.completions.create(model=cluster.model, prompt=ids, n=3, **kw)
    texts = {c.index: c.text for c in out.choices}
    assert sorted(texts) == [0, 1, 2] and len(set(texts.values())) > 1, texts  # sampled: they differ
    tensors = text_tensors(PROMPT, 12, num_return_sequences=np.array([[3]], np.int32),
                           temperature=np.array([[1.0]], np.float32), top_p=np.array([[0.9]], np.float32),
                           seed=np.array([[7]], np.uint64), stream=np.array([[False]]))
    chunks, err = stream_request(triton_server.grpc_url, "tensorrt_llm_bls", tensors)
    assert err is None, err
    want = {int(c["sequence_index"].reshape(-1)[0]): c["text_output"].reshape(-1)[0].decode() for c in chunks
            if "text_output" in c}
    assert texts == want
    assert out.usage.completion_tokens == 36 and out.usage.prompt_tokens == len(ids)  # the prompt counted once
    # Dynamo 1.6.1's frontend ends the response at the first finish_reason it reads, whatever the choice: the worker
    # sends every choice's tokens before any finish, so no text is lost, and exactly one choice reports its end.
    assert sorted(map(str, [c.finish_reason for c in out.choices])) == ["None", "None", "length"]
    streamed = {}
    for chunk in cluster.client.completions.create(model=cluster.model, prompt=ids, n=3, stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.text or "")
    assert streamed == want


def test_guided_decoding_is_tritons(cluster, triton_server):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    out = cluster.client.completions.create(model=cluster.model, prompt=_prompt_ids(), max_tokens=20, temperature=0,
                                            extra_body={"guided_json": schema})
    assert json.loads(out.choices[0].text)["answer"] in ("yes", "no")
    tensors = text_tensors(PROMPT, 20, guided_decoding_guide_type=np.array([[b"json_schema"]], dtype=object),
                           guided_decoding_guide=np.array([[json.dumps(schema).encode()]], dtype=object))
    chunks, err = stream_request(triton_server.grpc_url, "tensorrt_llm_bls", tensors)
    assert err is None and chunks[-1]["text_output"][0].decode() == out.choices[0].text
    regex = cluster.client.completions.create(model=cluster.model, prompt=_prompt_ids(), max_tokens=8, temperature=0,
                                              extra_body={"guided_regex": "(red|green|blue)!"})
    assert regex.choices[0].text in ("red!", "green!", "blue!")


def test_top_logprobs_through_dynamos_frontend(cluster):
    chat = cluster.client.chat.completions.create(model=cluster.model, messages=[{"role": "user", "content": PROMPT}],
                                                   max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert entry.logprob == pytest.approx(tops[0], abs=1e-4)  # greedy took the most likely token


def test_kv_router_sends_a_cached_prefix_to_the_worker_that_holds_it(cluster):
    """Prefixes of 5 full blocks: the first request of each lands somewhere; every repeat goes to the
    same worker with a cache hit, which only KV events (our BlockPool's, hashed by the router) explain."""
    rng = np.random.default_rng(0)
    placed = {}
    for k in range(4):
        prefix = rng.integers(10, 900, size=80).tolist()
        first = cluster.completion(prefix + [5], 2)["nvext"]
        placed[k] = first["worker_id"]["decode_worker_id"]
        time.sleep(0.5)  # events travel asynchronously
        for q in range(2):
            out = cluster.completion(prefix + [6 + q], 2)
            again = out["nvext"]
            assert again["worker_id"]["decode_worker_id"] == placed[k], (k, q)
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 80  # the engine's own prefix hits
            assert again["timing"]["kv_hit_rate"] == pytest.approx(5 / 6), again["timing"]  # 5 of 6 blocks cached


def test_cancelled_stream_frees_the_request(cluster):
    stream = cluster.client.completions.create(model=cluster.model, prompt=_prompt_ids(), max_tokens=1500, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
    got = 0
    for chunk in stream:
        got += 1
        if got == 3:
            break
    stream.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = cluster.metrics()
        inflight = re.search(rf'^dynamo_frontend_inflight_requests\{{model="{re.escape(cluster.model)}"\}} (\S+)', text, re.M)
        blocks = [float(v) for v in re.findall(r"^dynamo_frontend_worker_active_decode_blocks\{[^}]*\} (\S+)", text, re.M)]
        if inflight and float(inflight.group(1)) == 0 and not any(blocks):
            return
        time.sleep(0.5)
    pytest.fail("the cancelled request still holds the frontend or a worker's blocks:\n" + text[-2000:])


def test_nothing_listens_beyond_loopback(cluster):
    lines = cluster.listening()  # launcher, broker, frontend, workers
    assert lines, "no listening socket found for the cluster's processes"
    addrs = [line.split()[3] for line in lines]
    assert all(a.startswith("127.0.0.1:") or a.startswith("[::1]:") for a in addrs), addrs


def test_a_killed_worker_leaves_the_other_serving(cluster):
    os.kill(cluster.worker_pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    ok = 0
    while time.monotonic() < deadline and ok < 4:
        out = cluster.completion(_prompt_ids(), 4)
        ok = ok + 1 if "choices" in out else 0
        time.sleep(0.3)
    assert ok >= 4, out
