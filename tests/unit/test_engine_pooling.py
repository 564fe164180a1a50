"""Pooled requests (SamplingParams.pooling: embeddings) equal transformers' final hidden states pooled the same
way, in fp32, whether the prompt is computed in one step or in chunks, alone or beside generating requests, with
the prefix cache on, and after a preemption; every KV block comes back and no token is generated."""
from __future__ import annotations

import pytest
import torch

from engine_helpers import make_checkpoint
from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.request import InvalidRequest, SamplingParams

PROMPTS = [list(range(5, 45)), [9, 3, 7], list(range(100, 133))]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("pool"))


@pytest.fixture(scope="module")
def hidden(checkpoint):
    """prompt -> transformers' last_hidden_state (after the final norm), fp32."""
    import transformers as tf

    model = tf.AutoModel.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        return {tuple(p): model(torch.tensor([p])).last_hidden_state[0] for p in PROMPTS}


def _run(engine, requests):
    got, generated = {}, {}
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    admitted = {rid: engine.requests[rid] for rid, _, _ in requests}  # engine-side state, kept past the end
    while engine.has_work():
        for out in engine.step():
            generated[out.request_id] = generated.get(out.request_id, 0) + len(out.new_token_ids)
            if out.embedding is not None:
                assert out.finished and out.finish_reason == "stop" and out.num_prompt_tokens > 0
                got[out.request_id] = torch.tensor(out.embedding)
    assert engine.pool.num_free == engine.pool.num_blocks  # no KV kept
    return got, generated, admitted


@pytest.mark.parametrize("config", [dict(), dict(max_num_tokens=16, enable_chunked_prefill=True),
                                    dict(enable_prefix_caching=True, block_size=8)],
                         ids=["one-step", "chunked", "prefix-cache"])
def test_pooled_vectors_equal_transformers(checkpoint, hidden, config):
    engine = LLMEngine(checkpoint, EngineConfig(**{"max_kv_tokens": 512, "cpu_kernels": "torch", **config}))
    for _ in range(2):  # the second round finds the prompts' blocks in the prefix cache (when it is on)
        requests = [("gen", [7, 8, 9], SamplingParams(max_tokens=12, end_id=-1))]
        for i, p in enumerate(PROMPTS):
            requests += [(f"mean{i}", p, SamplingParams(pooling="mean")), (f"last{i}", p, SamplingParams(pooling="last"))]
        got, generated, _ = _run(engine, requests)
        assert generated["gen"] == 12 and all(generated[k] == 0 for k in got)
        for i, p in enumerate(PROMPTS):
            h = hidden[tuple(p)]
            torch.testing.assert_close(got[f"mean{i}"], h.mean(0), atol=2e-5, rtol=0)
            torch.testing.assert_close(got[f"last{i}"], h[-1], atol=2e-5, rtol=0)


def test_a_preempted_mean_starts_over(checkpoint, hidden):
    """A KV cache too small for everyone preempts; a mean recomputed from 0 must not count rows twice. The mean is
    the lowest priority and prefills 4 tokens a step, so the growing generations take its blocks mid-prompt."""
    engine = LLMEngine(checkpoint, EngineConfig(max_kv_tokens=64, block_size=8, cpu_kernels="torch",
                                                max_num_tokens=6, enable_chunked_prefill=True))
    requests = [(f"gen{i}", [7 + i, 8, 9], SamplingParams(max_tokens=40, end_id=-1)) for i in range(2)]
    requests.append(("mean", PROMPTS[0], SamplingParams(pooling="mean", priority=0.1)))
    got, _, admitted = _run(engine, requests)
    assert admitted["mean"].num_preemptions > 0  # the mean itself was preempted and recomputed
    torch.testing.assert_close(got["mean"], hidden[tuple(PROMPTS[0])].mean(0), atol=2e-5, rtol=0)


def test_an_unknown_pooling_is_refused_naming_it(checkpoint):
    engine = LLMEngine(checkpoint, EngineConfig(max_kv_tokens=64, cpu_kernels="torch"))
    with pytest.raises(InvalidRequest, match="pooling"):
        engine.add_request("x", [1, 2], SamplingParams(pooling="cls"))
