"""The scheduler and its KVCacheManager over a bare BlockPool (no model): exact block ids and reference
counts through prefill, prefix sharing, release, reuse of freed cached blocks, chunked prefill and
preemption, after vLLM's tests/v1/core/test_prefix_caching.py. The engine's part around the model is
played by ``_step``: the scheduled tokens become computed, and a request whose tokens are all computed
gets one (fake) sampled token."""
from tritonllm.engine.config import EngineConfig
from tritonllm.engine.kv_cache import BlockPool
from tritonllm.engine.kv_manager import KVCacheManager
from tritonllm.engine.request import Request, SamplingParams, Status
from tritonllm.engine.scheduler import Scheduler

PROMPT = list(range(1, 11))  # 10 tokens: two full blocks of 4 and a partial one


def _scheduler(num_blocks: int, budget: int = 64, cache: bool = True) -> tuple[Scheduler, BlockPool]:
    pool = BlockPool(num_blocks)
    kv = KVCacheManager(pool, 4, enable_prefix_caching=cache)
    return Scheduler(EngineConfig(block_size=4, max_num_tokens=budget, enable_prefix_caching=cache), kv), pool


def _req(rid: str, prompt=PROMPT) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=8), 0.0)


def _step(s: Scheduler):
    sched = s.schedule()
    s.update_from_output(sched.items)
    for req, _ in sched.items:
        if req.num_computed == len(req.token_ids):
            req.token_ids.append(500 + len(req.token_ids))
    return sched


def test_prefill_allocates_blocks_in_order_and_caches_the_full_ones():
    s, pool = _scheduler(8)
    a = _req("a")
    s.add(a)
    assert [(r.request_id, n) for r, n in _step(s).items] == [("a", 10)]
    assert a.block_table == [0, 1, 2] and [pool.ref_count(b) for b in range(4)] == [1, 1, 1, 0]
    assert len(a.block_hashes) == 2 and pool.num_cached == 2 and pool.num_free == 5
    _step(s)  # the decode of token 11 fills no block yet
    _step(s)  # token 12 completes block 2
    assert a.num_computed == 12 and len(a.block_hashes) == 3 and pool.num_cached == 3


def test_a_second_request_shares_the_cached_prefix_blocks():
    s, pool = _scheduler(8)
    a, b = _req("a"), _req("b")
    s.add(a)
    _step(s)
    s.add(b)
    items = _step(s).items
    assert ("b", 2) in [(r.request_id, n) for r, n in items]  # 8 of 10 prompt tokens came from the cache
    assert b.block_table[:2] == [0, 1] and b.block_table[2] == 3
    assert [pool.ref_count(x) for x in range(4)] == [2, 2, 1, 1]
    assert s.prefix_hits == 8 and s.reused_blocks == 2 and b.metrics.kv_reused_blocks == 2
    s.remove(a)
    assert [pool.ref_count(x) for x in range(4)] == [1, 1, 0, 1] and a.status is Status.FINISHED
    assert a.block_table == [] and pool.num_cached == 2


def test_freed_cached_blocks_are_reused_by_the_next_identical_prompt():
    s, pool = _scheduler(8)
    a = _req("a")
    s.add(a)
    _step(s)
    s.remove(a)
    assert pool.num_free == 8 and pool.num_cached == 2  # free, but still in the prefix cache
    c = _req("c")
    s.add(c)
    _step(s)
    assert c.block_table[:2] == [0, 1] and [pool.ref_count(x) for x in (0, 1)] == [1, 1]
    assert c.metrics.kv_alloc_total_blocks == 1 and c.metrics.kv_reused_blocks == 2


def test_chunked_prefill_computes_within_the_budget():
    s, pool = _scheduler(8, budget=4)
    a = _req("a")
    s.add(a)
    assert [n for _, n in _step(s).items] == [4] and a.block_table == [0] and a.num_computed == 4
    assert [n for _, n in _step(s).items] == [4] and a.block_table == [0, 1]
    assert [n for _, n in _step(s).items] == [2] and a.block_table == [0, 1, 2] and a.num_computed == 10
    assert len(a.token_ids) == 11  # the prompt's last chunk sampled a token


def test_the_newest_running_request_is_preempted_when_blocks_run_out():
    s, pool = _scheduler(5, cache=False)
    a, b = _req("a", list(range(1, 8))), _req("b", list(range(20, 27)))  # 7 tokens: 2 blocks each
    s.add(a)
    s.add(b)
    _step(s)
    assert a.block_table == [0, 1] and b.block_table == [2, 3] and pool.num_free == 1
    _step(s)  # token 8 of each: still 2 blocks
    sched = _step(s)  # token 9 needs a third block each: one is free, b gives its two back
    assert sched.preempted == [b] and b.block_table == [] and b.num_computed == 0
    assert a.block_table == [0, 1, 4] and b.status is Status.WAITING and s.waiting[0] is b
