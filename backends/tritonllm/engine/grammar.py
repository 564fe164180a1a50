"""Structured output through xgrammar: JSON (any or by schema), regex and EBNF grammars.

Guide types are TensorRT-LLM's `guided_decoding_guide_type` values. JSON is compact (no free whitespace
between tokens): fewer tokens, and a weak model cannot pad forever. A grammar compiles once per
(type, guide) (LRU-cached by xgrammar's compiler); each request gets its own GrammarMatcher. Every step the
matcher's token bitmask masks the logits row before sampling, and the chosen token advances the matcher,
so every finished output is in the grammar's language. xgrammar is imported lazily: engines that never
see a guide don't need it.
"""
from __future__ import annotations

import threading

import torch

from .request import InvalidRequest

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")


class GrammarBackend:
    def __init__(self, tokenizer_dir: str, vocab_size: int) -> None:
        try:
            import xgrammar as xgr
        except ImportError as e:  # pragma: no cover - xgrammar is a listed dependency
            raise InvalidRequest("guided decoding needs the xgrammar package") from e
        from ..model_files import load_hf_tokenizer

        self._xgr = xgr
        tok = load_hf_tokenizer(tokenizer_dir)  # a folder or a GGUF file
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._lock = threading.Lock()  # compile from request threads, one at a time

    def compile(self, guide_type: str, guide: str):
        if guide_type not in GUIDE_TYPES:
            raise InvalidRequest(f"guided_decoding_guide_type {guide_type!r} not in {list(GUIDE_TYPES)}")
        if guide_type != "json" and not guide:
            raise InvalidRequest(f"guided_decoding_guide is required for guide type {guide_type!r}")
        try:
            with self._lock:
                if guide_type == "json":
                    return (self.compiler.compile_json_schema(guide, any_whitespace=False) if guide
                            else self.compiler.compile_builtin_json_grammar())
                if guide_type == "json_schema":
                    return self.compiler.compile_json_schema(guide, any_whitespace=False)
                if guide_type == "regex":
                    return self.compiler.compile_regex(guide)
                return self.compiler.compile_grammar(guide)
        except (RuntimeError, ValueError) as e:
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise InvalidRequest(f"guided_decoding_guide does not compile as {guide_type}: {msg}") from e

    def matcher(self, compiled):
        return Matcher(self._xgr, compiled, self.info.vocab_size)


class Matcher:
    """One request's grammar state."""

    def __init__(self, xgr, compiled, vocab_size: int) -> None:
        self._xgr = xgr
        self.m = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self, logits_row: torch.Tensor) -> None:
        """In place: tokens the grammar forbids next get -inf."""
        self.m.fill_next_token_bitmask(self.bitmask)
        self._xgr.apply_token_bitmask_inplace(logits_row.view(1, -1), self.bitmask)

    def accept(self, token: int) -> bool:
        return self.m.accept_token(token)

    @property
    def terminated(self) -> bool:
        return self.m.is_terminated()
