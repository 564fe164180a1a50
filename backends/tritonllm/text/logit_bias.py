"""OpenAI's ``logit_bias`` by token id, as the BLS takes it: ``logit_bias_ids`` (INT32 [-1]) +
``logit_bias_weights`` (FP32 [-1]) -> the dense ``embedding_bias`` (FP32 [1, V]) tensorrt_llm adds to the
logits. NVIDIA's preprocessing only has a bias by words (EMBEDDING_BIAS_WORDS / _WEIGHTS -> EMBEDDING_BIAS);
the two add up. No Triton imports.

Invariants:
- the two inputs come together, with one weight per id; ids are integers in ``[0, vocab_size)`` where
  ``vocab_size`` is the tokenizer's ``len()`` (the size preprocessing gives EMBEDDING_BIAS); weights and
  their sums are finite; a repeated id adds its weights up (as repeated bias words do in preprocessing);
- every rejection is ``InvalidInput`` whose message starts with the client's input name;
- ``merge`` never changes preprocessing's bias in place, and with no logit_bias returns it unchanged (a
  ``[1, 0]`` EMBEDDING_BIAS means "no bias", which tensorrt_llm reads as none).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .preprocess import InvalidInput

IDS, WEIGHTS = "logit_bias_ids", "logit_bias_weights"


def parse_logit_bias(arrays: Mapping[str, np.ndarray], vocab_size: int) -> np.ndarray | None:
    """The client's logit bias as a dense float32 ``[vocab_size]`` array, or None when not given (or empty)."""
    ids, weights = arrays.get(IDS), arrays.get(WEIGHTS)
    if ids is None and weights is None:
        return None
    if ids is None or weights is None:
        raise InvalidInput(f"{IDS} and {WEIGHTS} must be given together")
    ids, weights = np.asarray(ids).reshape(-1), np.asarray(weights).reshape(-1)
    if ids.size != weights.size:
        raise InvalidInput(f"{IDS} and {WEIGHTS} must have the same length, got {ids.size} and {weights.size}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise InvalidInput(f"{IDS} must be integers, got {ids.dtype}")
    if weights.size and not np.issubdtype(weights.dtype, np.number):
        raise InvalidInput(f"{WEIGHTS} must be numbers, got {weights.dtype}")
    ids = ids.astype(np.int64)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise InvalidInput(f"{IDS} must be token ids in [0, {vocab_size}), got {int(bad[0])}")
    weights = weights.astype(np.float32)
    if not np.isfinite(weights).all():
        raise InvalidInput(f"{WEIGHTS} must be finite, got {weights[~np.isfinite(weights)][0]}")
    if not ids.size:
        return None
    dense = np.zeros(vocab_size, np.float32)
    with np.errstate(over="ignore"):
        np.add.at(dense, ids, weights)  # unbuffered: a repeated id adds every weight
    # float32 sums of finite weights can still overflow (two weights of 3e38 on one id)
    if not np.isfinite(dense).all():
        raise InvalidInput(f"{WEIGHTS} of one id must add up to a finite float32")
    return dense


def merge(pre_bias: np.ndarray | None, bias: np.ndarray | None) -> np.ndarray | None:
    """Preprocessing's EMBEDDING_BIAS (``[1, V]``, or ``[1, 0]`` without bias words) plus the dense ``bias``
    of ``parse_logit_bias``, as ``[1, max(V, len(bias))]`` float32 (the shorter one zero-padded, as
    tensorrt_llm pads a bias shorter than its vocabulary); ``pre_bias`` itself when there is no logit bias."""
    if bias is None:
        return pre_bias
    pre = np.zeros(0, np.float32) if pre_bias is None else np.asarray(pre_bias, np.float32).reshape(-1)
    out = np.zeros(max(pre.size, bias.size), np.float32)
    out[:pre.size] = pre
    with np.errstate(over="ignore"):
        out[:bias.size] += bias
    if not np.isfinite(out).all():  # a bias word's weight plus a logit_bias weight on the same id
        raise InvalidInput(f"{WEIGHTS} plus embedding_bias_weights must add up to a finite float32")
    return out.reshape(1, -1)
