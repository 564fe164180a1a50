"""Reasoning parsers: ``<think>``...``</think>`` -> ``reasoning_content`` and ``content``, whole or streamed.

By vLLM's names:
- ``deepseek_r1``: the answer may begin inside the reasoning (R1's template opens ``<think>`` in the
  prompt): an opening ``<think>`` in the output is dropped, everything before ``</think>`` is reasoning,
  and an answer that never closes it is all reasoning;
- ``qwen3``: reasoning only when the answer opens with ``<think>``; otherwise all of it is content.
Like the tool-call parsers, splitting is monotone over growing text (a partial tag is held back until the
next text decides), so a stream is the difference between consecutive splits. Newlines between
``</think>`` and the answer are not content.
"""
from __future__ import annotations

START, END = "<think>", "</think>"
PARSERS = ("deepseek_r1", "qwen3")


def held(text: str, marker: str, final: bool) -> str:
    """``text`` less a tail that could be the start of ``marker`` (unless the text is final): what a
    monotone parser may emit now."""
    if final:
        return text
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return text[:-k]
    return text


def split(parser: str, text: str, final: bool) -> tuple[str, str]:
    """(reasoning, content) of ``text`` so far."""
    if text.startswith(START):
        i = len(START)
    elif not final and START.startswith(text):
        return "", ""  # the opening tag may be on its way
    elif parser == "qwen3":
        return "", text
    else:
        i = 0
    k = text.find(END, i)
    if k < 0:
        return held(text[i:], END, final), ""
    return text[i:k], text[k + len(END):].lstrip("\n")


class ReasoningStream:
    """Text deltas in, (reasoning delta, content delta) out."""

    def __init__(self, parser: str):
        self.parser, self.text = parser, ""
        self._sent = [0, 0]

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        self.text += delta
        parts = split(self.parser, self.text, final)
        out = tuple(p[s:] for p, s in zip(parts, self._sent))
        self._sent = [len(p) for p in parts]
        return out
