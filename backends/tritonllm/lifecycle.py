"""One client request, whatever the front: its n sequences as engine requests, and the state every front keeps
until its final answer. Used by Triton's tensorrt_llm adapter (``llm_jobs``), the BLS (``backends/llm_bls``) and
the Dynamo worker (``dynamo.engine``), so ``n``, cancellation, stop-by-id and "final exactly once" mean the same on
every path. No Triton or Dynamo imports.

- ``sequence_params``: sequence i of a prompt samples with seed + i (TensorRT-LLM's child requests,
  ``llmRequest.cpp`` createChildRequest); an unseeded request draws a random base (TensorRT-LLM's base is 0, which
  would repeat the same samples for every unseeded request, unlike OpenAI's n). The 2nd..nth wait for the first to
  compute the prompt (``prefill_after``), so with prefix caching its KV blocks are shared.
- ``Sequences``: the engine ids and params of one request's sequences; ``index`` maps an engine output back to its
  sequence; ``end`` marks one finished and is true exactly once, for the last; ``unfinished`` lists what to abort
  when the client leaves. Not thread-safe: each front calls it under its own lock or on its own loop.
- ``ClientRequest`` / ``Live``: a request until its final answer (whom to answer, opaque here; the id a client may
  stop it by, NVIDIA's ``stop`` requests; how many sequences are open; whether the client cancelled; whether the
  final answer went out) and the registry of those not yet answered, under one lock. ``close`` is true exactly once
  and takes the request out of the registry first, so nothing asks a response sender that has sent its final
  answer whether it was cancelled (Triton 2.51 frees it: SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled).
  Triton's Python backend gives no cancellation event, only ``is_cancelled()``: the Triton fronts scan ``Live``
  from their watcher; Dynamo's ``abort`` and the OpenAI server's disconnect are events and reach ``with_id``.
"""
from __future__ import annotations

import dataclasses
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

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


@dataclass(eq=False)
class ClientRequest:
    sender: Any = None
    client_id: str = ""
    pending: int = 0          # sequences (or rows) whose last answer has not gone out
    cancelled: bool = False
    answered: bool = False    # the final answer went out: nothing more may be sent


class Live:
    """The client requests of one front not answered yet. Every method takes ``lock``; a front that must send under
    the same lock (the BLS: several threads answer one request) uses the ``*_locked`` forms inside ``with lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._live: dict[int, ClientRequest] = {}  # by id(): insertion order = arrival order

    def add(self, req: ClientRequest) -> None:
        with self.lock:
            self._live[id(req)] = req

    def close(self, req: ClientRequest) -> bool:
        with self.lock:
            return self.close_locked(req)

    def close_locked(self, req: ClientRequest) -> bool:
        """True exactly once: the caller sends the final answer now. The request leaves the registry first."""
        if req.answered:
            return False
        req.answered = True
        self._live.pop(id(req), None)
        return True

    def end_locked(self, req: ClientRequest, n: int = 1) -> bool:
        """``n`` of its sequences ended; true when none is left open."""
        req.pending -= n
        return req.pending <= 0

    def cancelled(self, is_cancelled: Callable[[Any], bool]) -> list[ClientRequest]:
        """Marks and returns the live requests whose client left (``is_cancelled(sender)``), each once."""
        with self.lock:
            hit = [r for r in self._live.values() if not r.cancelled and is_cancelled(r.sender)]
            for r in hit:
                r.cancelled = True
            return hit

    def with_id(self, client_id: str, cancel: bool = False) -> list[ClientRequest]:
        """The live requests a stop request (or Dynamo's abort) names; ``cancel`` marks them cancelled."""
        if not client_id:
            return []
        with self.lock:
            hit = [r for r in self._live.values() if r.client_id == client_id]
            if cancel:
                for r in hit:
                    r.cancelled = True
            return hit

    def __len__(self) -> int:
        with self.lock:
            return len(self._live)
