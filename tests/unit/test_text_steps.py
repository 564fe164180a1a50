"""preprocess / Postprocessor: NVIDIA's tensors in and out, errors named, streams exact."""

from __future__ import annotations

import random

import numpy as np
import pytest

from text_helpers import ALL, SAMPLES, random_chunks
from tritonllm.text.postprocess import Postprocessor
from tritonllm.text.preprocess import InvalidInput, preprocess
from tritonllm.text.tokenizer import TextTokenizer
from tritonllm.text.word_lists import decode_word_list, words_to_ids


@pytest.fixture(scope="module")
def tok():
    return TextTokenizer(ALL["byte_level"]())


def _req(*queries, out_len=8, **extra):
    inputs = {"QUERY": np.array([[q] for q in queries], dtype=object),
              "REQUEST_OUTPUT_LEN": np.full((len(queries), 1), out_len, np.int32)}
    inputs.update(extra)
    return inputs


def test_preprocess_outputs(tok):
    out = preprocess(tok, _req("hello world".encode()))
    ids = tok.encode_prompt("hello world").ids
    assert out["INPUT_ID"].dtype == np.int32 and out["INPUT_ID"].tolist() == [ids]
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(ids)]]
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[8]]
    assert out["OUT_END_ID"].tolist() == [[tok.eos_id]] and out["OUT_PAD_ID"].tolist() == [[tok.pad_id]]
    assert out["STOP_WORDS_IDS"].shape == (1, 2, 0) and out["BAD_WORDS_IDS"].shape == (1, 2, 0)
    assert out["EMBEDDING_BIAS"].shape == (1, 0)


def test_preprocess_batch_pads_with_pad_id(tok):
    out = preprocess(tok, _req(b"a", b"the quick brown fox", PAD_ID=np.array([[2], [2]], np.int32)))
    short = tok.encode_prompt("a").ids
    assert out["INPUT_ID"].shape[0] == 2
    assert out["INPUT_ID"][0, : len(short)].tolist() == short
    assert set(out["INPUT_ID"][0, len(short):].tolist()) == {2}
    assert out["REQUEST_INPUT_LEN"][:, 0].tolist() == [len(short), len(tok.encode_prompt("the quick brown fox").ids)]


def test_preprocess_words_and_ids(tok):
    out = preprocess(tok, _req(b"q", STOP_WORDS_DICT=np.array([[b"world", b""]], dtype=object),
                               BAD_WORDS_DICT=np.array([[b"fox"]], dtype=object),
                               END_ID=np.array([[9]], np.int32)))
    assert decode_word_list(out["STOP_WORDS_IDS"][0]) == words_to_ids(tok.encode_plain, ["world"])
    assert decode_word_list(out["BAD_WORDS_IDS"][0]) == words_to_ids(tok.encode_plain, ["fox"])
    assert out["OUT_END_ID"].tolist() == [[9]]


def test_preprocess_embedding_bias(tok):
    out = preprocess(tok, _req(b"q", EMBEDDING_BIAS_WORDS=np.array([[b"fox"]], dtype=object),
                               EMBEDDING_BIAS_WEIGHTS=np.array([[1.5]], np.float32)))
    bias = out["EMBEDDING_BIAS"]
    assert bias.shape == (1, tok.vocab_size)
    assert np.allclose(bias[0, tok.encode_plain("fox")], 1.5) and bias.sum() == pytest.approx(1.5 * len(tok.encode_plain("fox")))


@pytest.mark.parametrize("inputs, message", [
    ({"REQUEST_OUTPUT_LEN": np.array([[4]], np.int32)}, "QUERY is required"),
    (_req(b""), "QUERY: prompt is empty"),
    (_req(b"\xff\xfe"), "QUERY is not valid UTF-8"),
    (_req(b"hi", out_len=0), "REQUEST_OUTPUT_LEN must be > 0"),
    ({"QUERY": np.array([[b"hi"]], dtype=object)}, "REQUEST_OUTPUT_LEN is required"),
    (_req(b"hi", STOP_WORDS_DICT=np.array([[b"\xff"]], dtype=object)), r"STOP_WORDS_DICT\[0\] is not valid UTF-8"),
    (_req(b"hi", STOP_WORDS_DICT=np.array([[b"a"], [b"b"]], dtype=object)), "STOP_WORDS_DICT must have batch size 1"),
    (_req(b"hi", END_ID=np.array([[1.5]], np.float32)), "END_ID must be one integer"),
    (_req(b"hi", EMBEDDING_BIAS_WORDS=np.array([[b"a"]], dtype=object)), "must be given together"),
])
def test_preprocess_rejections_name_the_input(tok, inputs, message):
    with pytest.raises(InvalidInput, match=message):
        preprocess(tok, inputs)


def _chunk_inputs(ids, **extra):
    arr = np.array(ids, dtype=np.int32).reshape(1, 1, len(ids))
    return {"TOKENS_BATCH": arr, "SEQUENCE_LENGTH": np.array([[len(ids)]], np.int32), **extra}


def _text(out):
    assert out["OUTPUT"].ndim == 1  # NVIDIA's flat [batch * beams]
    return out["OUTPUT"][0].decode("utf-8")


@pytest.mark.parametrize("name", sorted(ALL))
def test_streamed_chunks_by_request_id_are_exact(name):
    hf = ALL[name]()
    post = Postprocessor(hf, key_by_request_id=True)  # the GPU profile: no REQUEST_KEY from the engine
    rng = random.Random(0)
    for i, s in enumerate(SAMPLES):
        ids = hf.encode(s, add_special_tokens=False) + [hf.eos_token_id]
        chunks = random_chunks(ids, rng, 3)
        streamed = "".join(_text(post.run(_chunk_inputs(c, IS_FINAL=np.array([[j == len(chunks) - 1]])),
                                          request_id=f"r{i}")) for j, c in enumerate(chunks))
        assert streamed == hf.decode(ids, skip_special_tokens=True)
    assert len(post.registry) == 0


def test_request_key_beats_duplicate_request_ids():
    hf = ALL["llama_fallback"]()
    post = Postprocessor(hf)
    a, b = (hf.encode(t, add_special_tokens=False) for t in ("x 😀 y", "中文 café"))
    out = {1: [], 2: []}
    for j in range(max(len(a), len(b))):  # two streams, same (empty) client id, interleaved
        for key, ids in ((1, a), (2, b)):
            if j < len(ids):
                fin = np.array([[j == len(ids) - 1]])
                out[key].append(_text(post.run(_chunk_inputs([ids[j]], REQUEST_KEY=np.array([[key]], np.uint64),
                                                             IS_FINAL=fin), request_id="")))
    assert "".join(out[1]) == hf.decode(a) and "".join(out[2]) == hf.decode(b)


def test_without_key_by_request_id_a_reused_id_never_continues_an_earlier_sequence():
    """NVIDIA's end_to_end_test.py calls postprocessing directly under ids "0", "1", ... on every run."""
    hf = ALL["byte_level"]()
    post = Postprocessor(hf)
    for text in ("hello world", "a different answer"):
        ids = hf.encode(text, add_special_tokens=False)
        assert _text(post.run(_chunk_inputs(ids), request_id="0")) == hf.decode(ids)
    assert len(post.registry) == 0


def test_whole_sequence_without_key_is_exact():
    hf = ALL["llama_fallback"]()
    ids = hf.encode("ab 😀", add_special_tokens=False)[:-1]  # ends inside the emoji
    out = Postprocessor(hf).run(_chunk_inputs(ids))
    assert _text(out) == hf.decode(ids)


def test_postprocess_shapes_beams_and_pass_through():
    hf = ALL["byte_level"]()
    post = Postprocessor(hf)
    ids = hf.encode("hello world", add_special_tokens=False)
    tokens = np.array([[ids, ids[::-1]]], np.int32)  # batch 1, 2 beams
    cum = np.array([[-1.0, -2.0]], np.float32)
    out = post.run({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([[len(ids), 2]], np.int32),
                    "CUM_LOG_PROBS": cum}, request_id="beams")
    assert out["OUTPUT"].shape == (2,)  # flat, batch-major, as NVIDIA's postprocessing returns it
    assert out["OUTPUT"][0].decode() == hf.decode(ids)
    assert out["OUTPUT"][1].decode() == hf.decode(ids[::-1][:2])
    assert out["OUT_CUM_LOG_PROBS"] is cum or np.array_equal(out["OUT_CUM_LOG_PROBS"], cum)
    assert len(post.registry) == 0  # beams are decoded statelessly


@pytest.mark.parametrize("inputs, message", [
    ({}, "TOKENS_BATCH is required"),
    ({"TOKENS_BATCH": np.zeros((1, 1, 2), np.float32)}, "TOKENS_BATCH must be integer"),
    ({"TOKENS_BATCH": np.zeros((1, 1, 2), np.int32), "SEQUENCE_LENGTH": np.array([[3]], np.int32)},
     "SEQUENCE_LENGTH must be within"),
    ({"TOKENS_BATCH": np.zeros((1, 1, 2), np.int32), "IS_FINAL": np.array([[True, False]])}, "IS_FINAL must hold one"),
])
def test_postprocess_rejections(inputs, message):
    with pytest.raises(InvalidInput, match=message):
        Postprocessor(ALL["byte_level"]()).run(inputs)


def test_keyed_without_is_final_shows_complete_byte_runs():
    """No end signal (e.g. the real TensorRT-LLM backend): text made of byte-fallback tokens that is
    valid UTF-8 is shown at once, so a whole response sent under a request id is not kept back."""
    hf = ALL["llama_fallback"]()
    post = Postprocessor(hf, key_by_request_id=True)
    ids = hf.encode("中文测试 fox", add_special_tokens=False)
    assert hf.convert_ids_to_tokens(ids)[-1].startswith("<0x")  # ends in a byte token
    assert _text(post.run(_chunk_inputs(ids), request_id="whole")) == hf.decode(ids)
    streamed = "".join(_text(post.run(_chunk_inputs([t]), request_id="stream")) for t in ids)
    assert streamed == hf.decode(ids)
