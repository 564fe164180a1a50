"""Exact incremental detokenization: token ids in, text deltas out.

Invariant (what the unit tests prove for byte-level BPE and SentencePiece-style tokenizers, token by
token and in random chunk sizes): for any split of ``ids`` into chunks,

    "".join(d.add(chunk) for chunk in chunks) + d.finish()
        == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

Decoding each chunk on its own (what NVIDIA's postprocessing does) is wrong twice over: a UTF-8
character whose bytes are split across tokens decodes to U+FFFD, and SentencePiece-style decoders
drop the leading space of whatever token comes first in the decoded list. The technique (the one
vLLM's ``detokenize_incrementally`` uses): keep a window start ``prefix`` and a ``read`` offset;
decode ``ids[prefix:read]`` and ``ids[prefix:]`` with the same decoder and emit what the second
adds to the first. Both decodes start at the same token, so first-token rules apply equally to
both and cancel out. A delta that ends in U+FFFD may be an incomplete character: it is held back
(offsets unchanged) until more tokens complete it, or until ``finish``.

Three further guards keep the invariant when the fast path cannot:
- byte-fallback decoders (Llama-2 style ``<0xNN>`` tokens) decode a whole run of byte tokens
  together, and one bad byte turns every byte of the run into U+FFFD, so text already decoded from
  the run could change. While the last token is a byte token nothing is emitted; the window only
  ever starts right after a non-byte token. This needs ``finish`` to be called at the end (else a
  trailing run is never shown); a caller that cannot know the end passes ``hold_byte_runs=False``
  and keeps exactness for every byte run that is valid UTF-8 (what models emit in practice).
- transformers' ``clean_up_tokenization_spaces`` rewrites text non-locally (" n't" -> "n't" removes
  a space that came one token earlier). When ``tokenizer.decode`` applies it, a raw tail that could
  start such a pattern is held back, and cleanup is applied to text that no pattern can straddle.
- if the windowed decode is ever not an extension of the window's prefix (a non-local decoder), the
  delta is recomputed against a full decode of all ids ("resync"); ``diverged`` records the
  impossible case where text already emitted is contradicted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

REPLACEMENT = "\ufffd"

# transformers' clean_up_tokenization patterns; every one starts with a space.
_CLEANUP_PATTERNS = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")
_CLEANUP_PREFIXES = sorted({p[:i] for p in _CLEANUP_PATTERNS for i in range(1, len(p))}, key=len, reverse=True)


def clean_up_tokenization(text: str) -> str:
    """transformers' cleanup, applied in the same order (the order matters for overlapping rules)."""
    for pattern in _CLEANUP_PATTERNS:
        text = text.replace(pattern, pattern[1:] if pattern != " ' " else "'")
    return text


def decode_applies_cleanup(tokenizer: Any) -> bool:
    """Whether ``tokenizer.decode`` rewrites spaces after the backend decode (probed, not guessed:
    transformers versions differ on when they apply it)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    ids = tokenizer.encode("a . b n't c", add_special_tokens=False)
    raw = backend.decode(ids, skip_special_tokens=False)
    if clean_up_tokenization(raw) == raw:  # the probe text did not survive tokenization as spaced
        return bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    return tokenizer.decode(ids, skip_special_tokens=False) != raw


def _cleanup_holdback(text: str) -> int:
    """Index where the tail that could still become a cleanup pattern begins (len(text) if none)."""
    for prefix in _CLEANUP_PREFIXES:
        if text.endswith(prefix):
            return len(text) - len(prefix)
    return len(text)


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass(frozen=True)
class TokenizerTraits:
    """Facts about a tokenizer's decode that the detokenizer needs; computed once per tokenizer."""

    cleanup: bool
    byte_ids: frozenset[int]


def tokenizer_traits(tokenizer: Any) -> TokenizerTraits:
    """Probe ``tokenizer`` (cached on the object when it allows attributes)."""
    cached = getattr(tokenizer, "_tritonllm_traits", None)
    if isinstance(cached, TokenizerTraits):
        return cached
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    byte_ids: frozenset[int] = frozenset()
    if getattr(getattr(backend, "model", None), "byte_fallback", False):
        byte_ids = frozenset(i for t, i in backend.get_vocab().items() if _BYTE_TOKEN.fullmatch(t))
    traits = TokenizerTraits(cleanup=decode_applies_cleanup(tokenizer), byte_ids=byte_ids)
    try:
        tokenizer._tritonllm_traits = traits
    except AttributeError:  # a Rust-backed object without __dict__: probe again next time
        pass
    return traits


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas (see module docstring for the invariant).

    ``tokenizer`` is a fast HF tokenizer (anything with ``backend_tokenizer``) or a raw
    ``tokenizers.Tokenizer``. ``traits`` None = ``tokenizer_traits(tokenizer)``. Not thread-safe:
    one instance per sequence.
    """

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True,
                 traits: TokenizerTraits | None = None, hold_byte_runs: bool = True) -> None:
        self._backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self._skip = skip_special_tokens
        traits = traits or tokenizer_traits(tokenizer)
        self._cleanup = traits.cleanup
        self._byte_ids = traits.byte_ids if hold_byte_runs else frozenset()
        self._ids: list[int] = []
        self._prefix = 0  # window start: decodes are taken from here
        self._read = 0  # ids before this are reflected in emitted (or pending) text
        self._prefix_text = ""  # decode(ids[prefix:read])
        self._raw_emitted: list[str] = []  # raw (pre-cleanup) text produced so far, for resync
        self._raw_len = 0
        self._pending = ""  # raw text held back for cleanup safety
        self._out: list[str] = []
        self._finished = False
        self.diverged = False

    def _decode(self, ids: list[int]) -> str:
        return self._backend.decode(ids, skip_special_tokens=self._skip)

    @property
    def token_count(self) -> int:
        return len(self._ids)

    @property
    def text(self) -> str:
        """Everything returned so far, concatenated."""
        return "".join(self._out)

    @property
    def finished(self) -> bool:
        return self._finished

    def add(self, new_ids: Iterable[int]) -> str:
        """Append ids and return the text they make safe to show (possibly "")."""
        if self._finished:
            raise RuntimeError("detokenizer already finished")
        self._ids.extend(int(t) for t in new_ids)
        return self._emit(self._advance(final=False), final=False)

    def finish(self, new_ids: Iterable[int] = ()) -> str:
        """Append the last ids (if any) and return everything still held back. Idempotent after."""
        if self._finished:
            return ""
        self._ids.extend(int(t) for t in new_ids)
        out = self._emit(self._advance(final=True), final=True)
        self._finished = True
        return out

    def _advance(self, *, final: bool) -> str:
        """Raw text added by ids[read:]; moves the window only when that text is emitted."""
        n = len(self._ids)
        if self._read == n:
            return ""
        if not final and self._ids[-1] in self._byte_ids:
            return ""
        full = self._decode(self._ids[self._prefix:])
        if not final and full.endswith(REPLACEMENT):
            return ""
        if not full.startswith(self._prefix_text):
            return self._resync(final)
        delta = full[len(self._prefix_text):]
        window_text = self._decode(self._ids[self._read:])
        if window_text:
            self._prefix, self._prefix_text = self._read, window_text
        else:
            # A window whose text is empty (e.g. only skipped special tokens) would make the next
            # token "first" for the decoder and lose its leading space; keep the older start.
            self._prefix_text = full
        self._read = n
        self._record_raw(delta)
        return delta

    def _resync(self, final: bool) -> str:
        full = self._decode(self._ids)
        emitted = "".join(self._raw_emitted)
        if not full.startswith(emitted):
            self.diverged = True
        elif not final and full.endswith(REPLACEMENT):
            return ""
        delta = full[len(emitted):] if not self.diverged else full[min(len(full), self._raw_len):]
        self._prefix, self._read, self._prefix_text = 0, len(self._ids), full
        self._record_raw(delta)
        return delta

    def _record_raw(self, delta: str) -> None:
        if delta:
            self._raw_emitted.append(delta)
            self._raw_len += len(delta)

    def _emit(self, raw: str, *, final: bool) -> str:
        if self._cleanup:
            text = self._pending + raw
            cut = len(text) if final else _cleanup_holdback(text)
            self._pending = text[cut:]
            out = clean_up_tokenization(text[:cut])
        else:
            out = raw
        if out:
            self._out.append(out)
        return out


def detokenizer_factory(tokenizer: Any, *, skip_special_tokens: bool = True):
    """``factory(hold_byte_runs=True)`` -> a new IncrementalDetokenizer over ``tokenizer`` (traits read once):
    one per sequence, as the postprocessing step and the engine's text_output make them."""
    traits = tokenizer_traits(tokenizer)

    def factory(hold_byte_runs: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens, traits=traits,
                                      hold_byte_runs=hold_byte_runs)
    return factory


def detokenize_chunks(tokenizer: Any, chunks: Iterable[Iterable[int]], *, skip_special_tokens: bool = True) -> list[str]:
    """Deltas for each chunk, with the final flush appended to the last one (for tests and tools)."""
    d = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    out = [d.add(c) for c in chunks]
    tail = d.finish()
    if out:
        out[-1] += tail
    else:
        out.append(tail)
    return out
