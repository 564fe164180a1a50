"""The response side of the BLS as plain numpy: tensorrt_llm responses of one sequence -> exact text chunks
with stop strings cut and the pass-through outputs (see ``bls_stream``'s module docstring for the
invariants: streamed chunks join to the non-streamed text; every token's log probs are carried once).
No Triton imports."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .bls_stream import LOGPROB_IDS, PASS_THROUGH, SUMMED, TOP_OUTPUTS, BlsRequest
from .detokenizer import IncrementalDetokenizer, TokenizerTraits, tokenizer_traits
from .stop_strings import StopStringMatcher

_TOP_PAD = {"top_log_probs": -np.inf, "top_log_prob_ids": -1}  # a missing alternative (llm_io.top_arrays)


@dataclass
class Chunk:
    """One client response: ``text`` (a delta when streaming) and pass-through arrays."""

    text: str
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    batch_index: int | None = None
    sequence_index: int | None = None  # set when the row has several sequences

    @property
    def empty(self) -> bool:
        """No text and no pass-through: a streamed final chunk like this can be a flag-only response."""
        return not self.text and not self.outputs

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"text_output": np.array([self.text.encode("utf-8")], dtype=object), **self.outputs}
        if self.batch_index is not None:
            out["batch_index"] = np.array([[self.batch_index]], dtype=np.int32)
        if self.sequence_index is not None:
            out["sequence_index"] = np.array([[self.sequence_index]], dtype=np.int32)
        return out


class _PassThrough:
    """Pass-through arrays of the responses not yet sent: per-token ones (output_log_probs with the ids of the
    tokens they score, top log probs) concatenated along their token axis, the rest latest (num_output_tokens
    summed)."""

    def __init__(self) -> None:
        self._latest: dict[str, np.ndarray] = {}
        self._logprobs: list[np.ndarray] = []
        self._ids: list[np.ndarray] = []
        self._top: dict[str, list[np.ndarray]] = {name: [] for name in TOP_OUTPUTS}

    def add(self, arrays: Mapping[str, np.ndarray], ids: np.ndarray) -> None:
        """``ids``: the response's new token ids (what its log probs score, one each)."""
        for name in TOP_OUTPUTS:  # [1, tokens, k] per response
            if arrays.get(name) is not None:
                a = np.asarray(arrays[name])
                self._top[name].append(a.reshape(1, -1, a.shape[-1]))
        for name in PASS_THROUGH:
            if arrays.get(name) is None:
                continue
            if name == "output_log_probs":
                self._logprobs.append(np.asarray(arrays[name], dtype=np.float32).reshape(1, 1, -1))
                self._ids.append(np.asarray(ids, dtype=np.int32).reshape(1, 1, -1))
            elif name in SUMMED and name in self._latest:
                self._latest[name] = self._latest[name] + np.asarray(arrays[name])
            else:
                self._latest[name] = np.asarray(arrays[name])

    def count_prompt(self, n: int) -> None:
        """A non-streamed response that includes the prompt counts its tokens too (NVIDIA's semantics)."""
        if "num_output_tokens" in self._latest:
            self._latest["num_output_tokens"] = self._latest["num_output_tokens"] + n

    def take(self) -> dict[str, np.ndarray]:
        """What arrived since the last take (empty if nothing did)."""
        out = self._latest
        if self._logprobs:
            out["output_log_probs"] = np.concatenate(self._logprobs, axis=-1)
            out[LOGPROB_IDS] = np.concatenate(self._ids, axis=-1)
        for name, parts in self._top.items():
            if parts:
                out[name] = np.concatenate(parts, axis=1)
        self._latest, self._logprobs, self._ids = {}, [], []
        self._top = {name: [] for name in TOP_OUTPUTS}
        return out


class TextGeneration:
    """Per-request state: tensorrt_llm responses in, client chunks out (see module docstring).

    Call ``on_response`` for each tensorrt_llm response carrying tensors; a returned Chunk is to be
    sent now (streaming only, never an empty delta). Once ``stopped`` (a stop string completed), the
    engine request should be stopped and ``finish()`` sent at once as the final chunk; later responses
    are ignored. When the engine's stream ends, ``finish()`` is the final chunk too. Not thread-safe.
    """

    def __init__(self, tokenizer: Any, req: BlsRequest, prompt: list[int] | None = None, *,
                 skip_special_tokens: bool = True, traits: TokenizerTraits | None = None,
                 include_stop_words: bool = False, sequence_index: int | None = None) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens,
                                             traits=traits or tokenizer_traits(tokenizer))
        self._stops = StopStringMatcher(req.stop_strings, include_stop=include_stop_words)
        self._stream = req.stream
        self._pass = _PassThrough()
        self._batch_index = req.batch_index
        self._sequence_index = sequence_index
        self._text: list[str] = []  # non-streamed: everything so far
        self._reason = ""  # the engine's finish_reason, when its last response says
        self._prompt_len = 0
        if prompt and not req.exclude_input and not req.stream:
            self._text.append(self._detok.add(prompt))
            self._prompt_len = len(prompt)
        self.num_tokens = 0
        self.finished = False

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    @property
    def matched(self) -> str | None:
        return self._stops.matched

    def on_response(self, arrays: Mapping[str, np.ndarray]) -> Chunk | None:
        if self.stopped or self.finished:
            return None
        ids = np.asarray(arrays["output_ids"]).reshape(-1)
        if arrays.get("sequence_length") is not None:  # [batch 1, beam 1]: the valid prefix
            ids = ids[: int(np.asarray(arrays["sequence_length"]).reshape(-1)[0])]
        self.num_tokens += len(ids)
        self._pass.add(arrays, ids)
        if arrays.get("finish_reason") is not None:
            reason = np.asarray(arrays["finish_reason"]).reshape(-1)[0]
            self._reason = (reason.decode() if isinstance(reason, bytes) else str(reason)) or self._reason
        text, stopped = self._stops.feed(self._detok.add(ids.tolist()))
        if self._stream and not stopped:
            return self._chunk(text) if text else None
        self._text.append(text)  # non-streamed, or the last text before a stop string: sent by finish()
        return None

    def finish(self) -> Chunk:
        """The final chunk: flushes held-back text (unless stopped). Call once. It carries ``finish_reason``:
        "stop" when a stop string ended the text here, else the engine's (none when the engine sent none)."""
        self.finished = True
        if not self.stopped:
            tail = self._detok.finish()
            text, _ = self._stops.feed(tail)
            text += self._stops.flush()
        else:
            text = ""
        self._text.append(text)
        if self._prompt_len:
            self._pass.count_prompt(self._prompt_len)
        chunk = self._chunk("".join(self._text))
        reason = "stop" if self.stopped else self._reason
        if reason:
            chunk.outputs["finish_reason"] = np.array([[reason.encode()]], dtype=object)
        return chunk

    def _chunk(self, text: str) -> Chunk:
        return Chunk(text, self._pass.take(), self._batch_index, self._sequence_index)


def stackable(rows: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Unary rows' final arrays made stackable by ``llm_io.stack_rows`` (which pads the last axis only):
    the top log probs ``[1, tokens, k]`` of rows with different token counts (or k) padded to the longest,
    with id -1 and log prob -inf, as tensorrt_llm pads alternatives a small vocabulary lacks."""
    for name in TOP_OUTPUTS:
        parts = [r[name] for r in rows if name in r]
        if len(parts) < 2:
            continue
        tokens, k = max(p.shape[1] for p in parts), max(p.shape[2] for p in parts)
        rows = [{**r, name: np.pad(r[name], [(0, 0), (0, tokens - r[name].shape[1]), (0, k - r[name].shape[2])],
                                   constant_values=_TOP_PAD[name])} if name in r else r for r in rows]
    return rows
