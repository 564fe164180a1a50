"""lifecycle: the one request state every front uses (llm_jobs, the BLS, the Dynamo worker): n sequences, the last
end exactly once, the final answer exactly once with the request out of the registry first, cancellation and stop
by id, and that a scan never asks an answered request."""
from __future__ import annotations

import threading

from tritonllm.engine.request import SamplingParams
from tritonllm.lifecycle import ClientRequest, Live, Sequences


def _ids():
    n = iter(range(100))
    return lambda: f"e{next(n)}"


def test_sequences_seed_plus_index_and_the_first_computes_the_prompt():
    seqs = Sequences.of(SamplingParams(max_tokens=4, seed=7), 3, _ids())
    assert seqs.ids == ["e0", "e1", "e2"]
    assert [p.seed for p in seqs.params] == [7, 8, 9]
    assert [p.prefill_after for p in seqs.params] == [None, "e0", "e0"]
    assert [s[0] for s in seqs.submissions([1, 2])] == seqs.ids and seqs.index("e2") == 2


def test_unseeded_sequences_draw_a_random_base_and_one_sequence_is_the_request_itself():
    a = Sequences.of(SamplingParams(max_tokens=4), 2, _ids())
    b = Sequences.of(SamplingParams(max_tokens=4), 2, _ids())
    assert a.params[1].seed == a.params[0].seed + 1 and a.params[0].seed != b.params[0].seed
    p = SamplingParams(max_tokens=4)
    assert Sequences.of(p, 1, _ids()).params[0] is p


def test_the_last_end_is_true_exactly_once_and_unfinished_lists_what_to_abort():
    seqs = Sequences.of(SamplingParams(max_tokens=4, seed=1), 3, _ids())
    assert list(seqs.unfinished()) == ["e0", "e1", "e2"]
    assert seqs.end("e1") is False and list(seqs.unfinished()) == ["e0", "e2"]
    assert seqs.end("e1") is False  # a repeated end changes nothing
    assert seqs.end("e0") is False and seqs.end("e2") is True and seqs.done
    assert seqs.end("e2") is False and list(seqs.unfinished()) == []


def test_close_is_true_once_and_the_request_leaves_the_registry_first():
    live = Live()
    req = ClientRequest("sender", "id-1", pending=2)
    live.add(req)
    assert len(live) == 1
    with live.lock:
        assert live.end_locked(req) is False and live.end_locked(req) is True
    assert live.close(req) is True and req.answered and len(live) == 0
    assert live.close(req) is False


def test_cancellation_scan_marks_once_and_never_asks_an_answered_request():
    live = Live()
    a, b, c = ClientRequest("a", "x"), ClientRequest("b", "x"), ClientRequest("c", "y")
    for r in (a, b, c):
        live.add(r)
    live.close(b)
    asked = []

    def is_cancelled(sender):
        asked.append(sender)
        return sender in ("a", "b")

    assert live.cancelled(is_cancelled) == [a] and a.cancelled and not b.cancelled
    assert "b" not in asked  # a sender that has sent its final answer is never asked (Triton frees it)
    asked.clear()
    assert live.cancelled(is_cancelled) == [] and asked == ["c"]  # a marked request is not asked again


def test_with_id_finds_live_requests_by_client_id_and_may_cancel_them():
    live = Live()
    a, b = ClientRequest("a", "x"), ClientRequest("b", "y")
    live.add(a)
    live.add(b)
    assert live.with_id("") == [] and live.with_id("z") == []
    assert live.with_id("x") == [a] and not a.cancelled
    assert live.with_id("x", cancel=True) == [a] and a.cancelled and not b.cancelled
    live.close(a)
    assert live.with_id("x") == []


def test_concurrent_closers_answer_once():
    live = Live()
    req = ClientRequest("s", "id")
    live.add(req)
    wins = []
    threads = [threading.Thread(target=lambda: wins.append(live.close(req))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins.count(True) == 1
