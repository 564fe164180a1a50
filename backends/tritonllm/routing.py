"""Cascade routing for model ``llm_router``: a cheap classifier's verdict -> refuse, small or large LLM slot;
and its ``moderate`` mode (model ``moderated_llm``): always answer with ``answer_model``, classifier alongside.

The adapter (backends/llm_router/model.py) runs ``prompt_guard`` on the prompt, asks ``decide`` where the
request goes, then either answers with ``refusal_outputs`` (no LLM call at all) or forwards the client's
tensors unchanged to the chosen slot (a model with the ``tensorrt_llm_bls`` contract) and relays its
responses through a ``Relay``. Cost/latency rationale: docs/routing.md. No Triton imports.

Invariants:
- mode ``moderate``: ``decide`` always gives ``moderated`` -> ``answer_model`` (it never reads the verdict,
  so the adapter may start the LLM before the classifier answers).
- mode ``route``: ``decide`` is a pure function of (config, label, probabilities): ``unsafe`` ->
  ``refused`` (model None), ``simple`` -> ``small`` unless its probability is below ``min_confidence`` (then ``large``: when the
  cheap model is unsure, pay for the larger one), ``complex`` -> ``large``. Any other label is an error.
- Every response the router sends carries ``route`` plus the classifier's ``moderation_label`` /
  ``moderation_probabilities`` (``route_outputs``), so the client can always see why it got its answer.
- ``Relay``: stream=true forwards each inner response at once and ends with a flag-only final response;
  stream=false holds the (single) inner response back and sends it as the final one, so HTTP /generate
  on the decoupled router sees exactly one response. Either way the final flag is sent exactly once.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import contract as C

REFUSED, SMALL, LARGE, MODERATED = "refused", "small", "large", "moderated"
ROUTE, MODERATE = "route", "moderate"  # modes
DEFAULT_REFUSAL = "I can't help with that request."


class RoutingError(ValueError):
    """The classifier answered something the router cannot route (a deployment error, not the client's)."""


@dataclass(frozen=True)
class RouterConfig:
    guard_model: str = C.PROMPT_GUARD
    small_model: str = C.BLS
    large_model: str = C.BLS
    min_confidence: float = 0.0
    refusal_message: str = DEFAULT_REFUSAL
    mode: str = ROUTE
    answer_model: str = C.ENSEMBLE  # mode moderate only

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> "RouterConfig":
        """From Triton config parameters (string values; empty or missing -> default). ValueError if bad."""
        def get(key: str, default: str) -> str:
            value = (params.get(key) or "").strip()
            return value or default

        try:
            min_conf = float(get("min_confidence", "0"))
        except ValueError:
            raise ValueError("llm_router: min_confidence must be a number, "
                             f"got {params.get('min_confidence')!r}") from None
        if not (math.isfinite(min_conf) and 0.0 <= min_conf <= 1.0):
            raise ValueError(f"llm_router: min_confidence must be in [0, 1], got {min_conf}")
        mode = get("mode", ROUTE)
        if mode not in (ROUTE, MODERATE):
            raise ValueError(f"llm_router: mode must be {ROUTE!r} or {MODERATE!r}, got {mode!r}")
        return cls(guard_model=get("guard_model", C.PROMPT_GUARD), small_model=get("small_model", C.BLS),
                   large_model=get("large_model", C.BLS), min_confidence=min_conf,
                   refusal_message=params.get("refusal_message") or DEFAULT_REFUSAL,
                   mode=mode, answer_model=get("answer_model", C.ENSEMBLE))


@dataclass(frozen=True)
class Verdict:
    """prompt_guard's answer for one prompt: its label and the probability of every class."""
    label: str
    probabilities: np.ndarray  # float32 [len(PROMPT_GUARD_LABELS)], in contract.PROMPT_GUARD_LABELS order

    @property
    def confidence(self) -> float:
        return float(self.probabilities[C.PROMPT_GUARD_LABELS.index(self.label)])


@dataclass(frozen=True)
class Route:
    name: str            # REFUSED | SMALL | LARGE | MODERATED
    model: str | None    # the slot that answers; None when refused
    verdict: Verdict


def guard_inputs(text: str) -> dict[str, np.ndarray]:
    """prompt_guard's inputs for one prompt (batch 1)."""
    return {"text": np.array([[text.encode("utf-8")]], dtype=object)}


def parse_verdict(outputs: Mapping[str, np.ndarray]) -> Verdict:
    """prompt_guard's outputs (batch 1) -> Verdict; RoutingError if they are not what the contract says."""
    label_arr, probs = outputs.get("label"), outputs.get("probabilities")
    if label_arr is None or probs is None:
        raise RoutingError(f"prompt_guard returned {sorted(outputs)}, expected label and probabilities")
    raw = np.asarray(label_arr).reshape(-1)
    probs = np.asarray(probs, dtype=np.float32).reshape(-1)
    if raw.size != 1 or probs.size != len(C.PROMPT_GUARD_LABELS):
        raise RoutingError(f"prompt_guard returned label shape {list(np.shape(label_arr))} and probabilities "
                           f"shape {list(np.shape(outputs['probabilities']))} for one prompt")
    label = raw[0].decode("utf-8") if isinstance(raw[0], (bytes, np.bytes_)) else str(raw[0])
    if label not in C.PROMPT_GUARD_LABELS:
        raise RoutingError(f"prompt_guard label {label!r} is not one of {list(C.PROMPT_GUARD_LABELS)}")
    return Verdict(label, probs)


def decide(config: RouterConfig, verdict: Verdict) -> Route:
    """Where the request goes (see the module docstring)."""
    if config.mode == MODERATE:
        return Route(MODERATED, config.answer_model, verdict)
    if verdict.label == "unsafe":
        return Route(REFUSED, None, verdict)
    if verdict.label == "simple" and verdict.confidence >= config.min_confidence:
        return Route(SMALL, config.small_model, verdict)
    return Route(LARGE, config.large_model, verdict)


def route_outputs(route: Route) -> dict[str, np.ndarray]:
    """The extra outputs every router response carries (batch 1)."""
    label_name, probs_name = (C.MODERATION_OUTPUT_NAMES[t.name] for t in C.PROMPT_GUARD_OUTPUTS)
    return {C.ROUTE_OUTPUT.name: np.array([[route.name.encode()]], dtype=object),
            label_name: np.array([[route.verdict.label.encode()]], dtype=object),
            probs_name: route.verdict.probabilities.astype(np.float32).reshape(1, -1)}


def refusal_outputs(config: RouterConfig, route: Route) -> dict[str, np.ndarray]:
    """The whole answer to a refused request: the fixed message (one response, streamed or not)."""
    return {"text_output": np.array([config.refusal_message.encode("utf-8")], dtype=object),
            **route_outputs(route)}


class Relay:
    """Which inner responses to send when (see the module docstring). Not thread-safe.

    ``push(outputs)`` for every inner response carrying tensors returns the outputs to send now with
    flags 0 (or None); ``close()`` returns the outputs of the final response (None: flag-only final).
    """

    def __init__(self, stream: bool, extra: Mapping[str, np.ndarray]):
        self._stream = stream
        self._extra = dict(extra)
        self._held: dict[str, Any] | None = None
        self.closed = False

    def push(self, outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        if self.closed:
            raise RuntimeError("Relay.push after close")
        merged = {**outputs, **self._extra}
        if self._stream:
            return merged
        self._held = merged  # an inner non-streamed answer is one response; keep the latest
        return None

    def close(self) -> dict[str, np.ndarray] | None:
        if self.closed:
            raise RuntimeError("Relay.close twice")
        self.closed = True
        if self._stream:
            return None
        return self._held if self._held is not None else dict(self._extra)
