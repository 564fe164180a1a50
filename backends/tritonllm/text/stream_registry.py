"""Per-sequence detokenizer state for a stage that sees each streamed chunk as a separate request.

In a Triton ensemble, ``postprocessing`` receives every streamed chunk of new tokens as an
independent request: the only thing tying chunks together is a key (the client's request id, which
Triton forwards to composing models, or an engine-issued key). This registry keeps one
``IncrementalDetokenizer`` per key.

Invariants:
- bounded: at most ``max_entries`` states live; the least recently used one is dropped first, and a
  state idle for more than ``ttl_s`` seconds is dropped on the next call (``evicted`` counts both).
  A stream whose end was never signalled therefore cannot leak.
- ``final=True`` flushes and forgets the state; ``first=True`` discards any stale state under the
  key before decoding (a reused key then starts clean).
- key None or "" means "no way to tell sequences apart": the chunk is decoded on its own and fully
  flushed (exact for whole, non-streamed outputs; for streams this is NVIDIA's per-chunk decode).
Not thread-safe: Triton's Python backend calls ``execute`` of one instance serially.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from .detokenizer import IncrementalDetokenizer


class DetokenizerRegistry:
    """Keyed, bounded LRU of incremental detokenizers (see module docstring)."""

    def __init__(self, factory: Callable[[], IncrementalDetokenizer], *, max_entries: int = 1024,
                 ttl_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self._factory = factory
        self._max = max_entries
        self._ttl = ttl_s
        self._clock = clock
        self._states: OrderedDict[Hashable, tuple[IncrementalDetokenizer, float]] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._states

    def process(self, key: Hashable | None, ids: Sequence[int], *, first: bool = False, final: bool = False,
                factory: Callable[[], IncrementalDetokenizer] | None = None) -> str:
        """Text delta for ``ids`` appended to the sequence ``key``; ``factory`` overrides the
        registry's for a sequence that starts here."""
        factory = factory or self._factory
        if key is None or key == "":
            return factory().finish(ids)
        now = self._clock()
        self._expire(now)
        if first:
            self._states.pop(key, None)
        entry = self._states.pop(key, None)
        detok = entry[0] if entry else factory()
        if final:
            return detok.finish(ids)
        out = detok.add(ids)
        self._states[key] = (detok, now)
        while len(self._states) > self._max:
            self._states.popitem(last=False)
            self.evicted += 1
        return out

    def discard(self, key: Hashable) -> None:
        self._states.pop(key, None)

    def _expire(self, now: float) -> None:
        # Entries are in last-use order, so the stale ones are at the front.
        while self._states:
            key, (_, seen) = next(iter(self._states.items()))
            if now - seen <= self._ttl:
                break
            del self._states[key]
            self.evicted += 1
