"""tritonllm.llm_jobs: engine outputs -> the replies of the tensorrt_llm model (no server)."""
import numpy as np
import pytest

from tritonllm.engine.request import RequestMetrics, RequestOutput
from tritonllm.llm_io import parse_request
from tritonllm.llm_jobs import CANCELLED, INTERNAL, Jobs


def _batch(rows, streaming=False, **extra):
    n = len(rows)
    width = max(len(r) for r in rows)
    return parse_request({
        "input_ids": np.array([r + [0] * (width - len(r)) for r in rows], np.int32),
        "input_lengths": np.array([[len(r)] for r in rows], np.int32),
        "request_output_len": np.full((n, 1), 4, np.int32), "streaming": np.full((n, 1), streaming), **extra}, True)


def _out(row, ids, finished=False, reason=None, **kw):
    return RequestOutput(row.rid, ids, [0.0] * len(ids), finished, reason, len(row.request.prompt_ids),
                         len(ids), 0.0, metrics=RequestMetrics(), **kw)


def test_decoupled_rows_answer_on_their_own_and_only_the_last_is_final():
    jobs = Jobs()
    job = jobs.add("sender", "id", _batch([[5, 6], [7]]), decoupled=True)
    a, b = job.rows
    assert jobs.on_output(_out(a, [1, 2]))[0] == []  # not streaming: nothing until it finishes
    replies, abort, done = jobs.on_output(_out(b, [9], True, "length"))
    assert not abort and done.prompt_tokens == 1 and len(replies) == 1 and not replies[0].final
    assert replies[0].arrays["batch_index"].tolist() == [[1]] and replies[0].arrays["output_ids"].tolist() == [[[9]]]
    replies, _, _ = jobs.on_output(_out(a, [3], True, "length"))
    assert replies[0].final and replies[0].arrays["output_ids"].tolist() == [[[1, 2, 3]]]
    assert replies[0].arrays["batch_index"].tolist() == [[0]] and len(jobs) == 0


def test_unary_rows_are_stacked_into_one_final_reply():
    jobs = Jobs()
    job = jobs.add("sender", "id", _batch([[5, 6], [7]]), decoupled=False)
    a, b = job.rows
    assert jobs.on_output(_out(b, [9], True, "stop"))[0] == []
    replies, _, _ = jobs.on_output(_out(a, [1, 2], True, "length"))
    assert len(replies) == 1 and replies[0].final and "batch_index" not in replies[0].arrays
    assert replies[0].arrays["output_ids"].tolist() == [[[1, 2]], [[9, -1]]]
    assert replies[0].arrays["sequence_length"].tolist() == [[2], [1]]


def test_a_stopped_stream_ends_normally_with_an_empty_last_response():
    jobs = Jobs()
    (row,) = jobs.add("s", "x", _batch([[5]], streaming=True), decoupled=True).rows
    assert jobs.rows_of("x") == [row.rid] and jobs.rows_of("") == []
    jobs.on_output(_out(row, [1]))
    replies, _, done = jobs.on_output(_out(row, [], True, "abort"))  # NVIDIA's stop request
    assert replies[0].final and replies[0].error is None and replies[0].arrays["output_ids"].shape == (1, 1, 0)
    assert done is not None


@pytest.mark.parametrize("decoupled", [True, False])
def test_cancel_or_error_ends_the_whole_job_once(decoupled):
    jobs = Jobs()
    job = jobs.add("s", "x", _batch([[5], [6], [7]]), decoupled=decoupled)
    a, b, c = job.rows
    assert jobs.cancelled(lambda sender: sender == "s") == [a.rid, b.rid, c.rid]
    replies, abort, done = jobs.on_output(_out(a, [], True, "abort"))
    assert [(r.final, r.code) for r in replies] == [(True, CANCELLED)] and sorted(abort) == sorted([b.rid, c.rid])
    assert done is None and len(jobs) == 0
    assert jobs.on_output(_out(b, [], True, "abort")) == ([], [], None)  # nothing after the final reply
    job = jobs.add("s2", "y", _batch([[5], [6]]), decoupled=decoupled)
    replies, abort, _ = jobs.on_output(_out(job.rows[1], [], True, "error", error="engine step failed: x"))
    assert replies[0].code == INTERNAL and abort == [job.rows[0].rid]


def test_perf_metrics_ride_on_the_reply_when_asked_for():
    jobs = Jobs()
    (row,) = jobs.add("s", "", _batch([[5]], return_perf_metrics=np.array([[True]])), decoupled=True).rows
    replies, _, _ = jobs.on_output(_out(row, [1], True, "length"))
    assert replies[0].arrays["kv_cache_alloc_total_blocks"].shape == (1, 1)
