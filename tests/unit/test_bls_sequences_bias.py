"""The BLS's additions over NVIDIA's: several sequences per row (num_return_sequences), top log probs
passed through, OpenAI's logit_bias by token id, the Triton timeout of the inner request."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tritonllm.llm_io import stack_rows
from tritonllm.text import bls_stream as B
from tritonllm.text import text_generation as G
from tritonllm.text import logit_bias as LB
from tritonllm.text.preprocess import InvalidInput, preprocess
from tritonllm.text.sequences import Sequences
from tritonllm.text.tokenizer import TextTokenizer

from text_helpers import byte_level

TEXTS = ("the quick brown fox jumps over a lazy dog", "café naïve résumé — déjà vu!", "中文 测试 🙂 🚀 hello world")


@pytest.fixture(scope="module")
def tok():
    return byte_level()


def _client(text="hello world", max_tokens=8, **extra):
    return {"text_input": np.array([[text.encode()]], dtype=object),
            "max_tokens": np.array([[max_tokens]], dtype=np.int32), **extra}


def _i32(*values):
    return np.array([list(values)], dtype=np.int32)


def _f32(*values):
    return np.array([list(values)], dtype=np.float32)


def _interleaved(seqs_ids, rng, k=0):
    """Responses of one engine request of len(seqs_ids) sequences, shaped like tensorrt_llm's: chunks of
    1-3 tokens, sequences in random order, each response tagged with its sequence_index (when n > 1) and,
    with k > 0, top log probs whose [t, j] entry is -(token position * 100 + j) (ids: position * 100 + j)."""
    pos = [0] * len(seqs_ids)
    while any(p < len(ids) for p, ids in zip(pos, seqs_ids)):
        s = rng.choice([i for i, ids in enumerate(seqs_ids) if pos[i] < len(ids)])
        chunk = seqs_ids[s][pos[s]:pos[s] + rng.randint(1, 3)]
        start, pos[s] = pos[s], pos[s] + len(chunk)
        r = {"output_ids": np.array(chunk, dtype=np.int32).reshape(1, 1, -1),
             "sequence_length": np.array([[len(chunk)]], dtype=np.int32)}
        if len(seqs_ids) > 1:
            r["sequence_index"] = np.array([[s]], dtype=np.int32)
        if k:
            grid = np.arange(start, pos[s])[:, None] * 100 + np.arange(k)[None, :]
            r["top_log_probs"] = -grid.astype(np.float32)[None]
            r["top_log_prob_ids"] = grid.astype(np.int32)[None]
        yield r


def _sequences(tok, req, **kw):
    return Sequences(req.num_return_sequences,
                     lambda index: G.TextGeneration(tok, req, sequence_index=index, **kw))


def _run(tok, req, seqs_ids, seed=0, k=0):
    """Every (sequence_index, chunk, final) the BLS would send, in order; the engine stream runs to its end
    unless every sequence stopped first."""
    seqs = _sequences(tok, req)
    sent = []
    for r in _interleaved(seqs_ids, random.Random(seed), k):
        sent += [(c.sequence_index, c, final) for c, final in seqs.on_response(r)]
        if seqs.done:
            break
    sent += [(c.sequence_index, c, True) for c in seqs.finish_all()]
    assert seqs.done
    return sent


# --------------------------------------------------------------------------- num_return_sequences

@pytest.mark.parametrize("stream", [True, False])
def test_each_sequence_has_its_own_exact_text_and_one_final_chunk(tok, stream):
    seqs_ids = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    req = B.parse_request(_client(num_return_sequences=_i32(3), stream=np.array([[stream]])))
    for seed in range(4):
        sent = _run(tok, req, seqs_ids, seed)
        for s, ids in enumerate(seqs_ids):
            mine = [(c, final) for i, c, final in sent if i == s]
            assert "".join(c.text for c, _ in mine) == tok.decode(ids)
            assert [final for _, final in mine] == [False] * (len(mine) - 1) + [True]
            assert stream or len(mine) == 1  # non-streamed: one response with the whole text
            assert all(c.arrays()["sequence_index"].tolist() == [[s]] for c, _ in mine)
        assert {i for i, _, _ in sent} == {0, 1, 2}


def test_one_sequence_is_answered_without_sequence_index(tok):
    ids = tok.encode(TEXTS[0], add_special_tokens=False)
    sent = _run(tok, B.parse_request(_client(stream=np.array([[True]]))), [ids])
    assert "".join(c.text for _, c, _ in sent) == tok.decode(ids)
    assert all(i is None and "sequence_index" not in c.arrays() for i, c, _ in sent)


def test_a_stop_string_ends_its_sequence_only_and_the_engine_request_when_all_stopped(tok):
    texts = ("the quick brown fox jumps over a lazy dog", "hello world the fox says we're testing")
    seqs_ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    req = B.parse_request(_client(num_return_sequences=_i32(2), stop_words=np.array([[b"fox"]], dtype=object),
                                  stream=np.array([[True]])))
    seqs = _sequences(tok, req)
    responses = list(_interleaved(seqs_ids, random.Random(3)))
    text, finals, done_at = {0: "", 1: ""}, [], None
    for n, r in enumerate(responses):
        for c, final in seqs.on_response(r):
            text[c.sequence_index] += c.text
            if final:
                finals.append(c.sequence_index)
        if seqs.done and done_at is None:
            done_at = n
    assert text == {0: texts[0].split("fox")[0], 1: texts[1].split("fox")[0]}
    assert sorted(finals) == [0, 1]  # one final each; responses after a sequence's stop are ignored
    # every sequence stopped before the engine's stream ended: the BLS stops the engine request then
    assert done_at is not None and done_at < len(responses) - 1 and seqs.finish_all() == []


def test_a_stopped_sequence_waits_for_the_others_until_the_stream_ends(tok):
    seqs_ids = [tok.encode(t, add_special_tokens=False) for t in ("a lazy dog", "hello world says")]
    req = B.parse_request(_client(num_return_sequences=_i32(2), stop_words=np.array([[b"lazy"]], dtype=object)))
    sent = _run(tok, req, seqs_ids, seed=1)
    assert [(i, c.text, final) for i, c, final in sent if i == 0] == [(0, "a ", True)]
    assert [(i, c.text, final) for i, c, final in sent if i == 1] == [(1, "hello world says", True)]


def test_a_sequence_index_out_of_range_is_an_engine_error(tok):
    seqs = _sequences(tok, B.parse_request(_client(num_return_sequences=_i32(2))))
    r = {"output_ids": np.array([[[5]]], dtype=np.int32), "sequence_index": np.array([[2]], dtype=np.int32)}
    with pytest.raises(RuntimeError, match="sequence_index 2 for 2 sequences"):
        seqs.on_response(r)


@pytest.mark.parametrize("value, message", [
    (_i32(0), "num_return_sequences must be an integer in [1, 16], got 0"),
    (_i32(-2), "num_return_sequences must be an integer in [1, 16], got -2"),
    (_i32(17), "num_return_sequences must be an integer in [1, 16], got 17"),
    (_f32(2.0), "num_return_sequences must be an integer in [1, 16], got 2.0"),
    (_i32(2, 3), "num_return_sequences must hold exactly one value, got shape [1, 2]"),
])
def test_num_return_sequences_is_validated_by_name(value, message):
    with pytest.raises(InvalidInput) as err:
        B.parse_request(_client(num_return_sequences=value))
    assert str(err.value) == message


def test_several_sequences_need_decoupled_mode_and_are_forwarded(tok):
    req = B.parse_request(_client(num_return_sequences=_i32(16)))
    assert req.num_return_sequences == 16
    assert B.needs_decoupled(req).startswith("num_return_sequences 16 needs decoupled mode")
    assert B.needs_decoupled(B.parse_request(_client(num_return_sequences=_i32(1)))) is None
    assert B.needs_decoupled(B.parse_request(_client())) is None
    pre = preprocess(TextTokenizer(tok), B.preprocessing_inputs(req))
    assert B.llm_inputs(req, pre)["num_return_sequences"].tolist() == [[16]]


# --------------------------------------------------------------------------- top log probs, priority

def test_top_logprobs_and_priority_go_to_tensorrt_llm_unchanged(tok):
    req = B.parse_request(_client(top_logprobs=_i32(3), priority=_f32(0.9)))
    llm = B.llm_inputs(req, preprocess(TextTokenizer(tok), B.preprocessing_inputs(req)))
    assert llm["top_logprobs"] is req.arrays["top_logprobs"] and llm["priority"] is req.arrays["priority"]
    assert B.llm_outputs(req)[-5:] == ["top_log_probs", "top_log_prob_ids", "finish_reason", "error_code", "error_message"]
    # NVIDIA's backend declares neither the finish reason nor failures as data
    assert not {"finish_reason", "error_code"} & set(B.llm_outputs(req, finish_reason=False))
    # not asked for otherwise: NVIDIA's tensorrt_llm (GPU profile) declares neither
    for plain in (B.parse_request(_client()), B.parse_request(_client(top_logprobs=_i32(0)))):
        assert B.llm_outputs(plain) == [*B.LLM_OUTPUTS, "finish_reason", "error_code", "error_message"] \
            and "top_log_probs" not in B.LLM_OUTPUTS
    with pytest.raises(InvalidInput, match="top_logprobs must be an integer, got 2.5"):
        B.parse_request(_client(top_logprobs=_f32(2.5)))


@pytest.mark.parametrize("stream", [True, False])
def test_top_log_probs_cover_every_token_once_per_sequence(tok, stream):
    seqs_ids = [tok.encode(t, add_special_tokens=False) for t in TEXTS[:2]]
    req = B.parse_request(_client(num_return_sequences=_i32(2), top_logprobs=_i32(3), stream=np.array([[stream]])))
    sent = _run(tok, req, seqs_ids, seed=2, k=3)
    for s, ids in enumerate(seqs_ids):
        parts = [c.outputs for i, c, _ in sent if i == s and "top_log_probs" in c.outputs]
        lps = np.concatenate([p["top_log_probs"] for p in parts], axis=1)
        top_ids = np.concatenate([p["top_log_prob_ids"] for p in parts], axis=1)
        grid = np.arange(len(ids))[:, None] * 100 + np.arange(3)[None, :]
        assert lps.dtype == np.float32 and lps.shape == (1, len(ids), 3)
        assert lps.tolist() == (-grid[None]).tolist() and top_ids.tolist() == grid[None].tolist()
        assert stream or len(parts) == 1


def test_unary_rows_with_different_token_counts_stack():
    rows = [{"top_log_probs": np.full((1, 2, 2), -1.5, np.float32), "top_log_prob_ids": np.full((1, 2, 2), 7, np.int32)},
            {"top_log_probs": np.full((1, 3, 2), -0.5, np.float32), "top_log_prob_ids": np.full((1, 3, 2), 4, np.int32)}]
    stacked = stack_rows(G.stackable(rows))
    assert stacked["top_log_probs"].tolist() == [[[-1.5, -1.5], [-1.5, -1.5], [-np.inf, -np.inf]], [[-0.5] * 2] * 3]
    assert stacked["top_log_prob_ids"].tolist() == [[[7, 7], [7, 7], [-1, -1]], [[4, 4]] * 3]
    # rows asking for different k: the alternatives axis is padded the same way
    rows[1] = {name: a[:, :, :1] for name, a in rows[1].items()}
    assert stack_rows(G.stackable(rows))["top_log_prob_ids"].tolist() == [[[7, 7], [7, 7], [-1, -1]], [[4, -1]] * 3]


# --------------------------------------------------------------------------- logit_bias

def test_logit_bias_without_bias_words_starts_from_zeros_of_the_vocabulary(tok):
    req = B.parse_request(_client(logit_bias_ids=_i32(5, 9, 5), logit_bias_weights=_f32(1.5, -100, 2.0)),
                          vocab_size=len(tok))
    pre = preprocess(TextTokenizer(tok), B.preprocessing_inputs(req))
    assert pre["EMBEDDING_BIAS"].shape == (1, 0)
    bias = B.llm_inputs(req, pre)["embedding_bias"]
    expected = np.zeros((1, len(tok)), np.float32)
    expected[0, 5], expected[0, 9] = 3.5, -100.0  # a repeated id adds up
    assert bias.dtype == np.float32 and bias.tolist() == expected.tolist()


def test_logit_bias_adds_to_the_bias_words(tok):
    word_ids = tok.encode("fox", add_special_tokens=False)
    req = B.parse_request(_client(embedding_bias_words=np.array([[b"fox"]], dtype=object),
                                  embedding_bias_weights=_f32(2.0),
                                  logit_bias_ids=_i32(word_ids[0], 3), logit_bias_weights=_f32(0.25, -1.0)),
                          vocab_size=len(tok))
    pre = preprocess(TextTokenizer(tok), B.preprocessing_inputs(req))
    expected = pre["EMBEDDING_BIAS"].copy()
    expected[0, word_ids[0]] += 0.25
    expected[0, 3] -= 1.0
    assert B.llm_inputs(req, pre)["embedding_bias"].tolist() == expected.tolist()
    assert pre["EMBEDDING_BIAS"][0, 3] == 0.0  # preprocessing's array is left as it was


def test_no_logit_bias_leaves_preprocessings_bias_alone(tok):
    for extra in ({}, {"logit_bias_ids": _i32(), "logit_bias_weights": _f32()}):
        req = B.parse_request(_client(**extra), vocab_size=len(tok))
        assert req.logit_bias is None
        pre = preprocess(TextTokenizer(tok), B.preprocessing_inputs(req))
        assert B.llm_inputs(req, pre)["embedding_bias"] is pre["EMBEDDING_BIAS"]


def test_a_bias_shorter_than_the_other_is_zero_padded():
    assert LB.merge(np.array([[1.0, 2.0]], np.float32), np.array([0.5, 0, 0, 4], np.float32)).tolist() == \
        [[1.5, 2.0, 0.0, 4.0]]
    assert LB.merge(np.zeros((1, 0), np.float32), np.array([0, 3], np.float32)).tolist() == [[0.0, 3.0]]


@pytest.mark.parametrize("extra, message", [
    ({"logit_bias_ids": _i32(1)}, "logit_bias_ids and logit_bias_weights must be given together"),
    ({"logit_bias_weights": _f32(1)}, "logit_bias_ids and logit_bias_weights must be given together"),
    ({"logit_bias_ids": _i32(1, 2), "logit_bias_weights": _f32(1)},
     "logit_bias_ids and logit_bias_weights must have the same length, got 2 and 1"),
    ({"logit_bias_ids": _i32(420), "logit_bias_weights": _f32(1)}, "logit_bias_ids must be token ids in [0, 420), got 420"),
    ({"logit_bias_ids": _i32(3, -1), "logit_bias_weights": _f32(1, 1)}, "logit_bias_ids must be token ids in [0, 420), got -1"),
    ({"logit_bias_ids": _f32(1.0), "logit_bias_weights": _f32(1)}, "logit_bias_ids must be integers, got float32"),
    ({"logit_bias_ids": _i32(1), "logit_bias_weights": _f32(np.nan)}, "logit_bias_weights must be finite, got nan"),
    ({"logit_bias_ids": _i32(1), "logit_bias_weights": _f32(-np.inf)}, "logit_bias_weights must be finite, got -inf"),
    ({"logit_bias_ids": _i32(1, 1), "logit_bias_weights": _f32(3e38, 3e38)},
     "logit_bias_weights of one id must add up to a finite float32"),
])
def test_bad_logit_bias_names_the_input(tok, extra, message):
    with pytest.raises(InvalidInput) as err:
        B.parse_request(_client(**extra), vocab_size=len(tok))
    assert str(err.value) == message


# --------------------------------------------------------------------------- timeout

@pytest.mark.parametrize("timeout_us, elapsed_s, expected", [
    (0, 5.0, 0),                 # no client timeout: none inside either
    (300_000, 0.0, 300_000),
    (300_000, 0.012, 288_000),   # preprocessing's time counts against the client's deadline
    (300_000, 0.5, 1),           # already past: the smallest deadline, never 0 (= none)
])
def test_the_inner_request_gets_what_is_left_of_the_clients_timeout(timeout_us, elapsed_s, expected):
    assert B.inner_timeout_us(timeout_us, elapsed_s) == expected
