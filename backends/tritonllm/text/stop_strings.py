"""Find stop strings in streamed text, however the text was split into deltas.

Invariants, for any split of a text T into deltas fed in order, then ``flush()``:
- the concatenation of everything returned equals T cut just before the stop string occurrence
  that *completes* first (smallest end; on a tie, the one that starts first), or all of T when
  none occurs. "Completes first" is what a streaming reader can know, so the result does not
  depend on how T was split;
- the stop string itself and everything after it are never returned (with ``include_stop=True``, the
  stop string is returned too, as NVIDIA's BLS and vLLM's ``include_stop_str_in_output`` keep it, and
  only what follows it is dropped);
- text is returned as early as possible: only a tail of the pending text that is a proper prefix
  of some stop string is held back (it may turn out to start a stop string).
After a stop, ``feed`` returns ("", True) and ignores its input.
"""

from __future__ import annotations

from collections.abc import Iterable


class StopStringMatcher:
    """Incremental stop-string matcher; one instance per sequence, not thread-safe."""

    def __init__(self, stop_strings: Iterable[str], include_stop: bool = False) -> None:
        self._include = include_stop
        stops = []
        for i, s in enumerate(stop_strings):
            if not isinstance(s, str):
                raise ValueError(f"stop string {i} must be a string, got {type(s).__name__}")
            if not s:
                raise ValueError(f"stop string {i} is empty")
            if s not in stops:
                stops.append(s)
        self._stops = tuple(stops)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self._stops

    @property
    def held(self) -> str:
        """Text received but not yet returned (a possible start of a stop string)."""
        return self._held

    def feed(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to emit now, stopped)."""
        if self.stopped:
            return "", True
        text = self._held + delta
        if not self._stops:
            self._held = ""
            return text, False
        # No stop string is complete in what came before, and any occurrence reaching back into it
        # lies inside the held tail (the longest suffix that is a stop-string prefix), so text
        # holds every candidate. str.find gives each string's occurrence with the smallest end.
        first, end, which = -1, -1, None
        for s in self._stops:
            i = text.find(s)
            if i != -1 and (which is None or (i + len(s), i) < (end, first)):
                first, end, which = i, i + len(s), s
        if which is not None:
            self.stopped, self.matched, self._held = True, which, ""
            return text[:end if self._include else first], True
        keep = self._holdback(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """End of text: the held tail was not a stop string after all; return it."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
