"""Scheduling controls: priority (TensorRT-LLM's [0, 1], higher first) with aging, preemption victims,
allotted_time_ms timeouts, and prefill_after siblings sharing a prompt's blocks through the prefix cache."""
import threading

import pytest

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.request import InvalidRequest, SamplingParams, Status
from tritonllm.engine.runner import EngineRunner

from engine_helpers import make_checkpoint, random_prompts, run_staggered


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


class Clock:
    """The scheduler's time base (arrival, aging, deadlines), moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _engine(ckpt, clock=None, **kw):
    cfg = dict(block_size=4, max_kv_tokens=1024, max_num_tokens=64)
    cfg.update(kw)
    eng = LLMEngine(ckpt, EngineConfig(**cfg))
    if clock is not None:
        eng.scheduler.clock = clock
    return eng


def _drain(eng, first_token_order=None, finals=None, tokens=None):
    while eng.has_work():
        for o in eng.step():
            if first_token_order is not None and o.new_token_ids and o.request_id not in first_token_order:
                first_token_order.append(o.request_id)
            if tokens is not None:
                tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if finals is not None and o.finished:
                assert o.request_id not in finals, "two final outputs"
                finals[o.request_id] = o
    return first_token_order


def _params(priority=0.5, n=3, **kw):
    return SamplingParams(max_tokens=n, end_id=-1, priority=priority, **kw)


# ---- priority -------------------------------------------------------------------------------------
@pytest.mark.parametrize("high,order", [(0.9, ["a", "h", "b", "c"]), (0.5, ["a", "b", "c", "h"])])
def test_a_high_priority_request_submitted_last_is_served_next(ckpt, high, order):
    eng = _engine(ckpt, max_num_seqs=1)
    for rid in "abc":
        eng.add_request(rid, [5, 6, 7], _params(0.2 if high != 0.5 else 0.5))
    seen = []
    for o in eng.step():                             # "a" is admitted and running
        seen.append(o.request_id)
    eng.add_request("h", [8, 9], _params(high))
    assert _drain(eng, seen) == order
    assert eng.num_free_blocks == eng.pool.num_blocks


@pytest.mark.parametrize("gap,aging,winner", [(2.5, 2.0, "old"), (1.5, 2.0, "fresh"), (2.5, 0.0, "fresh")])
def test_aging_lets_a_long_waiting_low_priority_request_overtake(ckpt, gap, aging, winner):
    """Priority 0 waiting longer than (1 - 0) x priority_aging_s beats a fresh priority 1; not before that,
    nor with aging off."""
    clock = Clock()
    eng = _engine(ckpt, clock, max_num_seqs=1, priority_aging_s=aging)
    eng.add_request("busy", [5, 6, 7], _params(n=4))
    eng.step()                                       # "busy" holds the only slot
    eng.add_request("old", [8, 9], _params(0.0))
    clock.now += gap
    eng.add_request("fresh", [10, 11], _params(1.0))
    clock.now += 0.1
    assert _drain(eng, ["busy"]) == ["busy", winner, ({"old", "fresh"} - {winner}).pop()]


@pytest.mark.parametrize("low,victim", [(0.1, "low"), (0.5, "high")])
def test_the_lowest_priority_running_request_is_preempted_first(ckpt, low, victim):
    """3 KV blocks of 4 tokens: two 4-token prompts cannot both reach 5 tokens. Equal priorities keep
    today's rule (the newest goes); a lower priority goes first although it is older."""
    prompts = {"low": [20, 21, 22, 23], "high": [30, 31, 32, 33]}
    ref, _ = run_staggered(_engine(ckpt), list(prompts.values()), lambda i: _params(n=4))
    eng = _engine(ckpt, max_kv_tokens=12)
    finals, tokens = {}, {}
    eng.add_request("low", prompts["low"], _params(low, n=4))
    tokens["low"] = [t for o in eng.step() for t in o.new_token_ids]
    eng.add_request("high", prompts["high"], _params(0.5 if low == 0.5 else 0.9, n=4))
    reqs = dict(eng.requests)
    _drain(eng, finals=finals, tokens=tokens)
    assert {r: q.num_preemptions for r, q in reqs.items()} == {"low": int(victim == "low"),
                                                               "high": int(victim == "high")}
    assert list(finals) == [r for r in ("low", "high") if r != victim] + [victim]
    assert tokens == {"low": ref["0"], "high": ref["1"]}  # recomputation after preemption is exact
    assert eng.num_free_blocks == eng.pool.num_blocks


def test_the_preempted_request_keeps_its_place_ahead_of_higher_priorities(ckpt):
    eng = _engine(ckpt, max_kv_tokens=12)
    eng.add_request("low", [20, 21, 22, 23], _params(0.1, n=4))
    eng.step()
    eng.add_request("high", [30, 31, 32, 33], _params(0.9, n=4))
    eng.step()                                       # both run; no free block left
    eng.add_request("top", [40, 41], _params(1.0, n=2))
    eng.step()                                       # "high" needs a block: "low" is preempted
    assert eng.requests["low"].num_preemptions == 1
    assert list(eng.scheduler.waiting) == [eng.requests["low"], eng.requests["top"]]
    assert _drain(eng, []) == ["high", "low", "top"]


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), float("inf")])
def test_priority_outside_0_1_is_refused(ckpt, value):
    with pytest.raises(InvalidRequest, match="priority must be in \\[0, 1\\]"):
        _engine(ckpt).validate([1, 2], _params(value))


# ---- allotted_time_ms -----------------------------------------------------------------------------
def test_a_running_request_times_out_and_the_others_continue(ckpt):
    clock = Clock()
    prompts = random_prompts(2, 211, 6, 10, seed=31)
    ref, _ = run_staggered(_engine(ckpt), prompts, lambda i: _params(n=12))
    eng = _engine(ckpt, clock)
    initial = eng.num_free_blocks
    eng.add_request("t", prompts[0], _params(n=12, allotted_time_ms=1000))
    eng.add_request("o", prompts[1], _params(n=12))
    finals, tokens = {}, {}

    def step():
        outs = eng.step()
        for o in outs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        return outs

    for _ in range(4):
        step()
    clock.now += 0.999
    step()                                           # 5 tokens each; "t" is 1 ms short of its deadline
    clock.now += 0.001
    timeout = [o for o in step() if o.request_id == "t"]
    assert len(timeout) == 1 and timeout[0].finished and timeout[0].finish_reason == "timeout"
    assert timeout[0].error is None and timeout[0].new_token_ids == [] and timeout[0].num_output_tokens == 5
    assert "t" not in eng.requests and eng.num_free_blocks == initial - len(eng.requests["o"].block_table)
    _drain(eng, finals=finals, tokens=tokens)
    assert finals["o"].finish_reason == "length" and "t" not in finals
    assert tokens == {"t": ref["0"][:5], "o": ref["1"]} and eng.requests == {}
    assert eng.num_free_blocks == initial


def test_a_waiting_request_times_out_without_being_scheduled(ckpt):
    clock = Clock()
    eng = _engine(ckpt, clock, max_num_seqs=1, enable_prefix_caching=True)
    eng.add_request("busy", [5, 6, 7, 8, 9], _params(n=6))
    eng.add_request("w", [10, 11], _params(allotted_time_ms=50))
    eng.step()
    clock.now += 0.05
    [out] = [o for o in eng.step() if o.request_id == "w"]
    assert (out.finished, out.finish_reason, out.num_output_tokens, out.metrics.first_scheduled_ns) == \
        (True, "timeout", 0, 0)
    assert eng.scheduler.waiting == type(eng.scheduler.waiting)() and "w" not in eng.scheduler.requests
    _drain(eng)
    assert eng.num_free_blocks == eng.pool.num_blocks and eng.scheduler.timed == []


def test_allotted_time_through_the_runner_gives_one_final_output(ckpt):
    eng = _engine(ckpt)
    outs, done = [], threading.Event()

    def on_output(out):
        outs.append(out)
        if out.finished:
            done.set()

    runner = EngineRunner(eng, on_output).start()
    runner.submit("t", [5, 6, 7], _params(n=400, allotted_time_ms=30))
    assert done.wait(30)
    runner.shutdown()
    finals = [o for o in outs if o.finished]
    assert len(finals) == 1 and finals[0].finish_reason == "timeout" and finals[0].error is None
    assert sum(len(o.new_token_ids) for o in outs) == finals[0].num_output_tokens < 400
    assert eng.num_free_blocks == eng.pool.num_blocks


def test_allotted_time_must_be_positive(ckpt):
    with pytest.raises(InvalidRequest, match="allotted_time_ms must be >= 1"):
        _engine(ckpt).validate([1, 2], _params(allotted_time_ms=0))


# ---- prefill_after (n > 1) ------------------------------------------------------------------------
PROMPT = list(range(10, 24))                         # 14 tokens: 3 full blocks of 4 + a partial one


def test_siblings_share_the_prompt_blocks(ckpt):
    eng = _engine(ckpt, enable_prefix_caching=True)
    eng.add_request("a", PROMPT, _params(n=6))
    for rid in "bc":
        eng.add_request(rid, PROMPT, _params(n=6, prefill_after="a"))
    eng.step()                                       # a's prompt is computed; b and c wait for it
    a, b, c = (eng.requests[r] for r in "abc")
    assert a.block_table == [0, 1, 2, 3] and (b.status, c.status) == (Status.WAITING, Status.WAITING)
    eng.step()
    assert (b.block_table, c.block_table) == ([0, 1, 2, 4], [0, 1, 2, 5])
    assert [eng.pool.ref_count(x) for x in range(6)] == [3, 3, 3, 1, 1, 1]
    assert eng.stats.prefix_hit_tokens == 2 * 12 and b.metrics.kv_reused_blocks == 3
    eng.step()
    eng.step()                                       # a computes its 17th token: a private block
    assert a.block_table == [0, 1, 2, 3, 6]
    eng.step()                                       # so do b and c
    assert (b.block_table, c.block_table) == ([0, 1, 2, 4, 7], [0, 1, 2, 5, 8])
    assert [eng.pool.ref_count(x) for x in range(9)] == [3, 3, 3, 1, 1, 1, 1, 1, 1]
    _drain(eng)
    assert eng.num_free_blocks == eng.pool.num_blocks


def test_without_prefill_after_siblings_admitted_together_share_nothing(ckpt):
    eng = _engine(ckpt, enable_prefix_caching=True)
    for rid in "abc":
        eng.add_request(rid, PROMPT, _params(n=6))
    eng.step()
    assert [eng.requests[r].block_table for r in "abc"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert {eng.pool.ref_count(x) for x in range(12)} == {1}
    _drain(eng)


@pytest.mark.parametrize("sampled", [False, True])
def test_greedy_siblings_agree_and_seeded_ones_differ(ckpt, sampled):
    eng = _engine(ckpt, enable_prefix_caching=True)
    kw = dict(temperature=1.5, top_p=1.0) if sampled else {}
    for i, rid in enumerate("abc"):
        eng.add_request(rid, PROMPT, _params(n=12, seed=i, prefill_after=None if rid == "a" else "a", **kw))
    tokens = {}
    _drain(eng, tokens=tokens)
    if sampled:
        assert len({tuple(t) for t in tokens.values()}) == 3
    else:
        solo, _ = run_staggered(_engine(ckpt), [PROMPT], lambda i: _params(n=12))
        assert tokens == {r: solo["0"] for r in "abc"}
    assert eng.stats.prefix_hit_tokens == 2 * 12
    assert eng.num_free_blocks == eng.pool.num_blocks


def test_a_deferred_sibling_does_not_block_the_queue(ckpt):
    eng = _engine(ckpt, enable_prefix_caching=True)
    eng.add_request("a", PROMPT, _params(0.1))
    eng.add_request("b", PROMPT, _params(0.9, prefill_after="a"))  # would be first by priority
    eng.add_request("d", [50, 51, 52], _params())
    eng.step()
    assert [eng.requests[r].status for r in "abd"] == [Status.RUNNING, Status.WAITING, Status.RUNNING]
    _drain(eng)


@pytest.mark.parametrize("case", ["sibling_gone", "no_prefix_caching", "cycle"])
def test_prefill_after_is_ignored_when_it_cannot_help(ckpt, case):
    eng = _engine(ckpt, enable_prefix_caching=case != "no_prefix_caching")
    eng.add_request("a", PROMPT, _params(prefill_after="b" if case == "cycle" else None))
    eng.add_request("b", PROMPT, _params(prefill_after="a"))
    if case == "sibling_gone":
        eng.abort("a")
    eng.step()
    assert all(r.status is Status.RUNNING for r in eng.requests.values())
    assert eng.stats.prefix_hit_tokens == 0
    _drain(eng)
    assert eng.num_free_blocks == eng.pool.num_blocks
