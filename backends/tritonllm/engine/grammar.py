"""Structured output through xgrammar: JSON (any or by schema), regex and EBNF grammars.

Guide types are TensorRT-LLM's `guided_decoding_guide_type` values. JSON is compact (no free whitespace
between tokens): fewer tokens, and a weak model cannot pad forever. A grammar compiles once per
(type, guide) (cached by xgrammar's compiler, bounded in bytes: least recently used evicted); each request gets
its own GrammarMatcher. Every step the matcher's token bitmask masks the logits row before sampling, and the
chosen token advances the matcher, so every finished output is in the grammar's language. xgrammar is imported
lazily: engines that never see a guide don't need it.

Compiling is slow for large schemas (a 57 KB JSON schema of 2,000 properties took 12 s here) and cannot be
interrupted, so it never runs where other requests wait: ``compile_async`` compiles on this backend's own thread
(xgrammar releases the GIL while it works) and returns a Future; the runner keeps such a request aside until its
grammar is ready (engine/runner.py). Guides longer than the engine's ``guide_max_bytes`` are refused at once.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from .request import InvalidRequest

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")


class GrammarBackend:
    def __init__(self, tokenizer_dir: str, vocab_size: int, cache_bytes: int = -1, max_guide_bytes: int = 0) -> None:
        try:
            import xgrammar as xgr
        except ImportError as e:  # pragma: no cover - xgrammar is a listed dependency
            raise InvalidRequest("guided decoding needs the xgrammar package") from e
        from ..model_files import load_hf_tokenizer

        self._xgr = xgr
        tok = load_hf_tokenizer(tokenizer_dir)  # a folder or a GGUF file
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_limit_bytes=cache_bytes)
        self.max_guide_bytes = max_guide_bytes
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")

    def check(self, guide_type: str, guide: str) -> None:
        """What is wrong with a guide before compiling it (InvalidRequest naming the input)."""
        if guide_type not in GUIDE_TYPES:
            raise InvalidRequest(f"guided_decoding_guide_type {guide_type!r} not in {list(GUIDE_TYPES)}")
        if guide_type != "json" and not guide:
            raise InvalidRequest(f"guided_decoding_guide is required for guide type {guide_type!r}")
        size = len(guide.encode("utf-8"))
        if self.max_guide_bytes and size > self.max_guide_bytes:
            raise InvalidRequest(f"guided_decoding_guide is {size} bytes: more than the {self.max_guide_bytes} this "
                                 "server compiles (guided_decoding_max_guide_bytes)")

    def compile_async(self, guide_type: str, guide: str) -> Future:
        """A Future of the compiled grammar (its exception: InvalidRequest when the guide does not compile);
        checked first, in the caller's thread."""
        self.check(guide_type, guide)
        return self._worker.submit(self._compile, guide_type, guide)

    def compile(self, guide_type: str, guide: str):
        return self.compile_async(guide_type, guide).result()

    def shutdown(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _compile(self, guide_type: str, guide: str):
        """On the worker thread: one compile at a time."""
        try:
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
