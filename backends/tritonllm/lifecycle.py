"""One client request over the engine, whatever the front: its n sequences as engine requests, and the state every
front tracks until the last of them ends. Used by Triton's tensorrt_llm adapter (``llm_jobs``, one group per batch
row) and the Dynamo worker (``dynamo.engine``), so ``n`` means the same on both. No Triton or Dynamo imports.

- ``sequence_params``: sequence i of a prompt samples with seed + i (TensorRT-LLM's child requests,
  ``llmRequest.cpp`` createChildRequest); an unseeded request draws a random base (TensorRT-LLM's base is 0, which
  would repeat the same samples for every unseeded request, unlike OpenAI's n). The 2nd..nth wait for the first to
  compute the prompt (``prefill_after``), so with prefix caching its KV blocks are shared.
- ``Sequences``: the engine ids and params of one request's sequences; ``index`` maps an engine output back to its
  sequence; ``end`` marks one finished and is true exactly once, for the last; ``unfinished`` lists what to abort
  when the client leaves. Not thread-safe: each front calls it under its own lock or on its own loop.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .engine.request import SamplingParams


def sequence_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """The engine params of each of ``n`` sequences of one prompt (see the module docstring)."""
    if n == 1:
        return [params]
    base = params.seed if params.seed is not None else random.getrandbits(62)
    return [dataclasses.replace(params, seed=(base + i) % 2**64) for i in range(n)]


@dataclass
class Sequences:
    ids: list[str]
    params: list[SamplingParams]
    _open: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, params: SamplingParams, n: int, new_id: Callable[[], str]) -> "Sequences":
        """``n`` sequences with engine ids from ``new_id()``; the first computes the prompt for the others."""
        ids, all_params = [], sequence_params(params, n)
        for p in all_params:
            ids.append(new_id())
            if len(ids) > 1:
                p.prefill_after = ids[0]
        return cls(ids, all_params, set(ids))

    def submissions(self, prompt: list[int]) -> list[tuple[str, list[int], SamplingParams]]:
        """What ``EngineRunner.submit_all`` takes: every sequence, admitted together or not at all."""
        return [(rid, prompt, p) for rid, p in zip(self.ids, self.params)]

    def index(self, engine_id: str) -> int:
        return self.ids.index(engine_id)

    def end(self, engine_id: str) -> bool:
        """Marks a sequence finished; true when it was the last one open."""
        was_open = engine_id in self._open
        self._open.discard(engine_id)
        return was_open and not self._open

    @property
    def done(self) -> bool:
        return not self._open

    def unfinished(self) -> Iterator[str]:
        return iter(sorted(self._open, key=self.ids.index))
