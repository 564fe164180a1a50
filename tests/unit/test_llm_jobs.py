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


@pytest.mark.parametrize("finishing", [False, True])
def test_a_reply_that_cannot_be_made_still_ends_the_job_once_with_internal(finishing):
    """A fault of ours while building a reply (here the text step) must not leave the caller waiting for a final."""
    class Broken:
        def add(self, ids):
            raise ValueError("bad bytes")
        finish = add

    jobs = Jobs()
    job = jobs.add("s", "x", _batch([[5], [6]], streaming=True), decoupled=True, detokenizer=Broken)
    a, b = job.rows
    replies, abort, done = jobs.on_output(_out(a, [1], finishing, "length" if finishing else None))
    assert [(r.final, r.code) for r in replies] == [(True, INTERNAL)] and "bad bytes" in replies[0].error
    assert abort == ([b.rid] if finishing else [a.rid, b.rid]) and done is None and len(jobs) == 0 and job.answered
    assert jobs.on_output(_out(b, [2], True, "length")) == ([], [], None)  # nothing after the final reply


def test_perf_metrics_ride_on_the_reply_when_asked_for():
    jobs = Jobs()
    (row,) = jobs.add("s", "", _batch([[5]], return_perf_metrics=np.array([[True]])), decoupled=True).rows
    replies, _, _ = jobs.on_output(_out(row, [1], True, "length"))
    assert replies[0].arrays["kv_cache_alloc_total_blocks"].shape == (1, 1)


def test_num_return_sequences_are_engine_requests_sharing_the_prompt():
    jobs = Jobs()
    seeded = _batch([[5, 6, 7]], streaming=True, num_return_sequences=np.array([[3]], np.int32),
                    seed=np.array([[41]], np.uint64))
    job = jobs.add("s", "x", seeded, decoupled=True)
    first, *rest = job.rows
    assert [r.seq for r in job.rows] == [0, 1, 2] and {r.index for r in job.rows} == {0}
    assert [r.params.seed for r in job.rows] == [41, 42, 43]  # TensorRT-LLM's child seeds: seed + index
    assert first.params.prefill_after is None and [r.params.prefill_after for r in rest] == [first.rid] * 2
    assert seeded.rows[0].params.seed == 41  # the parsed request's params are not changed
    replies = [jobs.on_output(_out(r, [10 + r.seq]))[0][0] for r in job.rows]
    assert [r.arrays["sequence_index"].tolist() for r in replies] == [[[0]], [[1]], [[2]]]
    assert all("batch_index" not in r.arrays and not r.final for r in replies)
    assert not jobs.on_output(_out(rest[0], [], True, "stop"))[0][0].final
    assert not jobs.on_output(_out(first, [], True, "timeout"))[0][0].final  # a timeout ends it normally
    assert jobs.on_output(_out(rest[1], [], True, "length"))[0][0].final  # the last sequence closes the job
    unseeded = jobs.add("s", "y", _batch([[5]], num_return_sequences=np.array([[2]], np.int32)), True).rows
    assert unseeded[1].params.seed == unseeded[0].params.seed + 1


def test_top_logprobs_arrays_are_tokens_by_alternatives():
    jobs = Jobs()
    (row,) = jobs.add("s", "x", _batch([[5]], top_logprobs=np.array([[2]], np.int32)), decoupled=True).rows
    assert row.params.top_logprobs == 2 and row.request.flags.top_logprobs == 2
    jobs.on_output(_out(row, [7], new_top_logprobs=[[(7, -0.1), (3, -2.5)]]))
    replies, _, _ = jobs.on_output(_out(row, [8], True, "length", new_top_logprobs=[[(8, -0.2), (1, -1.9)]]))
    arrays = replies[0].arrays
    assert arrays["top_log_prob_ids"].tolist() == [[[7, 3], [8, 1]]]
    assert np.allclose(arrays["top_log_probs"], [[[-0.1, -2.5], [-0.2, -1.9]]])


def test_engine_options_and_the_triton_timeout_reach_the_params():
    bias = np.zeros((1, 5), np.float32)
    bias[0, 3] = 2.5
    (row,) = parse_request({"input_ids": np.array([[5]], np.int32), "input_lengths": np.array([[1]], np.int32),
                            "request_output_len": np.array([[4]], np.int32), "embedding_bias": bias,
                            "priority": np.array([0.9], np.float32)}, True, timeout_us=1500).rows
    p = row.params
    assert p.embedding_bias.tolist() == [0, 0, 0, 2.5, 0] and p.priority == pytest.approx(0.9)
    assert p.allotted_time_ms == 2  # microseconds rounded up: never a deadline shorter than asked
    (row,) = parse_request({"input_ids": np.array([[5]], np.int32), "input_lengths": np.array([[1]], np.int32),
                            "request_output_len": np.array([[4]], np.int32),
                            "embedding_bias": np.zeros((1, 0), np.float32)}, True).rows
    assert row.params.embedding_bias is None and row.params.allotted_time_ms is None  # [1, 0]: no bias words


def test_queued_outputs_coalesce_per_request():
    from tritonllm.llm_jobs import coalesce

    a1 = RequestOutput("a", [1], [-0.1], False, num_output_tokens=1, new_top_logprobs=[[(1, -0.1)]])
    b1 = RequestOutput("b", [7], [-0.7], False, num_output_tokens=1)
    a2 = RequestOutput("a", [2, 3], [-0.2, -0.3], True, "stop", num_output_tokens=3,
                       new_top_logprobs=[[(2, -0.2)], [(3, -0.3)]])
    merged = coalesce([a1, b1, a2])
    assert [o.request_id for o in merged] == ["a", "b"]
    a = merged[0]
    assert (a.new_token_ids, a.new_logprobs, a.finished, a.finish_reason, a.num_output_tokens) == (
        [1, 2, 3], [-0.1, -0.2, -0.3], True, "stop", 3)
    assert a.new_top_logprobs == [[(1, -0.1)], [(2, -0.2)], [(3, -0.3)]] and merged[1] is b1
    assert coalesce([]) == []


def test_stream_interval_sends_the_first_token_alone_then_groups_and_flushes_at_the_end():
    jobs = Jobs(stream_interval=3)
    (row,) = jobs.add("s", "x", _batch([[5]], streaming=True), decoupled=True).rows
    sent = []
    for i, tok in enumerate([10, 11, 12, 13, 14, 15, 16]):
        replies, _, _ = jobs.on_output(_out(row, [tok], finished=i == 6, reason="length" if i == 6 else None))
        sent += [r.arrays["output_ids"].reshape(-1).tolist() for r in replies]
    assert sent == [[10], [11, 12, 13], [14, 15, 16]]        # every token once, in order; the last is final
    row2 = jobs.add("s", "y", _batch([[5]], streaming=True), decoupled=True).rows[0]
    jobs.on_output(_out(row2, [1]))
    assert jobs.on_output(_out(row2, [2]))[0] == []           # held
    replies, _, _ = jobs.on_output(_out(row2, [], True, "abort"))  # a stop request flushes what is held
    assert replies[0].final and replies[0].arrays["output_ids"].reshape(-1).tolist() == [2]


@pytest.mark.parametrize("interval", [1, 2])
def test_text_output_deltas_are_postprocessings_and_join_to_the_decoded_text(interval):
    from tritonllm.text.detokenizer import IncrementalDetokenizer
    from tritonllm.text.postprocess import Postprocessor
    from text_helpers import byte_level

    tok = byte_level()
    ids = tok.encode("Ünïcode ☃ and spaces,  done.", add_special_tokens=False)
    jobs = Jobs(stream_interval=interval)
    (row,) = jobs.add("s", "x", _batch([[5]], streaming=True), decoupled=True,
                      detokenizer=lambda: IncrementalDetokenizer(tok)).rows
    texts, chunks = [], []
    for i, t in enumerate(ids):
        replies, _, _ = jobs.on_output(_out(row, [t], finished=i == len(ids) - 1,
                                            reason="length" if i == len(ids) - 1 else None))
        for r in replies:
            texts.append(r.arrays["text_output"][0].decode())
            chunks.append(r.arrays["output_ids"].reshape(-1).tolist())
    assert "".join(texts) == tok.decode(ids, skip_special_tokens=True)
    post = Postprocessor(tok)  # the postprocessing step on the same chunks gives the same deltas
    expect = [post.run({"TOKENS_BATCH": np.array([c], np.int32), "REQUEST_KEY": np.array([[7]], np.uint64),
                        "IS_FINAL": np.array([[k == len(chunks) - 1]])})["OUTPUT"][0].decode()
              for k, c in enumerate(chunks)]
    assert texts == expect
