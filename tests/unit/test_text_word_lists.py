"""Word lists: TensorRT-LLM [2, N] format, round trips, validation, in-context encoding."""

from __future__ import annotations

import random

import numpy as np
import pytest

from text_helpers import ALL
from tritonllm.text.word_lists import (decode_word_list, encode_word_list, parse_words, stack_word_lists,
                                       word_variants, words_to_ids, words_to_word_list)


def _encoder(tok):
    return lambda s: tok.encode(s, add_special_tokens=False)


def test_format_is_tensorrt_llm_layout():
    arr = encode_word_list([[5, 6], [7], [8, 9, 10]])
    assert arr.dtype == np.int32 and arr.shape == (2, 6)
    assert arr.tolist() == [[5, 6, 7, 8, 9, 10], [2, 3, 6, -1, -1, -1]]
    assert encode_word_list([]).shape == (2, 0)
    assert decode_word_list(np.zeros((2, 0), np.int32)) == []


def test_round_trip_random():
    rng = random.Random(0)
    for _ in range(200):
        words = [[rng.randrange(50000) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(0, 6))]
        assert decode_word_list(encode_word_list(words)) == words


def test_decode_accepts_padding_wider_than_needed():
    arr = np.array([[1, 2, 0, 0], [1, 2, -1, -1]], np.int32)
    assert decode_word_list(arr) == [[1], [2]]


@pytest.mark.parametrize("bad, message", [
    (np.zeros((3, 2), np.int32), r"shape \[2, N\]"),
    (np.zeros((2,), np.int32), r"shape \[2, N\]"),
    (np.array([[1.5, 2.0], [1.0, 2.0]]), "integers"),
    (np.array([[1, 2, 3], [2, 1, -1]]), "strictly increasing"),
    (np.array([[1, 2, 3], [0, 1, -1]]), "positive"),
    (np.array([[1, 2, 3], [1, -1, 3]]), "after the first -1"),
    (np.array([[1, 2], [1, 5]]), "beyond"),
    (np.array([[-4, 2], [1, 2]]), "non-negative"),
])
def test_decode_rejects_malformed(bad, message):
    with pytest.raises(ValueError, match=message):
        decode_word_list(bad)


def test_encode_rejects_empty_and_out_of_range_words():
    with pytest.raises(ValueError, match="word 1 has no token ids"):
        encode_word_list([[1], []])
    with pytest.raises(ValueError, match="out-of-range"):
        encode_word_list([[-1]])


def test_parse_words_validates_and_skips_empty():
    assert parse_words([b"stop", "", "caf\xe9".encode(), "x"]) == ["stop", "café", "x"]
    with pytest.raises(ValueError, match=r"STOP_WORDS_DICT\[1\] is not valid UTF-8"):
        parse_words([b"ok", b"\xff\xfe"], "STOP_WORDS_DICT")
    with pytest.raises(ValueError, match=r"BAD_WORDS_DICT\[0\] must be a string"):
        parse_words([3], "BAD_WORDS_DICT")
    with pytest.raises(ValueError, match="at most"):
        parse_words(["w"] * 5000)
    assert parse_words(np.array([[b"a", b"b"]], dtype=object)[0]) == ["a", "b"]


def _contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


@pytest.mark.parametrize("name", sorted(ALL))
def test_in_context_variants_match_generated_ids(name):
    """A word as it appears mid-sentence (after a space) and glued is covered by some variant."""
    tok = ALL[name]()
    enc = _encoder(tok)
    for word in ["world", "fox", "中文"]:
        variants = word_variants(enc, word)
        after_space = enc(f"hello {word}")
        assert any(after_space[-len(v):] == v for v in variants), (word, variants, after_space)
        glued = enc(f"hello\n{word}")
        assert any(glued[-len(v):] == v for v in variants), (word, variants, glued)
        assert variants[0] == enc(word)  # NVIDIA's encoding is always included
        assert len({tuple(v) for v in variants}) == len(variants)


def test_byte_level_bare_word_misses_without_context():
    """The NVIDIA defect this module fixes: the bare word's ids never occur after a space."""
    tok = ALL["byte_level"]()
    enc = _encoder(tok)
    bare = enc("world")
    assert not _contains(enc("hello world"), bare)
    assert len(word_variants(enc, "world")) >= 2
    assert word_variants(enc, "world", in_context=False) == [bare]


def test_words_to_word_list_end_to_end():
    tok = ALL["byte_level"]()
    enc = _encoder(tok)
    arr = words_to_word_list(enc, [b"world", b"", "fox"], what="STOP_WORDS_DICT")
    assert decode_word_list(arr) == words_to_ids(enc, ["world", "fox"])
    assert words_to_word_list(enc, [b""]).shape == (2, 0)


def test_leading_whitespace_word_has_no_space_variant():
    tok = ALL["byte_level"]()
    enc = _encoder(tok)
    for v in word_variants(enc, " world"):
        assert tok.decode(v) in (" world", "world")


def test_stack_word_lists():
    a, b = encode_word_list([[1, 2]]), encode_word_list([[3], [4], [5]])
    out = stack_word_lists([a, b, encode_word_list([])])
    assert out.shape == (3, 2, 3) and out.dtype == np.int32
    assert [decode_word_list(x) for x in out] == [[[1, 2]], [[3], [4], [5]], []]
    assert stack_word_lists([encode_word_list([])]).shape == (1, 2, 0)
