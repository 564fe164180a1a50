"""Draft-model speculative decoding: a smaller checkpoint drafts, the target verifies. Greedy output equals
non-speculative decoding and HF whatever the drafter proposes (a poor drafter: many rejections; the
target as its own drafter: nearly all accepted); works with prefix caching, preemption, sampled requests
and aborts; both the target's and the drafter's blocks return to the pool."""
import pytest

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.request import SamplingParams

from engine_helpers import hf_greedy, make_checkpoint, random_prompts, run_staggered


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft")
    target = make_checkpoint(root / "target", "llama")
    small = make_checkpoint(root / "small", "llama", seed=5, num_hidden_layers=1, hidden_size=32,
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=48)
    return target, small


def _prompts():
    return random_prompts(6, 211, 3, 40, seed=21)


def _params(i):
    return SamplingParams(max_tokens=16, end_id=-1)


@pytest.mark.parametrize("extra", [{}, {"enable_prefix_caching": True}, {"max_kv_tokens": 96}])
@pytest.mark.parametrize("drafter", ["small", "self"])
def test_greedy_is_exact_whatever_the_drafter(ckpts, drafter, extra):
    target, small = ckpts
    cfg = dict(block_size=4, max_kv_tokens=2048, max_num_tokens=64)
    cfg.update(extra)
    engine = LLMEngine(target, EngineConfig(max_draft_len=3, draft_model_path=small if drafter == "small"
                                            else target, **cfg))
    prompts = _prompts()
    on, _ = run_staggered(engine, prompts, _params, arrive_every=2)
    off, _ = run_staggered(LLMEngine(target, EngineConfig(**cfg)), prompts, _params, arrive_every=2)
    assert on == off
    assert on["0"] == hf_greedy(target, prompts[0], 16)
    s = engine.stats
    assert s.draft_tokens > 0
    if drafter == "self" and not extra.get("max_kv_tokens"):
        assert s.accepted_draft_tokens / s.draft_tokens > 0.9, "the target drafting for itself must agree"
    assert engine.num_free_blocks == engine.pool.num_blocks
    assert engine.drafter.pool.num_free == engine.drafter.pool.num_blocks and not engine.drafter.states


def test_self_drafting_takes_fewer_steps(ckpts):
    target, _ = ckpts
    prompt = _prompts()[0]

    def steps(engine):
        engine.add_request("x", prompt, SamplingParams(max_tokens=24, end_id=-1))
        n = 0
        while engine.has_work():
            engine.step()
            n += 1
        return n

    cfg = dict(block_size=4, max_kv_tokens=1024)
    assert steps(LLMEngine(target, EngineConfig(max_draft_len=3, draft_model_path=target, **cfg))) <= 24 // 3
    assert steps(LLMEngine(target, EngineConfig(**cfg))) == 24


def test_sampled_requests_stay_seeded_and_blocks_return(ckpts):
    target, small = ckpts
    params = lambda i: SamplingParams(max_tokens=16, end_id=-1, temperature=0.8, top_p=0.95, seed=3 + i)  # noqa: E731
    cfg = dict(block_size=4, max_kv_tokens=2048, max_draft_len=3, draft_model_path=small)
    a_engine = LLMEngine(target, EngineConfig(**cfg))
    a, _ = run_staggered(a_engine, _prompts(), params)
    b, _ = run_staggered(LLMEngine(target, EngineConfig(**cfg)), _prompts()[:1], params)
    assert a["0"] == b["0"]
    assert all(len(v) == 16 for v in a.values())
    assert a_engine.drafter.pool.num_free == a_engine.drafter.pool.num_blocks


def test_abort_releases_drafter_blocks(ckpts):
    target, small = ckpts
    engine = LLMEngine(target, EngineConfig(block_size=4, max_kv_tokens=1024, max_draft_len=3,
                                            draft_model_path=small))
    engine.add_request("x", _prompts()[1], SamplingParams(max_tokens=30, end_id=-1))
    for _ in range(3):
        engine.step()
    assert engine.drafter.pool.num_free < engine.drafter.pool.num_blocks
    engine.abort("x")
    assert engine.drafter.pool.num_free == engine.drafter.pool.num_blocks
    assert engine.num_free_blocks == engine.pool.num_blocks


def test_drafter_with_another_vocabulary_is_refused(ckpts, tmp_path):
    target, _ = ckpts
    other = make_checkpoint(tmp_path / "other", "llama", vocab_size=300)
    with pytest.raises(ValueError, match="draft model vocabulary 300 differs from the target's 211"):
        LLMEngine(target, EngineConfig(max_kv_tokens=256, max_draft_len=2, draft_model_path=other))
