"""The `postprocessing` step as plain numpy: token ids in, exact text deltas out.

Inputs (batch dim first): TOKENS_BATCH (INT32 [B, beams, T]; [B, T] is read as one beam),
SEQUENCE_LENGTH (INT32 [B, beams], optional: T); optional pass-through CUM_LOG_PROBS,
OUTPUT_LOG_PROBS, CONTEXT_LOGITS, GENERATION_LOGITS, BATCH_INDEX (-> OUT_*, as NVIDIA's model).
Two optional inputs that are not NVIDIA's let the engine make streaming exact beyond doubt:
REQUEST_KEY (UINT64 [B, 1]): a key unique to the engine request (client request ids may be empty or
reused), and IS_FINAL (BOOL [B, 1]): this chunk is the sequence's last (flush and forget the state).
Output: OUTPUT (BYTES [B * beams], flat, batch-major), UTF-8, as NVIDIA's postprocessing returns it
(their clients read ``text_output[0]`` as bytes).

Why state, and how it is keyed (facts measured on tritonserver 2.51, see the text package report):
- in an ensemble, each streamed response of the decoupled ``tensorrt_llm`` step reaches this step as
  a separate request carrying only the new tokens;
- a composing model sees the client's request id (``request.request_id()``) and parameters;
- an ensemble step may not mix inputs from a decoupled step with any other source (Triton refuses the
  config: "receives inputs originated from different decoupled models"), so nothing from
  ``preprocessing`` or the client can reach this step except through ``tensorrt_llm``'s outputs;
- a flag-only final response from the engine does not invoke this step at all.
So the key is REQUEST_KEY when wired; else the request id, but only with ``key_by_request_id`` (the GPU
profile, whose engine emits no REQUEST_KEY), because a client calling postprocessing directly with whole
sequences under a reused id (NVIDIA's end_to_end_test.py sends ids "0", "1", ... every run) must not
continue an earlier sequence's state; otherwise each call is decoded on its own, as NVIDIA does. Without IS_FINAL a stream's state lives until LRU/idle eviction
(bounded), an incomplete character at the very end (U+FFFD) is not shown, and byte-fallback runs are
emitted as soon as they are valid UTF-8 (``hold_byte_runs=False``) so that no complete text is kept
back for an end that is never signalled. Beam search (beams > 1) responses carry whole beams and are
decoded statelessly.

Invariants: with a key and IS_FINAL wired, the concatenated OUTPUTs of one streamed sequence equal
``tokenizer.decode(all ids, skip_special_tokens)``; a whole (non-streamed) sequence sent with
IS_FINAL or without any key decodes exactly too. Rejections are ``InvalidInput`` naming the input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .detokenizer import detokenizer_factory
from .preprocess import InvalidInput
from .stream_registry import DetokenizerRegistry

PASS_THROUGH = (("CUM_LOG_PROBS", "OUT_CUM_LOG_PROBS"), ("OUTPUT_LOG_PROBS", "OUT_OUTPUT_LOG_PROBS"),
                ("CONTEXT_LOGITS", "OUT_CONTEXT_LOGITS"), ("GENERATION_LOGITS", "OUT_GENERATION_LOGITS"),
                ("BATCH_INDEX", "OUT_BATCH_INDEX"))


def _per_request(arr: np.ndarray | None, name: str, batch: int) -> np.ndarray | None:
    if arr is None:
        return None
    arr = np.asarray(arr)
    if arr.size != batch:
        raise InvalidInput(f"{name} must hold one value per request ({batch}), got shape {list(arr.shape)}")
    return arr.reshape(batch)


class Postprocessor:
    """Keeps per-sequence detokenizers across requests (one per model instance; not thread-safe)."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True, max_streams: int = 1024,
                 stream_ttl_s: float = 60.0, key_by_request_id: bool = False) -> None:
        self.key_by_request_id = key_by_request_id
        self.vocab_size = len(tokenizer)
        factory = detokenizer_factory(tokenizer, skip_special_tokens=skip_special_tokens)
        self._without_end = lambda: factory(hold_byte_runs=False)
        self.registry = DetokenizerRegistry(factory, max_entries=max_streams, ttl_s=stream_ttl_s)

    def run(self, inputs: Mapping[str, np.ndarray | None], request_id: str = "") -> dict[str, np.ndarray]:
        tokens = inputs.get("TOKENS_BATCH")
        if tokens is None:
            raise InvalidInput("TOKENS_BATCH is required")
        tokens = np.asarray(tokens)
        if tokens.ndim == 2:
            tokens = tokens[:, None, :]
        if tokens.ndim != 3 or not np.issubdtype(tokens.dtype, np.integer):
            raise InvalidInput(f"TOKENS_BATCH must be integer [batch, beams, tokens], got {tokens.dtype} {list(tokens.shape)}")
        batch, beams, width = tokens.shape
        lengths = inputs.get("SEQUENCE_LENGTH")
        if lengths is None:
            lengths = np.full((batch, beams), width)
        lengths = np.asarray(lengths)
        if lengths.size != batch * beams:
            raise InvalidInput(f"SEQUENCE_LENGTH must be [batch, beams] = {[batch, beams]}, got {list(lengths.shape)}")
        lengths = lengths.reshape(batch, beams)
        if (lengths < 0).any() or (lengths > width).any():
            raise InvalidInput(f"SEQUENCE_LENGTH must be within [0, {width}], got {lengths.tolist()}")
        valid = np.arange(width)[None, None, :] < lengths[:, :, None]
        bad = valid & ((tokens < 0) | (tokens >= self.vocab_size))
        if bad.any():
            raise InvalidInput(f"TOKENS_BATCH holds ids outside the vocabulary [0, {self.vocab_size}): "
                               f"{sorted(set(tokens[bad].tolist()))[:5]}")
        keys = _per_request(inputs.get("REQUEST_KEY"), "REQUEST_KEY", batch)
        finals = _per_request(inputs.get("IS_FINAL"), "IS_FINAL", batch)

        texts = np.empty((batch, beams), dtype=object)
        for b in range(batch):
            if beams > 1:
                key = None
            elif keys is not None:
                key = ("key", int(keys[b]))
            elif request_id and self.key_by_request_id:
                key = ("id", request_id, b)
            else:
                key = None
            final = bool(finals[b]) if finals is not None else False
            for k in range(beams):
                ids = tokens[b, k, : int(lengths[b, k])].tolist()
                texts[b, k] = self.registry.process(
                    key, ids, final=final, factory=None if finals is not None else self._without_end).encode("utf-8")
        out = {"OUTPUT": texts.reshape(-1)}
        for src, dst in PASS_THROUGH:
            if inputs.get(src) is not None:
                out[dst] = np.asarray(inputs[src])
        return out
