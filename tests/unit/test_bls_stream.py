"""tritonllm.text.bls_stream: client tensors -> inner tensors, token responses -> exact text + stop strings."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tritonllm.error_names import with_client_names
from tritonllm.errors import recovered_code
from tritonllm.text import bls_stream as B
from tritonllm.text import text_generation as G
from tritonllm.text.preprocess import InvalidInput, preprocess
from tritonllm.text.tokenizer import TextTokenizer

from text_helpers import SAMPLES, byte_level, metaspace


@pytest.fixture(scope="module", params=["byte_level", "metaspace"])
def tok(request):
    return {"byte_level": byte_level, "metaspace": metaspace}[request.param]()


def _client(text="hello world", max_tokens=8, **extra):
    arrays = {"text_input": np.array([[text.encode() if isinstance(text, str) else text]], dtype=object),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32)}
    for k, v in extra.items():
        arrays[k] = v
    return arrays


def _words(*words):
    return np.array([[w.encode() if isinstance(w, str) else w for w in words]], dtype=object)


def _responses(ids, rng, *, logprobs=True):
    """ids split into random chunks, shaped like torchllm's streamed responses (batch 1, beam 1)."""
    i = 0
    while i < len(ids):
        n = rng.randint(1, 4)
        chunk = ids[i:i + n]
        i += n
        r = {"output_ids": np.array(chunk, dtype=np.int32).reshape(1, 1, -1),
             "sequence_length": np.array([[len(chunk)]], dtype=np.int32),
             "cum_log_probs": np.array([[-float(i)]], dtype=np.float32),
             "num_output_tokens": np.array([[len(chunk)]], dtype=np.int32)}  # NVIDIA's: this response's
        if logprobs:
            r["output_log_probs"] = -np.arange(i - len(chunk), i, dtype=np.float32).reshape(1, 1, -1)
        yield r


def _run(tok, req, ids, seed=0, prompt=None, **kw):
    """All chunks a client would receive, the last one being finish()'s."""
    gen = G.TextGeneration(tok, req, prompt, **kw)
    chunks = []
    for r in _responses(ids, random.Random(seed)):
        c = gen.on_response(r)
        if c is not None:
            chunks.append(c)
        if gen.stopped:
            break
    chunks.append(gen.finish())
    return gen, chunks


@pytest.mark.parametrize("text", SAMPLES)
def test_streamed_deltas_equal_whole_text_equal_decode(tok, text):
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    expected = tok.decode(ids, skip_special_tokens=True)
    for seed in range(3):
        _, streamed = _run(tok, B.parse_request(_client(stream=np.array([[True]]))), ids, seed)
        assert "".join(c.text for c in streamed) == expected
        assert all(c.text for c in streamed[:-1])  # no empty deltas before the final chunk
        _, whole = _run(tok, B.parse_request(_client()), ids, seed)
        assert len(whole) == 1 and whole[0].text == expected


def test_stop_string_is_cut_and_generation_stops(tok):
    text = "the quick brown fox jumps over a lazy dog"
    ids = tok.encode(text, add_special_tokens=False)
    for stream in (True, False):
        req = B.parse_request(_client(stop_words=_words("lazy", "zzz"), stream=np.array([[stream]])))
        gen, chunks = _run(tok, req, ids)
        assert gen.stopped and gen.matched == "lazy"
        assert "".join(c.text for c in chunks) == tok.decode(ids).split("lazy")[0]
        assert gen.num_tokens < len(ids)  # ended before the engine's stream did


def test_log_probs_past_a_stop_string_keep_their_token_ids(tok):
    """Re-tokenizing the cut text cannot name these tokens (there are more log probs than its tokens)."""
    ids = tok.encode("the quick brown fox jumps over a lazy dog", add_special_tokens=False)
    for stream in (True, False):
        req = B.parse_request(_client(stop_words=_words("brown f"), stream=np.array([[stream]])))
        gen, chunks = _run(tok, req, ids, seed=2)
        lp = [c.outputs for c in chunks if "output_log_probs" in c.outputs]
        scored = np.concatenate([o["output_token_ids"].reshape(-1) for o in lp]).tolist()
        assert len(scored) == sum(o["output_log_probs"].size for o in lp) == gen.num_tokens
        assert scored == ids[:gen.num_tokens]
        assert len(tok.encode("".join(c.text for c in chunks), add_special_tokens=False)) < len(scored)


def test_include_stop_words_keeps_the_stop_word_as_nvidias_bls(tok):
    text = "the quick brown fox jumps over a lazy dog"
    ids = tok.encode(text, add_special_tokens=False)
    for stream in (True, False):
        req = B.parse_request(_client(stop_words=_words("lazy"), stream=np.array([[stream]])))
        gen, chunks = _run(tok, req, ids, include_stop_words=True)
        assert gen.stopped and "".join(c.text for c in chunks) == tok.decode(ids).split("lazy")[0] + "lazy"


def test_stop_string_inside_a_token_and_never_matching(tok):
    text = "hello world says don't stop"
    ids = tok.encode(text, add_special_tokens=False)
    full = tok.decode(ids)
    _, chunks = _run(tok, B.parse_request(_client(stop_words=_words("orl"), stream=np.array([[True]]))), ids)
    assert "".join(c.text for c in chunks) == full[: full.index("orl")]
    _, chunks = _run(tok, B.parse_request(_client(stop_words=_words("absent", ""))), ids)
    assert chunks[-1].text == full


def test_log_probs_and_token_counts_cover_every_token_once(tok):
    ids = tok.encode("café naïve résumé — déjà vu!", add_special_tokens=False)
    for stream in (True, False):
        _, chunks = _run(tok, B.parse_request(_client(stream=np.array([[stream]]))), ids, seed=1)
        lp = np.concatenate([c.outputs["output_log_probs"].reshape(-1) for c in chunks if "output_log_probs" in c.outputs])
        assert lp.tolist() == (-np.arange(len(ids), dtype=np.float32)).tolist()
        scored = np.concatenate([c.outputs["output_token_ids"].reshape(-1) for c in chunks
                                 if "output_log_probs" in c.outputs])
        assert scored.tolist() == ids  # each log prob names its token: the engine's id, not a re-tokenization
        counts = [int(c.outputs["num_output_tokens"].reshape(-1)[0]) for c in chunks if "num_output_tokens" in c.outputs]
        assert sum(counts) == len(ids) and (stream or len(counts) == 1)
        arrays = chunks[-1].arrays()  # NVIDIA's flat text_output: [beams] per response
        assert arrays["text_output"].shape == (1,) and arrays["text_output"].dtype == object
        assert "batch_index" not in arrays


def test_a_non_streamed_answer_with_the_prompt_counts_its_tokens_too(tok):
    prompt = tok.encode("hello world", add_special_tokens=False)
    ids = tok.encode(" the quick fox", add_special_tokens=False)
    req = B.parse_request(_client(exclude_input_in_output=np.array([[False]])))
    _, chunks = _run(tok, req, ids, prompt=prompt)
    assert int(chunks[-1].outputs["num_output_tokens"].reshape(-1)[0]) == len(prompt) + len(ids)


def test_a_batch_splits_into_rows_and_refuses_mismatched_batch_sizes(tok):
    arrays = {"text_input": np.array([[b"a"], [b"b"], [b"c"]], dtype=object),
              "max_tokens": np.array([[4], [5], [6]], dtype=np.int32)}
    rows = B.split_rows(arrays)
    assert [r["text_input"].tolist() for r in rows] == [[[b"a"]], [[b"b"]], [[b"c"]]]
    assert [B.parse_request(r, i).max_tokens for i, r in enumerate(rows)] == [4, 5, 6]
    assert G.Chunk("x", batch_index=2).arrays()["batch_index"].tolist() == [[2]]
    with pytest.raises(InvalidInput, match="max_tokens must have batch size 3"):
        B.split_rows({**arrays, "max_tokens": np.array([[4]], dtype=np.int32)})


def test_prompt_is_prefixed_only_when_not_excluded_and_not_streaming(tok):
    prompt = tok.encode("hello world", add_special_tokens=False)
    gen_ids = tok.encode(" the quick fox", add_special_tokens=False)
    req = B.parse_request(_client(exclude_input_in_output=np.array([[False]])))
    _, chunks = _run(tok, req, gen_ids, prompt=prompt)
    assert chunks[-1].text == tok.decode(prompt + gen_ids)
    req = B.parse_request(_client(exclude_input_in_output=np.array([[False]]), stream=np.array([[True]])))
    _, chunks = _run(tok, req, gen_ids, prompt=prompt)
    assert "".join(c.text for c in chunks) == tok.decode(gen_ids)


@pytest.mark.parametrize("arrays, message", [
    ({"max_tokens": np.array([[4]], dtype=np.int32)}, "text_input is required"),
    (_client(""), "text_input is empty"),
    (_client(b"ok \xff\xfe"), "text_input is not valid UTF-8"),
    (_client(max_tokens=0), "max_tokens must be a positive integer"),
    (_client(max_tokens=-3), "max_tokens must be a positive integer"),
    ({"text_input": _words("hi")}, "max_tokens is required"),
    (_client(stop_words=_words(b"\xc3")), "stop_words[0] is not valid UTF-8"),
    (_client(stop_words=_words("x" * 2000)), "stop_words[0] is longer than"),
    (_client(bad_words=_words(b"\xff")), "bad_words[0] is not valid UTF-8"),
    ({"text_input": _words("a", "b"), "max_tokens": np.array([[4]], dtype=np.int32)}, "text_input must hold exactly one"),
    (_client(temperature=np.array([[1.0], [2.0]], dtype=np.float32)), "temperature must have batch size 1"),
])
def test_bad_requests_name_the_client_input(arrays, message):
    with pytest.raises(InvalidInput) as err:
        B.parse_request(arrays)
    assert message in str(err.value)


def test_inner_tensors_follow_nvidias_wiring_and_always_stream(tok):
    req = B.parse_request(_client(top_k=np.array([[5]], dtype=np.int32), stop_words=_words("dog"),
                                  stream=np.array([[False]]), exclude_input_in_output=np.array([[False]])))
    pre_in = B.preprocessing_inputs(req)
    assert set(pre_in) == {"QUERY", "REQUEST_OUTPUT_LEN", "STOP_WORDS_DICT"}
    pre_out = preprocess(TextTokenizer(tok), pre_in)
    llm = B.llm_inputs(req, pre_out)
    assert llm["input_ids"] is pre_out["INPUT_ID"] and llm["stop_words_list"] is pre_out["STOP_WORDS_IDS"]
    assert int(llm["runtime_top_k"].reshape(-1)[0]) == 5 and int(llm["request_output_len"].reshape(-1)[0]) == 8
    assert bool(llm["streaming"].reshape(-1)[0]) and bool(llm["exclude_input_in_output"].reshape(-1)[0])
    assert "stream" not in llm and "top_k" not in llm
    assert B.prompt_ids(pre_out) == tok.encode("hello world")


def test_inner_error_messages_use_client_names():
    msg = B.client_message("input length 5 + request_output_len 5000 exceeds max_seq_len 2048")
    assert msg == "input length 5 + max_tokens 5000 exceeds max_seq_len 2048"
    assert B.client_message("QUERY: prompt is empty") == "text_input: prompt is empty"
    assert B.client_message("runtime_top_p must be in [0, 1], got 2.0") == "top_p must be in [0, 1], got 2.0"
    assert B.client_message("stop_words_list holds an empty word") == "stop_words holds an empty word"
    assert B.client_message("streaming is fine; end_id 9 is outside") == "streaming is fine; end_id 9 is outside"


def test_ensemble_errors_name_the_client_input_too():
    msg = "input length 3 + request_output_len 9000 exceeds max_seq_len 2048"
    annotated = with_client_names(msg)
    assert annotated == "input length 3 + request_output_len (max_tokens) 9000 exceeds max_seq_len 2048"
    assert with_client_names(annotated) == annotated  # idempotent
    assert with_client_names("STOP_WORDS_DICT[1] is not valid UTF-8") == \
        "STOP_WORDS_DICT[1] (stop_words[1]) is not valid UTF-8"
    assert B.client_message(annotated) == B.client_message(msg) == "input length 3 + max_tokens 9000 exceeds max_seq_len 2048"
    assert with_client_names("streaming and end_id are fine") == "streaming and end_id are fine"


@pytest.mark.parametrize("message,code", [
    ("max_tokens 100000 exceeds max_seq_len 2048", "INVALID_ARG"),
    ("embedding_bias_words and embedding_bias_weights must be given together", "INVALID_ARG"),
    ("Maximum queue size of 256 has been reached, please try again later (Exceeds maximum queue size: ...)", "UNAVAILABLE"),
    ("the engine is shutting down", "UNAVAILABLE"),
    ("request cancelled", "CANCELLED"),
    ("internal error: boom", "INTERNAL"),
    ("preprocessing failed: KeyError('x')", "INTERNAL"),
    ("engine step failed: RuntimeError", "INTERNAL"),
])
def test_inner_error_codes_lost_by_the_bls_are_recovered_from_the_message(message, code):
    assert recovered_code(message) == code
