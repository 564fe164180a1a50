"""Prefix caching (enable_kv_cache_reuse): exact block ids and ref counts, LRU eviction, and outputs
identical to HF and to the engine without reuse."""
import pytest

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.kv_cache import BlockPool, block_hash
from tritonllm.engine.request import SamplingParams

from engine_helpers import hf_greedy, make_checkpoint, random_prompts, run_staggered


def test_pool_lru_eviction_and_ref_counts():
    pool = BlockPool(4)
    a = pool.allocate(2)
    assert a == [0, 1] and pool.num_free == 2
    h0 = block_hash(None, [1, 2])
    h1 = block_hash(h0, [3, 4])
    pool.register(0, h0)
    pool.register(1, h1)
    pool.release(a)                         # reverse order: block 1 then block 0 join the free list
    assert pool.num_free == 4 and pool.lookup(h0) == 0 and pool.lookup(h1) == 1
    pool.take(0)                            # a prefix hit takes the idle cached block back
    assert pool.ref_count(0) == 1 and pool.num_free == 3
    pool.take(0)
    assert pool.ref_count(0) == 2
    assert pool.allocate(2) == [2, 3]       # never-cached blocks first (least recently used)
    assert pool.allocate(1) == [1]          # then the LRU cached block, whose hash is evicted
    assert pool.lookup(h1) is None and pool.lookup(h0) == 0
    pool.release([0])
    pool.release([0])
    assert pool.ref_count(0) == 0 and pool.lookup(h0) == 0
    with pytest.raises(RuntimeError, match="double free"):
        pool.release([0])


def test_block_hash_chains_prefix():
    assert block_hash(None, [1, 2]) == block_hash(None, [1, 2])
    assert block_hash(block_hash(None, [1, 2]), [3]) != block_hash(block_hash(None, [9, 2]), [3])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


def _engine(ckpt, reuse, **kw):
    cfg = dict(block_size=4, max_kv_tokens=1024, max_num_tokens=64, enable_prefix_caching=reuse)
    cfg.update(kw)
    return LLMEngine(ckpt, EngineConfig(**cfg))


def test_shared_prefix_shares_block_ids(ckpt):
    eng = _engine(ckpt, True)
    prefix = list(range(10, 22))                    # 3 full blocks
    eng.add_request("a", prefix + [30, 31], SamplingParams(max_tokens=4, end_id=-1))
    eng.step()                                      # a's prompt (14 tokens) is computed: blocks 0..3
    a = eng.requests["a"]
    assert a.block_table[:4] == [0, 1, 2, 3] and len(a.block_hashes) == 3
    eng.add_request("b", prefix + [40, 41, 42], SamplingParams(max_tokens=4, end_id=-1))
    eng.step()
    b = eng.requests["b"]
    assert b.block_table[:3] == [0, 1, 2]           # the shared prefix: same physical blocks
    assert [eng.pool.ref_count(x) for x in (0, 1, 2)] == [2, 2, 2]
    assert b.block_table[3] not in a.block_table
    assert eng.stats.prefix_hit_tokens == 12 and eng.stats.prefix_query_tokens == 14 + 15
    while eng.has_work():
        eng.step()
    assert eng.num_free_blocks == eng.pool.num_blocks


def test_outputs_identical_with_and_without_reuse_and_to_hf(ckpt):
    shared = random_prompts(1, 211, 21, 21, seed=5)[0]
    tails = random_prompts(6, 211, 1, 9, seed=6)
    prompts = [shared + t for t in tails] + [shared[:9] + t for t in tails[:2]]
    params = lambda i: SamplingParams(max_tokens=8, end_id=-1)  # noqa: E731
    with_reuse = _engine(ckpt, True, max_num_tokens=16)
    on, _ = run_staggered(with_reuse, prompts, params, arrive_every=3)
    off, _ = run_staggered(_engine(ckpt, False, max_num_tokens=16), prompts, params, arrive_every=3)
    assert on == off
    assert with_reuse.stats.prefix_hit_tokens >= 5 * 20
    for i in (0, 3, 6):
        assert on[str(i)] == hf_greedy(ckpt, prompts[i], 8)
    assert with_reuse.num_free_blocks == with_reuse.pool.num_blocks


def test_reuse_under_preemption_is_exact(ckpt):
    shared = random_prompts(1, 211, 16, 16, seed=7)[0]
    prompts = [shared + t for t in random_prompts(5, 211, 2, 12, seed=8)]
    params = lambda i: SamplingParams(max_tokens=24, end_id=-1)  # noqa: E731
    small = _engine(ckpt, True, max_kv_tokens=64)  # 16 blocks: forces preemption
    on, _ = run_staggered(small, prompts, params)
    off, _ = run_staggered(_engine(ckpt, False), prompts, params)
    assert on == off and small.num_preemptions > 0
    assert small.num_free_blocks == small.pool.num_blocks
