"""Prompt-lookup speculative decoding: greedy output identical to non-speculative decoding (and to HF),
drafts accepted on extractive text, blocks returned; combined with prefix caching and preemption."""
import pytest
import torch

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.request import SamplingParams
from tritonllm.engine.speculative import propose_ngram, verify_greedy

from engine_helpers import hf_greedy, make_checkpoint, random_prompts, run_staggered


def test_propose_ngram_takes_most_recent_match():
    toks = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose_ngram(toks, 2) == [7, 8]            # latest earlier "1 2 3" is followed by 7 8
    assert propose_ngram([4, 5, 6], 3) == []
    assert propose_ngram(toks, 0) == []


def test_propose_ngram_copies_with_overlap():
    """A match whose continuation runs into the end is copied on over the draft itself (period < k)."""
    assert propose_ngram([5, 1, 1, 1], 4) == [1, 1, 1, 1]                 # a run of one token
    assert propose_ngram([7, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]           # period 2
    assert propose_ngram([1, 2, 3, 1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1]  # period 3


def test_verify_greedy_accepts_matching_prefix():
    logits = torch.full((4, 10), -1.0)
    for row, tok in enumerate([3, 4, 9, 6]):
        logits[row, tok] = 1.0
    new, target = verify_greedy(logits, [3, 4, 5])
    assert new == [3, 4, 9] and target.tolist() == [3, 4, 9]
    assert verify_greedy(logits, [3, 4, 9])[0] == [3, 4, 9, 6]  # all accepted + bonus token


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


def _extractive_prompts():
    # a random model repeats little by itself: prompts that loop make drafts right often enough
    base = random_prompts(4, 211, 6, 10, seed=11)
    return [p * 4 for p in base] + random_prompts(2, 211, 5, 30, seed=12)


@pytest.mark.parametrize("extra", [{}, {"enable_prefix_caching": True}, {"max_kv_tokens": 96}])
def test_speculative_greedy_is_exact(ckpt, extra):
    prompts = _extractive_prompts()
    params = lambda i: SamplingParams(max_tokens=20, end_id=-1, return_log_probs=True)  # noqa: E731
    cfg = dict(block_size=4, max_kv_tokens=2048, max_num_tokens=64)
    cfg.update(extra)
    spec = LLMEngine(ckpt, EngineConfig(max_draft_len=4, **cfg))
    on, _ = run_staggered(spec, prompts, params)
    off, _ = run_staggered(LLMEngine(ckpt, EngineConfig(**cfg)), prompts, params)
    assert on == off
    assert on["0"] == hf_greedy(ckpt, prompts[0], 20)
    assert spec.stats.draft_tokens > 0
    assert spec.num_free_blocks == spec.pool.num_blocks


def test_speculative_logprobs_match(ckpt):
    prompt = _extractive_prompts()[1]

    def run(engine):
        engine.add_request("x", prompt, SamplingParams(max_tokens=16, end_id=-1, return_log_probs=True))
        outs = []
        while engine.has_work():
            outs += engine.step()
        return [t for o in outs for t in o.new_token_ids], [lp for o in outs for lp in o.new_logprobs]

    cfg = dict(block_size=4, max_kv_tokens=1024)
    spec = LLMEngine(ckpt, EngineConfig(max_draft_len=4, **cfg))
    ids_on, lp_on = run(spec)
    ids_off, lp_off = run(LLMEngine(ckpt, EngineConfig(**cfg)))
    assert ids_on == ids_off
    assert max(abs(a - b) for a, b in zip(lp_on, lp_off)) < 1e-4
    assert spec.stats.accepted_draft_tokens > 0


def test_rejection_sampling_preserves_the_distribution():
    """Each emitted first token must follow softmax(logits[0]) whatever the draft. 20,000 draws: the
    total variation distance to the target stays below 0.02 (its standard error here is ~0.005)."""
    from tritonllm.engine.request import SamplingParams as SP
    from tritonllm.engine.speculative import verify_sampled

    torch.manual_seed(0)
    logits = torch.randn(3, 6) * 1.5
    params = SP(temperature=0.8, top_p=1.0)
    target = torch.softmax(logits[0] / 0.8, -1)
    gen = torch.Generator().manual_seed(123)
    for draft in ([int(target.argmax())], [int(target.argmin()), 2]):
        counts = torch.zeros(6)
        accepted = 0
        for _ in range(20000):
            out, _ = verify_sampled(logits, draft, params, gen)
            counts[out[0]] += 1
            accepted += out[0] == draft[0]
        tvd = 0.5 * (counts / counts.sum() - target).abs().sum().item()
        assert tvd < 0.02, (draft, tvd)
        assert abs(accepted / 20000 - target[draft[0]].item()) < 0.02


def test_sampled_requests_draft_and_stay_seeded(ckpt):
    prompts = _extractive_prompts()
    params = lambda i: SamplingParams(max_tokens=20, end_id=-1, temperature=0.7, top_p=0.95, seed=7 + i)  # noqa: E731
    cfg = dict(block_size=4, max_kv_tokens=2048, max_num_tokens=64, max_draft_len=4)
    a_engine = LLMEngine(ckpt, EngineConfig(**cfg))
    a, _ = run_staggered(a_engine, prompts, params)
    b, _ = run_staggered(LLMEngine(ckpt, EngineConfig(**cfg)), prompts[:1], params)
    assert a["0"] == b["0"]                       # same seed, same tokens, whatever else is in the batch
    assert a_engine.stats.draft_tokens > 0 and a_engine.stats.accepted_draft_tokens > 0
    assert all(len(v) == 20 for v in a.values())
    assert a_engine.num_free_blocks == a_engine.pool.num_blocks
