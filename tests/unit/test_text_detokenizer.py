"""IncrementalDetokenizer: streamed deltas concatenate to exactly the non-streamed decode."""

from __future__ import annotations

import random

import pytest

from text_helpers import ALL, SAMPLES, random_chunks, wordpiece
from tritonllm.text.detokenizer import (REPLACEMENT, IncrementalDetokenizer, clean_up_tokenization,
                                        decode_applies_cleanup, detokenize_chunks)


@pytest.fixture(scope="module", params=sorted(ALL))
def tok(request):
    return ALL[request.param]()


def _stream(tok, chunks, skip):
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = [d.add(c) for c in chunks]
    deltas.append(d.finish())
    assert not d.diverged
    return deltas


def _sequences(tok):
    """Prompt-like and generation-like id sequences, with special tokens inside and at the ends."""
    user, asst = tok.convert_tokens_to_ids(["<|user|>", "<|assistant|>"])
    seqs = []
    for text in SAMPLES:
        ids = tok.encode(text, add_special_tokens=True)
        seqs.append(ids + [tok.eos_token_id])
        seqs.append(tok.encode(text, add_special_tokens=False))
        seqs.append([user] + tok.encode(text, add_special_tokens=False) + [asst, asst] + ids)
    return seqs


@pytest.mark.parametrize("skip", [True, False])
def test_token_by_token_equals_full_decode(tok, skip):
    for ids in _sequences(tok):
        deltas = _stream(tok, [[t] for t in ids], skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("skip", [True, False])
def test_random_chunks_equal_full_decode(tok, skip):
    rng = random.Random(1)
    for ids in _sequences(tok):
        for _ in range(3):
            deltas = _stream(tok, random_chunks(ids, rng), skip)
            assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)


def test_random_token_soup_is_exact(tok):
    """Arbitrary ids make invalid and split UTF-8, lone markers, specials anywhere."""
    rng = random.Random(7)
    vocab = len(tok)
    for _ in range(150):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        for skip in (True, False):
            chunks = random_chunks(ids, rng, max_chunk=3)
            assert "".join(_stream(tok, chunks, skip)) == tok.decode(ids, skip_special_tokens=skip)


def test_split_utf8_is_held_back_not_garbled():
    tok = ALL["llama_fallback"]()
    ids = tok.encode("x 😀 y", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert "<0xF0>" in pieces, pieces  # the emoji really is four byte tokens
    d = IncrementalDetokenizer(tok)
    deltas = [d.add([t]) for t in ids] + [d.finish()]
    assert not any(REPLACEMENT in x for x in deltas)
    assert any("😀" in x for x in deltas)  # whole, once its byte run is complete
    i = pieces.index("<0xF0>")
    assert deltas[i:i + 3] == ["", "", ""]
    # Per-token decoding (NVIDIA's postprocessing) garbles it:
    assert REPLACEMENT in "".join(tok.decode([t]) for t in ids)


def test_byte_level_split_utf8(tok):
    text = "中文测试：你好，世界。 🙂🚀"
    ids = tok.encode(text, add_special_tokens=False)
    deltas = _stream(tok, [[t] for t in ids], True)
    assert not any(REPLACEMENT in x for x in deltas)
    assert "".join(deltas) == tok.decode(ids)


def test_truncated_character_is_flushed_on_finish():
    tok = ALL["llama_fallback"]()
    ids = tok.encode("ab 😀", add_special_tokens=False)[:-2]  # stop inside the emoji's bytes
    d = IncrementalDetokenizer(tok)
    streamed = "".join(d.add([t]) for t in ids)
    assert not streamed.endswith(REPLACEMENT)
    tail = d.finish()
    assert tail.endswith(REPLACEMENT)
    assert streamed + tail == tok.decode(ids)


def test_sentencepiece_leading_spaces():
    tok = ALL["metaspace"]()
    ids = tok.encode("the quick brown fox", add_special_tokens=False)
    assert len(ids) >= 4
    deltas = _stream(tok, [[t] for t in ids], True)
    assert deltas[:4] == ["the", " quick", " brown", " fox"]
    # Decoding each token alone drops every word's space (the NVIDIA defect):
    assert "".join(tok.decode([t]) for t in ids) == "thequickbrownfox"


def test_skipped_special_between_words_keeps_space():
    tok = ALL["metaspace"]()
    words = tok.encode("hello world", add_special_tokens=False)
    ids = words[:1] + [tok.eos_token_id] + words[1:]
    assert "".join(_stream(tok, [[t] for t in ids], True)) == tok.decode(ids, skip_special_tokens=True)


def test_finish_is_idempotent_and_add_after_finish_fails(tok):
    d = IncrementalDetokenizer(tok)
    d.add(tok.encode("hello", add_special_tokens=False))
    d.finish()
    assert d.finish() == ""
    with pytest.raises(RuntimeError):
        d.add([1])


def test_text_and_token_count(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    d = IncrementalDetokenizer(tok)
    for t in ids:
        d.add([t])
    d.finish()
    assert d.token_count == len(ids)
    assert d.text == tok.decode(ids)


def test_empty_chunks_are_harmless(tok):
    ids = tok.encode("café 中文", add_special_tokens=False)
    chunks = [[]] + [[t] for t in ids] + [[]]
    assert "".join(_stream(tok, chunks, True)) == tok.decode(ids)


def test_detokenize_chunks_helper(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    assert "".join(detokenize_chunks(tok, [[t] for t in ids])) == tok.decode(ids)
    assert detokenize_chunks(tok, []) == [""]


def test_cleanup_tokenization_spaces_stays_exact():
    tok = wordpiece()
    assert decode_applies_cleanup(tok)
    ids = tok.encode("don't stop , we're here . it's fine ! ok ? you've", add_special_tokens=False)
    expected = tok.decode(ids)
    assert expected != tok.backend_tokenizer.decode(ids)  # cleanup really rewrote the text
    assert "".join(_stream(tok, [[t] for t in ids], True)) == expected
    rng = random.Random(3)
    for _ in range(20):
        assert "".join(_stream(tok, random_chunks(ids, rng), True)) == expected
    soup = [rng.randrange(len(tok)) for _ in range(200)]
    assert "".join(_stream(tok, [[t] for t in soup], False)) == tok.decode(soup, skip_special_tokens=False)


def test_clean_up_tokenization_matches_transformers():
    tok = wordpiece()
    text = "a . b ? c ! d , e ' f do n't I 'm it 's we 've they 're"
    assert clean_up_tokenization(text) == tok.clean_up_tokenization(text)


def test_without_byte_run_hold_valid_text_stays_exact():
    tok = ALL["llama_fallback"]()
    for text in SAMPLES:
        ids = tok.encode(text, add_special_tokens=False)
        d = IncrementalDetokenizer(tok, hold_byte_runs=False)
        streamed = "".join(d.add([t]) for t in ids)
        assert streamed == tok.decode(ids) and not d.diverged  # complete without finish()
