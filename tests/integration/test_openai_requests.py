"""n > 1, top_logprobs, logit_bias, priority and timeouts through the OpenAI server, the BLS and our engine,
driven by the `openai` SDK against the real tritonserver (issue 18, points 3, 5 and 7)."""
from __future__ import annotations

import asyncio
import math
import time

import pytest

import openai  # noqa: E402

from openai_helpers import client, openai_url, tokenizer  # noqa: E402,F401  (fixtures)
from robustness_helpers import llm_metrics, wait_idle  # noqa: E402

ASK = [{"role": "user", "content": "Tell me a story about a dragon."}]





def _stream_by_choice(stream) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    return texts


def test_n_seeded_samples_are_distinct_and_stream_like_they_answer(client):
    kw = dict(model="tritonllm", messages=ASK, n=3, temperature=1.0, seed=7, max_tokens=24)
    reply = client.chat.completions.create(**kw)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) == 3, texts
    assert client.chat.completions.create(**kw).choices[2].message.content == texts[2]  # seeded: reproducible
    assert _stream_by_choice(client.chat.completions.create(stream=True, **kw)) == dict(enumerate(texts))
    one = client.chat.completions.create(**{**kw, "n": 1})
    assert one.choices[0].message.content == texts[0]  # sequence 0 samples with the request's own seed
    assert reply.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counts once


def test_completions_n_per_prompt_in_openais_order(client):
    reply = client.completions.create(model="tritonllm", prompt=["Once upon a time", "The king"], n=2,
                                      temperature=0, max_tokens=6)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    t = [c.text for c in reply.choices]
    assert t[0] == t[1] and t[2] == t[3] and t[0] != t[2]  # greedy: the n sequences of a prompt agree


def test_top_logprobs_are_the_most_likely_tokens(client):
    reply = client.chat.completions.create(model="tritonllm", messages=ASK, temperature=0, max_tokens=8,
                                           logprobs=True, top_logprobs=5)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert sum(math.exp(lp) for lp in tops) <= 1.0 + 1e-4  # a part of one distribution
        assert entry.logprob == pytest.approx(tops[0], abs=1e-4)  # greedy picked the most likely
    text = "".join(e.top_logprobs[0].token for e in content)
    assert text == reply.choices[0].message.content


def test_logit_bias_forces_and_bans_tokens(client, tokenizer):
    forced = tokenizer(" dragon", add_special_tokens=False).input_ids[0]
    reply = client.completions.create(model="tritonllm", prompt="Once upon a time", temperature=0, max_tokens=5,
                                      logit_bias={str(forced): 100})
    assert reply.choices[0].text == tokenizer.decode([forced] * 5)
    plain = client.completions.create(model="tritonllm", prompt="Once upon a time", temperature=0, max_tokens=5)
    first = tokenizer(plain.choices[0].text, add_special_tokens=False).input_ids[0]
    banned = client.completions.create(model="tritonllm", prompt="Once upon a time", temperature=0, max_tokens=5,
                                       logit_bias={str(first): -100})
    assert not banned.choices[0].text.startswith(tokenizer.decode([first]))
    with pytest.raises(openai.BadRequestError, match="logit_bias"):  # the ensemble has no input for it
        client.completions.create(model="ensemble", prompt="x", max_tokens=2, logit_bias={"5": 1})


def test_a_high_priority_request_overtakes_the_queue(openai_url, triton_server):
    """16 long requests fill every engine slot (max_num_sequences 16), 20 low-priority ones queue, then one
    high-priority request arrives: it is admitted with the first freed slots, ahead of lows that queued
    before it. First-come-first-served would admit 16 lows first, and the high one with the last four."""
    aclient = openai.AsyncOpenAI(base_url=f"{openai_url}/v1", api_key="unused", max_retries=0, timeout=300)
    first_token: dict[str, float] = {}
    ended: dict[str, float] = {}

    async def run(name: str, tokens: int, priority: float, started: asyncio.Event | None = None):
        stream = await aclient.completions.create(
            model="tritonllm", prompt=f"Request {name}:", max_tokens=tokens, temperature=0, stream=True,
            extra_body={"priority": priority, "min_tokens": tokens})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text and name not in first_token:
                first_token[name] = time.monotonic()
                if started is not None:
                    started.set()
        ended[name] = time.monotonic()

    async def scenario():
        events = [asyncio.Event() for _ in range(16)]
        # 16 x 200 tokens: ~11 s of the default model on 2 cores (~290 tokens/s at batch 16), so every slot stays
        # held well past the 1.4 s the lows and the high one take to arrive
        blockers = [asyncio.create_task(run(f"b{i}", 200, 0.5, e)) for i, e in enumerate(events)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 120)
        lows = []
        for i in range(20):
            lows.append(asyncio.create_task(run(f"low{i}", 4, 0.1)))
            await asyncio.sleep(0.02)  # arrival order, not a wait for anything
        deadline = time.monotonic() + 30  # every low is in the engine's queue before the high one is sent
        while (await asyncio.to_thread(llm_metrics, triton_server.metrics_url)).get("llm_requests_waiting", 0) < 20:
            assert time.monotonic() < deadline, "the 20 low-priority requests never all queued"
            await asyncio.sleep(0.1)
        assert not any(t.done() for t in blockers), "the blockers must still hold every slot"
        assert not any(n.startswith("low") for n in first_token), "the lows must be queued"
        submitted["high"] = time.monotonic()
        high = asyncio.create_task(run("high", 4, 0.9))
        await asyncio.gather(*blockers, *lows, high)

    submitted: dict[str, float] = {}
    asyncio.run(scenario())
    assert submitted["high"] < min(ended[f"b{i}"] for i in range(16)), "no slot may free before the high one queues"
    after_high = [n for n in first_token if n.startswith("low") and first_token[n] > first_token["high"]]
    # first-come-first-served admits the high one with the last four lows; by priority, five lows follow it
    assert len(after_high) >= 5, sorted(first_token.items(), key=lambda kv: kv[1])
    assert wait_idle(triton_server.metrics_url)["llm_kv_cache_usage_ratio"] == 0.0


def test_a_timeout_ends_the_request_and_frees_its_kv_blocks(client, triton_server):
    t0 = time.monotonic()
    reply = client.completions.create(model="tritonllm", prompt="Once upon a time", max_tokens=1900,
                                      temperature=0, extra_body={"allotted_time_ms": 300, "min_tokens": 1900})
    elapsed = time.monotonic() - t0
    assert 0 < reply.usage.completion_tokens < 1900 and elapsed < 10
    m = wait_idle(triton_server.metrics_url)
    assert m["llm_kv_cache_usage_ratio"] == 0.0 and m["llm_requests_running"] == 0
