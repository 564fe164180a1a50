"""The `tensorrt_llm_bls` pipeline as plain numpy: client tensors -> preprocessing / tensorrt_llm tensors,
and streamed token responses -> exact text chunks with stop strings cut. No Triton imports: the adapter
(backends/llm_bls/model.py) only moves tensors and makes the BLS calls.

Flow of one request (``BlsRequest`` -> ``preprocessing_inputs`` -> ``llm_inputs`` -> ``TextGeneration``):
- ``split_rows`` cuts a client batch into rows (every input must have text_input's batch size); each
  row is one ``BlsRequest`` and one engine request, as NVIDIA's BLS gets one tensorrt_llm response
  stream per row;
- ``parse_request`` validates a row, naming the client's input (text_input, max_tokens, stop_words,
  ...), so that a bad request fails before any model runs;
- the inner tensorrt_llm request excludes the prompt and, when the BLS is decoupled, always streams
  (``streaming=True``) whatever the client asked: text is produced here, incrementally, so a stop string
  can end generation early in non-streamed mode too. A unary BLS (``decoupled_mode: false``) makes one
  unary inner call per row;
- ``TextGeneration`` feeds every response's new ids to one ``IncrementalDetokenizer`` and the text to
  one ``StopStringMatcher``.

Invariants:
- streamed: the concatenated ``text`` of all chunks equals the non-streamed text of the same (greedy)
  request, which is ``tokenizer.decode(generated ids, skip_special_tokens)`` cut just before the first
  completed stop string (the stop string and all after it are never sent), or just after it with
  ``include_stop_words`` (NVIDIA's BLS keeps the stop word);
- pass-through outputs (present when the client asked for them, as tensorrt_llm gives them): each chunk
  carries ``output_log_probs`` of every token since the previous chunk (concatenated; so the chunks'
  log probs together cover every generated token once), ``num_output_tokens`` summed over the same
  responses (NVIDIA's per-response count; a non-streamed response with the prompt included counts it
  too, as NVIDIA's tensorrt_llm does), and the latest ``cum_log_probs`` / ``num_input_tokens`` / perf
  metrics received since the previous chunk;
- ``text_output`` is ``[1]`` (``[batch]`` for a unary batch), NVIDIA's flat layout;
- with ``exclude_input_in_output=false`` and no streaming, the text starts with the decoded prompt
  (``decode(prompt + generated)``, as NVIDIA's BLS); streamed chunks never repeat the prompt (NVIDIA's
  streaming sends new tokens only). Stop strings are searched in generated text only.
- Error messages from the inner models are rewritten to the client's input names (``client_message``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import contract as C
from ..error_names import to_client_names
from .detokenizer import IncrementalDetokenizer, TokenizerTraits, tokenizer_traits
from .preprocess import InvalidInput
from .stop_strings import StopStringMatcher
from .word_lists import parse_words

# tensorrt_llm outputs forwarded to the client (all declared by NVIDIA's tensorrt_llm and the BLS).
PASS_THROUGH = ("cum_log_probs", "output_log_probs", "num_input_tokens", "num_output_tokens",
                *(t.name for t in C.PERF_OUTPUTS))
SUMMED = ("num_output_tokens",)
LLM_OUTPUTS = ("output_ids", "sequence_length", *PASS_THROUGH)

_PRE_STEP, _LLM_STEP = C.NVIDIA_ENSEMBLE_STEPS[0], C.NVIDIA_ENSEMBLE_STEPS[1]
# preprocessing input <- client input, e.g. QUERY <- text_input (NVIDIA's ensemble wiring).
PREPROCESSING_MAP: dict[str, str] = dict(_PRE_STEP[1])
# tensorrt_llm input <- ("client", name) | ("preprocessing", output name).
_PRE_OUT = {internal: out for out, internal in _PRE_STEP[2].items()}
LLM_MAP: dict[str, tuple[str, str]] = {
    dst: ("preprocessing", _PRE_OUT[src]) if src in _PRE_OUT else ("client", src)
    for dst, src in _LLM_STEP[1].items()}
# Inputs set here whatever the client says (see module docstring).
_LLM_FORCED = {"exclude_input_in_output": np.array([[True]])}


# Triton 2.51's BLS hands a composing model's error to the caller with code INTERNAL whatever the model
# said (seen: preprocessing's INVALID_ARG arrives INTERNAL through exec(); through an ensemble it stays
# INVALID_ARG). Our models' messages tell the codes apart, so the BLS and the routers recover them.
_CODE_BY_MESSAGE = (
    (re.compile(r"request cancelled"), "CANCELLED"),
    (re.compile(r"Maximum queue size|shutting down|not ready|unavailable", re.I), "UNAVAILABLE"),
    (re.compile(r"internal error|(pre|post)processing failed|engine step failed|[Ss]tub", re.I), "INTERNAL"),
)


def recovered_code(message: str) -> str:
    """The code name (INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL) of an inner error that arrived as
    INTERNAL (see _CODE_BY_MESSAGE): our backends' refusals of bad input carry no marker, so anything
    not marked otherwise is INVALID_ARG."""
    for pattern, code in _CODE_BY_MESSAGE:
        if pattern.search(message):
            return code
    return "INVALID_ARG"


def client_message(message: str) -> str:
    """An inner model's error message in the client's input names (QUERY -> text_input,
    request_output_len -> max_tokens, stop_words_list -> stop_words, ...): see error_names.to_client_names."""
    return to_client_names(message)


@dataclass
class BlsRequest:
    """One validated client request. ``arrays`` are the client's tensors (batch dim 1 included)."""

    arrays: dict[str, np.ndarray]
    text: str
    max_tokens: int
    stream: bool
    stop_strings: list[str]
    exclude_input: bool
    batch_index: int | None = None  # set when the client's batch has several rows


def scalar(arrays: Mapping[str, np.ndarray], name: str, default: Any = None) -> Any:
    a = arrays.get(name)
    if a is None:
        return default
    if a.size != 1:
        raise InvalidInput(f"{name} must hold exactly one value, got shape {list(a.shape)}")
    return a.reshape(-1)[0]


def split_rows(arrays: Mapping[str, np.ndarray | None]) -> list[dict[str, np.ndarray]]:
    """The client's batch as rows of batch size 1 (each input keeps a leading dim of 1)."""
    arrays = {k: np.asarray(v) for k, v in arrays.items() if v is not None}
    query = arrays.get("text_input")
    if query is None:
        raise InvalidInput("text_input is required")
    if query.ndim == 0 or query.shape[0] == 0 or query.size != query.shape[0]:
        raise InvalidInput(f"text_input must hold one string per request ([batch, 1]), got shape {list(query.shape)}")
    return C.batch_rows(arrays, "text_input", InvalidInput)


def parse_request(arrays: Mapping[str, np.ndarray | None], batch_index: int | None = None) -> BlsRequest:
    """Validate one row's tensors; InvalidInput (message starting with the input name) when bad."""
    arrays = {k: np.asarray(v) for k, v in arrays.items() if v is not None}
    query = arrays.get("text_input")
    if query is None:
        raise InvalidInput("text_input is required")
    if query.size != 1:
        raise InvalidInput(f"text_input must hold exactly one string per row, got shape {list(query.shape)}")
    raw = query.reshape(-1)[0]
    if isinstance(raw, (bytes, bytearray, np.bytes_)):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidInput(f"text_input is not valid UTF-8: {e.reason} at byte {e.start}") from None
    elif isinstance(raw, str):
        text = raw
    else:
        raise InvalidInput(f"text_input must be a string, got {type(raw).__name__}")
    if not text:
        raise InvalidInput("text_input is empty")
    if arrays.get("max_tokens") is None:
        raise InvalidInput("max_tokens is required")
    max_tokens = scalar(arrays, "max_tokens")
    if not np.issubdtype(np.asarray(max_tokens).dtype, np.integer) or int(max_tokens) <= 0:
        raise InvalidInput(f"max_tokens must be a positive integer, got {max_tokens}")
    for name, value in arrays.items():
        if name != "text_input" and value.ndim >= 1 and value.shape[0] != 1:
            raise InvalidInput(f"{name} must have batch size 1 (like text_input), got shape {list(value.shape)}")
    try:
        stops = parse_words(arrays["stop_words"].reshape(-1), "stop_words") if "stop_words" in arrays else []
        if "bad_words" in arrays:
            parse_words(arrays["bad_words"].reshape(-1), "bad_words")
    except ValueError as e:
        raise InvalidInput(str(e)) from None
    return BlsRequest(arrays=arrays, text=text, max_tokens=int(max_tokens),
                      stream=bool(scalar(arrays, "stream", False)), stop_strings=stops,
                      exclude_input=bool(scalar(arrays, "exclude_input_in_output", True)), batch_index=batch_index)


def preprocessing_inputs(req: BlsRequest) -> dict[str, np.ndarray]:
    """The preprocessing model's inputs for ``req`` (only those the client gave)."""
    return {pre: req.arrays[client] for pre, client in PREPROCESSING_MAP.items() if client in req.arrays}


def llm_inputs(req: BlsRequest, pre_outputs: Mapping[str, np.ndarray], *, stream: bool = True) -> dict[str, np.ndarray]:
    """The tensorrt_llm model's inputs: NVIDIA's wiring, prompt excluded, streaming as ``stream`` says."""
    out: dict[str, np.ndarray] = {}
    for dst, (kind, src) in LLM_MAP.items():
        value = req.arrays.get(src) if kind == "client" else pre_outputs.get(src)
        if value is not None:
            out[dst] = value
    out.update({k: v.copy() for k, v in _LLM_FORCED.items()})
    out["streaming"] = np.array([[stream]])
    return out


def prompt_ids(pre_outputs: Mapping[str, np.ndarray]) -> list[int]:
    ids = np.asarray(pre_outputs["INPUT_ID"]).reshape(-1)
    n = int(np.asarray(pre_outputs["REQUEST_INPUT_LEN"]).reshape(-1)[0])
    return ids[:n].tolist()


@dataclass
class Chunk:
    """One client response: ``text`` (a delta when streaming) and pass-through arrays."""

    text: str
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    batch_index: int | None = None

    @property
    def empty(self) -> bool:
        """No text and no pass-through: a streamed final chunk like this can be a flag-only response."""
        return not self.text and not self.outputs

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"text_output": np.array([self.text.encode("utf-8")], dtype=object), **self.outputs}
        if self.batch_index is not None:
            out["batch_index"] = np.array([[self.batch_index]], dtype=np.int32)
        return out


class _PassThrough:
    """Pass-through arrays of the responses not yet sent: log probs concatenated, the rest latest."""

    def __init__(self) -> None:
        self._latest: dict[str, np.ndarray] = {}
        self._logprobs: list[np.ndarray] = []

    def add(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name in PASS_THROUGH:
            if arrays.get(name) is None:
                continue
            if name == "output_log_probs":
                self._logprobs.append(np.asarray(arrays[name], dtype=np.float32).reshape(1, 1, -1))
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
        self._latest, self._logprobs = {}, []
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
                 include_stop_words: bool = False) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens,
                                             traits=traits or tokenizer_traits(tokenizer))
        self._stops = StopStringMatcher(req.stop_strings, include_stop=include_stop_words)
        self._stream = req.stream
        self._pass = _PassThrough()
        self._batch_index = req.batch_index
        self._text: list[str] = []  # non-streamed: everything so far
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
        self._pass.add(arrays)
        text, stopped = self._stops.feed(self._detok.add(ids.tolist()))
        if self._stream and not stopped:
            return Chunk(text, self._pass.take(), self._batch_index) if text else None
        self._text.append(text)  # non-streamed, or the last text before a stop string: sent by finish()
        return None

    def finish(self) -> Chunk:
        """The final chunk: flushes held-back text (unless stopped). Call once."""
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
        return Chunk("".join(self._text), self._pass.take(), self._batch_index)
