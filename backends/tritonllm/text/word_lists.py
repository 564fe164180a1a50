"""Stop words / bad words <-> TensorRT-LLM's ``[2, N]`` INT32 word-list format.

Format (what ``stop_words_list`` / ``bad_words_list`` of the tensorrt_llm model take): row 0 holds the
token ids of all words back to back; row 1 holds the cumulative end offset of each word in row 0,
then -1 up to N. Row 0 is padded with 0. No words -> shape ``[2, 0]``.

Why words are encoded *in context*: a generated "world" is almost never the token sequence of the
string "world" on its own. After a space, byte-level BPE makes "Ġworld"; SentencePiece-style
(Metaspace) tokenizers encode a bare word as "▁world" (they prepend the word-start marker) while a
word glued to the previous text has no marker. NVIDIA's preprocessing encodes the bare word only, so
most stop words never match. Here each word yields up to three id sequences (deduplicated):
  1. the word encoded alone;
  2. the word right after a token boundary with no space (anchor + word, anchor ids removed);
  3. the word after a space (anchor + " " + word), unless it already starts with whitespace.
The anchor is a newline, which every common pre-tokenizer splits on. A variant is dropped when the
anchor's ids are not an exact prefix of the combined ids (the anchor merged with the word).
Token-level matching stays best effort (a stop string can be produced by tokens that straddle it);
the exact text cut of stop strings is done on text by ``stop_strings.StopStringMatcher``.

Invariants: ``decode_word_list(encode_word_list(x)) == x`` for any list of non-empty id lists, and
every malformed input raises ValueError with a message that names what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

MAX_WORDS = 1024
MAX_WORD_CHARS = 1024
_ANCHOR = "\n"

Encode = Callable[[str], Sequence[int]]


def parse_words(values: Iterable[object], what: str = "words") -> list[str]:
    """Turn one request's BYTES/str elements into strings; invalid UTF-8 or non-text -> ValueError.

    Empty strings are skipped (clients send ``[""]`` to mean "none", as NVIDIA's clients do).
    """
    words: list[str] = []
    for i, v in enumerate(values):
        if isinstance(v, (bytes, bytearray, np.bytes_)):
            try:
                v = bytes(v).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{what}[{i}] is not valid UTF-8: {e.reason}") from None
        elif not isinstance(v, str):
            raise ValueError(f"{what}[{i}] must be a string, got {type(v).__name__}")
        if len(v) > MAX_WORD_CHARS:
            raise ValueError(f"{what}[{i}] is longer than {MAX_WORD_CHARS} characters")
        if v:
            words.append(v)
    if len(words) > MAX_WORDS:
        raise ValueError(f"{what}: at most {MAX_WORDS} words, got {len(words)}")
    return words


def word_variants(encode: Encode, word: str, *, in_context: bool = True) -> list[list[int]]:
    """Id sequences under which ``word`` can appear in generated text (see module docstring)."""
    if not word:
        raise ValueError("word is empty")
    variants = [list(encode(word))]
    if in_context:
        base = list(encode(_ANCHOR))
        texts = [_ANCHOR + word]
        if not word[0].isspace():
            texts.append(_ANCHOR + " " + word)
        for text in texts:
            ids = list(encode(text))
            if ids[: len(base)] == base and len(ids) > len(base):
                variants.append(ids[len(base):])
    out: list[list[int]] = []
    for v in variants:
        if v and v not in out:
            out.append(v)
    return out


def words_to_ids(encode: Encode, words: Sequence[str], *, in_context: bool = True) -> list[list[int]]:
    """All id sequences for ``words`` in order, variants of one word kept together."""
    out: list[list[int]] = []
    for w in words:
        for v in word_variants(encode, w, in_context=in_context):
            if v not in out:
                out.append(v)
    return out


def encode_word_list(word_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """``[[ids of word 0], [ids of word 1], ...]`` -> INT32 array of shape ``[2, N]``."""
    flat: list[int] = []
    offsets: list[int] = []
    for i, ids in enumerate(word_ids):
        if len(ids) == 0:
            raise ValueError(f"word {i} has no token ids")
        for t in ids:
            if int(t) < 0 or int(t) > np.iinfo(np.int32).max:
                raise ValueError(f"word {i} has an out-of-range token id {t}")
        flat.extend(int(t) for t in ids)
        offsets.append(len(flat))
    n = len(flat)
    out = np.zeros((2, n), dtype=np.int32)
    out[0, :n] = flat
    out[1, :] = -1
    out[1, : len(offsets)] = offsets
    return out


def decode_word_list(array: object) -> list[list[int]]:
    """Inverse of ``encode_word_list``; validates shape, dtype, offsets and padding."""
    arr = np.asarray(array)
    if arr.ndim != 2 or arr.shape[0] != 2:
        raise ValueError(f"word list must have shape [2, N], got {list(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"word list must hold integers, got {arr.dtype}")
    ids, offsets = arr[0].astype(np.int64), arr[1].astype(np.int64)
    n = arr.shape[1]
    count = int(np.argmax(offsets < 0)) if (offsets < 0).any() else n
    if (offsets[count:] != -1).any():
        raise ValueError("word list offsets: after the first -1 every offset must be -1")
    used = offsets[:count]
    if count and (used[0] <= 0 or (np.diff(used) <= 0).any()):
        raise ValueError("word list offsets must be positive and strictly increasing")
    end = int(used[-1]) if count else 0
    if end > n:
        raise ValueError(f"word list offset {end} is beyond the {n} ids of row 0")
    if (ids[:end] < 0).any():
        raise ValueError("word list ids must be non-negative")
    words, start = [], 0
    for stop in used.tolist():
        words.append(ids[start:stop].tolist())
        start = stop
    return words


def words_to_word_list(encode: Encode, values: Iterable[object], *, what: str = "words",
                       in_context: bool = True) -> np.ndarray:
    """Request elements (BYTES/str) -> ``[2, N]`` word list: parse, encode in context, pack."""
    return encode_word_list(words_to_ids(encode, parse_words(values, what), in_context=in_context))


def stack_word_lists(lists: Sequence[np.ndarray]) -> np.ndarray:
    """Batch ``[2, N_i]`` lists into ``[B, 2, max N]`` (ids padded 0, offsets padded -1)."""
    width = max((a.shape[1] for a in lists), default=0)
    out = np.zeros((len(lists), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for b, a in enumerate(lists):
        out[b, :, : a.shape[1]] = a
    return out
