"""The sequences of one BLS row (``num_return_sequences``): one tensorrt_llm response stream in, one text
per sequence out. No Triton imports.

tensorrt_llm answers a request of n > 1 sequences on one stream (one inner request id) whose responses
each carry ``sequence_index`` ([1, 1] INT32; absent when n == 1, read as 0); only the stream's end marks
the end of the request. ``Sequences`` routes each response to that sequence's own generation object
(``TextGeneration``: its own detokenizer, stop strings and pass-through arrays), so every sequence
streams exactly as a request of n == 1 does.

Invariants:
- every sequence yields exactly one final chunk: when it completes a stop string (``on_response``), or
  when the engine's stream ends (``finish_all``, in index order); once final, its responses are ignored;
- ``done`` once every sequence has yielded its final chunk; before the stream ends that means every
  sequence completed a stop string, and only then may the shared engine request be stopped;
- a sequence's end without a stop string is seen only at the stream's end: the engine's per-sequence
  ``is_final`` is ours, not NVIDIA's, and the BLS also runs in front of NVIDIA's backend, which does not
  declare it (asking for an undeclared output fails the request);
- with n > 1 every chunk carries its ``sequence_index`` (``make`` is given the index; None when n == 1).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


class Sequences:
    """n generation objects (``make(index)``, index None when n == 1) fed from one response stream.
    Not thread-safe."""

    def __init__(self, n: int, make: Callable[[int | None], Any]) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self._gens = [make(i if n > 1 else None) for i in range(n)]
        self._final = [False] * n

    @property
    def done(self) -> bool:
        return all(self._final)

    def on_response(self, arrays: Mapping[str, np.ndarray]) -> list[tuple[Any, bool]]:
        """(chunk, final) pairs to send now, in order: a delta (streaming), then the sequence's final
        chunk when this response completed a stop string. Empty when there is nothing to send."""
        raw = arrays.get("sequence_index")
        index = int(np.asarray(raw).reshape(-1)[0]) if raw is not None else 0
        if not 0 <= index < len(self._gens):  # an engine bug, not the client's: reported as INTERNAL
            raise RuntimeError(f"tensorrt_llm sent sequence_index {index} for {len(self._gens)} sequences")
        if self._final[index]:
            return []
        gen = self._gens[index]
        out = []
        chunk = gen.on_response(arrays)
        if chunk is not None:
            out.append((chunk, False))
        if gen.stopped:
            self._final[index] = True
            out.append((gen.finish(), True))
        return out

    def finish_all(self) -> list[Any]:
        """The final chunk of every sequence not final yet (the engine's stream ended)."""
        out = []
        for i, gen in enumerate(self._gens):
            if not self._final[i]:
                self._final[i] = True
                out.append(gen.finish())
        return out
