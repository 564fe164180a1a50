"""Moving a prompt's KV blocks between two engines (disaggregated prefill / decode): exact block ids, ref
counts and hit counts, and greedy output equal to HF's and to a single engine's."""
import pytest
import torch

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.kv_cache import prefix_hashes
from tritonllm.engine.kv_transfer import KVPrefix
from tritonllm.engine.request import SamplingParams
from tritonllm.engine.runner import EngineRunner

from engine_helpers import hf_greedy, make_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


def _engine(ckpt, **kw):
    cfg = dict(block_size=4, max_kv_tokens=256, max_num_tokens=64, enable_prefix_caching=True)
    cfg.update(kw)
    return LLMEngine(ckpt, EngineConfig(**cfg))


def _finish(eng, rid, prompt, n):
    eng.add_request(rid, prompt, SamplingParams(max_tokens=n, end_id=-1))
    out = []
    while eng.has_work():
        for o in eng.step():
            out += o.new_token_ids
    return out


PROMPT = list(range(20, 34))   # 14 tokens, block size 4: blocks 0..2 reusable, the 4th holds the last token


def test_prefix_hashes_stop_before_the_last_token():
    assert len(prefix_hashes(PROMPT, 4)) == 3
    assert len(prefix_hashes(PROMPT[:12], 4)) == 2      # 12 tokens: the 3rd block holds the last token
    assert prefix_hashes(PROMPT, 4, root=1) != prefix_hashes(PROMPT, 4)


def test_prefill_then_decode_on_another_engine_matches_hf(ckpt):
    prefill, decode = _engine(ckpt), _engine(ckpt)
    first = _finish(prefill, "p", PROMPT, 1)            # what a prefill worker runs: max_tokens 1
    kv = prefill.export_prefix(PROMPT)
    assert kv.num_blocks == 3 and tuple(kv.data.shape[:3]) == (prefill.spec.num_layers, 2, 12)
    free = decode.pool.num_free
    assert decode.import_prefix(PROMPT, kv) == 3
    assert decode.pool.num_free == free and decode.pool.num_cached == 3
    assert [decode.pool.ref_count(b) for b in range(3)] == [0, 0, 0]
    out = _finish(decode, "d", PROMPT, 6)
    assert out == hf_greedy(ckpt, PROMPT, 6) and out[0] == first[0]
    assert decode.scheduler.reused_blocks == 3          # the imported blocks were used, not recomputed
    assert decode.pool.num_free == decode.pool.num_blocks
    # The imported KV is bit-identical to what the decode engine computes for itself.
    again = decode.export_prefix(PROMPT)
    assert again.hashes == kv.hashes and torch.equal(again.data, kv.data)


def test_import_keeps_cached_blocks_and_refuses_foreign_chains(ckpt):
    src, dst = _engine(ckpt), _engine(ckpt)
    _finish(src, "p", PROMPT, 1)
    kv = src.export_prefix(PROMPT)
    assert dst.import_prefix(PROMPT, kv) == 3
    assert dst.import_prefix(PROMPT, kv) == 0           # already cached: nothing rewritten
    other = [99] + PROMPT[1:]
    assert dst.import_prefix(other, kv) == 0            # not this prompt's chain
    with pytest.raises(ValueError, match="does not match"):
        dst.import_prefix(PROMPT, KVPrefix(kv.hashes, kv.data[:, :, :4]))


def test_import_stops_when_no_block_is_free(ckpt):
    src, dst = _engine(ckpt), _engine(ckpt, max_kv_tokens=8)          # two blocks in all
    _finish(src, "p", PROMPT, 1)
    assert dst.import_prefix(PROMPT, src.export_prefix(PROMPT)) == 2
    assert dst.pool.num_free == 2


def test_export_of_an_uncached_prompt_is_empty(ckpt):
    eng = _engine(ckpt)
    kv = eng.export_prefix(PROMPT)
    assert kv.num_blocks == 0 and kv.data.shape[2] == 0


def test_runner_call_runs_on_the_engine_thread_in_order(ckpt):
    eng = _engine(ckpt)
    seen = []
    runner = EngineRunner(eng, seen.append).start()
    try:
        runner.submit("a", PROMPT, SamplingParams(max_tokens=1, end_id=-1))
        # commands apply in submission order before the next step: the request is in, not yet computed
        fut = runner.call(lambda e: ("a" in e.requests, e.requests["a"].num_computed))
        assert fut.result(30) == (True, 0)
        bad = runner.call(lambda e: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            bad.result(30)
        assert runner.call(lambda e: e.pool.num_blocks).result(30) == eng.pool.num_blocks  # still serving
    finally:
        runner.shutdown()
    assert seen and seen[-1].finished


def test_an_int8_kv_cache_moves_with_its_scales(ckpt):
    prefill, decode, alone = (_engine(ckpt, kv_cache_dtype="int8") for _ in range(3))
    _finish(prefill, "p", PROMPT, 1)
    kv = prefill.export_prefix(PROMPT)
    assert kv.data.dtype == torch.int8 and kv.data.shape[-1] == prefill.spec.head_dim + 4
    assert decode.import_prefix(PROMPT, kv) == 3
    assert _finish(decode, "d", PROMPT, 6) == _finish(alone, "a", PROMPT, 6)
    with pytest.raises(ValueError, match="does not match"):  # an fp32 engine refuses int8 KV
        _engine(ckpt).import_prefix(PROMPT, kv)
