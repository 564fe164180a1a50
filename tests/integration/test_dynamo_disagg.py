"""Disaggregated prefill / decode through Dynamo on the real processes (issue 16, point 5): the frontend, one
prefill worker and one decode worker (``launch --replicas 1 --prefill-workers 1``); the prompt's KV moves
from the prefill worker to the decode worker through NIXL (``dynamo.nixl_connect``, UCX on loopback)."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from dynamo_helpers import DYNAMO_PY, Cluster, prompt_ids
from robustness_helpers import stream_request, text_tensors

# 7 blocks of 16 tokens and a tail: the decode worker should compute only the block with the last token.
PROMPT = "The future of AI is " + "a story of many small models served well, " * 14


@pytest.fixture(scope="module")
def disagg(built_repository):
    if not DYNAMO_PY.exists():
        pytest.fail("build/dynamo-venv is missing: run `make dynamo-venv`", pytrace=False)
    c = Cluster("kv", replicas=1, extra=("--prefill-workers", "1"))
    try:
        yield c
    finally:
        c.stop()
    assert c.proc.returncode == 0, "".join(c.lines[-20:])


def _summary(log: Path) -> dict[str, int] | None:
    """The last "KV handoff: ..." counters a worker logged."""
    found = re.findall(r"KV handoff: (\d+) offered, (\d+) read, (\d+) blocks imported, (\d+) failed",
                       log.read_text(errors="replace") if log.exists() else "")
    if not found:
        return None
    return dict(zip(("offered", "read", "imported", "failed"), map(int, found[-1])))


def _wait_summary(log: Path, key: str, at_least: int) -> dict[str, int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = _summary(log)
        if s is not None and s[key] >= at_least:
            return s
        time.sleep(0.5)
    pytest.fail(f"{log.name}: no handoff summary with {key} >= {at_least}: {_summary(log)}", pytrace=False)


def test_disaggregated_greedy_text_equals_make_serves_and_the_kv_moved(disagg, triton_server):
    ids = prompt_ids(PROMPT)
    assert len(ids) > 7 * 16
    want = stream_request(triton_server.grpc_url, "tensorrt_llm_bls", text_tensors(PROMPT, 12))[0][-1]["text_output"][0]
    out = disagg.client.completions.create(model=disagg.model, prompt=ids, max_tokens=12, temperature=0)
    assert out.choices[0].text == want.decode() and out.usage.completion_tokens == 12
    blocks = (len(ids) - 1) // 16
    decode = _wait_summary(disagg.log_dir / f"dynamo-worker0-{disagg.port}.log", "imported", blocks)
    prefill = _wait_summary(disagg.log_dir / f"dynamo-prefill0-{disagg.port}.log", "offered", 1)
    assert decode == {"offered": 0, "read": 1, "imported": blocks, "failed": 0}
    assert prefill["failed"] == 0 and prefill["read"] == 0
    # streamed, through the SDK: the same text, and the second handoff of a prompt the decode worker already
    # holds installs nothing new (the blocks are cached there)
    chunks = list(disagg.client.completions.create(model=disagg.model, prompt=ids, max_tokens=12, temperature=0,
                                                   stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.decode()
    again = _wait_summary(disagg.log_dir / f"dynamo-worker0-{disagg.port}.log", "read", 2)
    assert again["imported"] == blocks and again["failed"] == 0


def test_disaggregated_short_prompt_and_chat(disagg):
    """A prompt within one block has no full block to hand over: the decode worker computes it."""
    out = disagg.client.completions.create(model=disagg.model, prompt=prompt_ids("Hi"), max_tokens=4, temperature=0)
    assert out.usage.completion_tokens == 4
    chat = disagg.client.chat.completions.create(model=disagg.model, messages=[{"role": "user", "content": PROMPT}],
                                                  max_tokens=6, temperature=0)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 6


def test_disaggregated_cluster_listens_on_loopback_only(disagg):
    addrs = [line.split()[3] for line in disagg.listening()]  # UCX's listeners included
    assert addrs and all(a.startswith("127.0.0.1:") or a.startswith("[::1]:") for a in addrs), addrs
