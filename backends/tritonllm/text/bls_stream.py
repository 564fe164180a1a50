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
- ``text_generation.TextGeneration`` feeds every response's new ids to one ``IncrementalDetokenizer`` and the text to
  one ``StopStringMatcher``; with ``num_return_sequences`` n > 1 (decoupled only: ``needs_decoupled``)
  the row's one engine request streams n sequences, each with its own TextGeneration (``sequences.py``);
- the client's ``top_logprobs`` / ``priority`` go to tensorrt_llm unchanged; ``logit_bias_ids`` /
  ``_weights`` are added into the ``embedding_bias`` it gets (``logit_bias.py``); the client's Triton
  timeout becomes the inner request's (``inner_timeout_us``), which tensorrt_llm makes the engine's
  deadline (the request then ends normally with the tokens so far).

Invariants:
- streamed: the concatenated ``text`` of all chunks equals the non-streamed text of the same (greedy)
  request, which is ``tokenizer.decode(generated ids, skip_special_tokens)`` cut just before the first
  completed stop string (the stop string and all after it are never sent), or just after it with
  ``include_stop_words`` (NVIDIA's BLS keeps the stop word);
- pass-through outputs (present when the client asked for them, as tensorrt_llm gives them): each chunk
  carries ``output_log_probs`` of every token since the previous chunk (concatenated; so the chunks'
  log probs together cover every generated token once) and ``output_token_ids``, those tokens' ids (the
  engine's, one per log prob, also past a stop string's cut as the log probs are), likewise
  ``top_log_probs`` / ``top_log_prob_ids`` (``[1, tokens, k]``, concatenated along the token axis),
  ``num_output_tokens`` summed over the same responses (NVIDIA's per-response count; a non-streamed
  response with the prompt included counts it too, as NVIDIA's tensorrt_llm does), and the latest
  ``cum_log_probs`` / ``num_input_tokens`` / perf metrics received since the previous chunk;
- ``text_output`` is ``[1]`` (``[batch]`` for a unary batch), NVIDIA's flat layout; a chunk carries
  ``batch_index`` when the client batch has several rows and ``sequence_index`` when n > 1;
- with ``exclude_input_in_output=false`` and no streaming, the text starts with the decoded prompt
  (``decode(prompt + generated)``, as NVIDIA's BLS); streamed chunks never repeat the prompt (NVIDIA's
  streaming sends new tokens only). Stop strings are searched in generated text only.
- Error messages from the inner models are rewritten to the client's input names (``client_message``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import contract as C
from ..error_names import to_client_names
from ..errors import ERROR_OUTPUTS
from .logit_bias import merge as merge_bias
from .logit_bias import parse_logit_bias
from .preprocess import InvalidInput
from .word_lists import parse_words

# tensorrt_llm outputs forwarded to the client (all declared by NVIDIA's tensorrt_llm and the BLS).
PASS_THROUGH = ("cum_log_probs", "output_log_probs", "num_input_tokens", "num_output_tokens",
                *(t.name for t in C.PERF_OUTPUTS))
SUMMED = ("num_output_tokens",)
# Ours, to the client with output_log_probs: the ids of the tokens those log probs score (contract.LOGPROB_TOKEN_IDS).
LOGPROB_IDS = C.LOGPROB_TOKEN_IDS.name
LLM_OUTPUTS = ("output_ids", "sequence_length", "sequence_index", *PASS_THROUGH)
# Ours (not NVIDIA's tensorrt_llm): asked for only when the client wants top log probs, so a BLS in front
# of NVIDIA's backend (which declares neither, and refuses undeclared outputs) works without them.
TOP_OUTPUTS = tuple(t.name for t in C.TOP_LOGPROB_OUTPUTS)

_PRE_STEP, _LLM_STEP = C.NVIDIA_ENSEMBLE_STEPS[0], C.NVIDIA_ENSEMBLE_STEPS[1]
# preprocessing input <- client input, e.g. QUERY <- text_input (NVIDIA's ensemble wiring).
PREPROCESSING_MAP: dict[str, str] = dict(_PRE_STEP[1])
# tensorrt_llm input <- ("client", name) | ("preprocessing", output name).
_PRE_OUT = {internal: out for out, internal in _PRE_STEP[2].items()}
LLM_MAP: dict[str, tuple[str, str]] = {
    dst: ("preprocessing", _PRE_OUT[src]) if src in _PRE_OUT else ("client", src)
    for dst, src in _LLM_STEP[1].items()}
# num_return_sequences is in NVIDIA's wiring (their BLS drops it; ours forwards it, and the ensemble does);
# the engine's request options (top_logprobs, priority) and lora_path are not, and go through under the same names.
LLM_MAP.update({t.name: ("client", t.name) for t in (*C.ENGINE_REQUEST_INPUTS, C.LORA_PATH_INPUT)})
# Inputs set here whatever the client says (see module docstring).
_LLM_FORCED = {"exclude_input_in_output": np.array([[True]])}


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
    num_return_sequences: int = 1   # sequences of this row, each with its own text (see sequences.py)
    top_logprobs: int = 0           # > 0: tensorrt_llm is asked for top_log_probs / top_log_prob_ids
    logit_bias: np.ndarray | None = None  # dense [vocab] float32 (logit_bias.parse_logit_bias), or None


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


def parse_request(arrays: Mapping[str, np.ndarray | None], batch_index: int | None = None, *,
                  vocab_size: int | None = None) -> BlsRequest:
    """Validate one row's tensors; InvalidInput (message starting with the input name) when bad.
    ``vocab_size`` (the tokenizer's ``len()``) is needed to take logit_bias_ids / _weights; without it
    (the LLM-API contract, which has no such inputs) they are not read."""
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
                      exclude_input=bool(scalar(arrays, "exclude_input_in_output", True)), batch_index=batch_index,
                      num_return_sequences=_num_return_sequences(arrays), top_logprobs=_top_logprobs(arrays),
                      logit_bias=parse_logit_bias(arrays, vocab_size) if vocab_size is not None else None)


def _num_return_sequences(arrays: Mapping[str, np.ndarray]) -> int:
    n = scalar(arrays, "num_return_sequences", 1)
    if not np.issubdtype(np.asarray(n).dtype, np.integer) or not 1 <= int(n) <= C.MAX_RETURN_SEQUENCES:
        raise InvalidInput(f"num_return_sequences must be an integer in [1, {C.MAX_RETURN_SEQUENCES}], got {n}")
    return int(n)


def _top_logprobs(arrays: Mapping[str, np.ndarray]) -> int:
    """Only read to decide which outputs to ask for: its range is tensorrt_llm's to check (same name)."""
    k = scalar(arrays, "top_logprobs", 0)
    if not np.issubdtype(np.asarray(k).dtype, np.integer):
        raise InvalidInput(f"top_logprobs must be an integer, got {k}")
    return int(k)


def needs_decoupled(req: BlsRequest) -> str | None:
    """Why a unary BLS (``decoupled_mode: false``) cannot serve ``req`` beyond streaming, or None: its
    sequences answer on their own responses, which only a decoupled model can send."""
    if req.num_return_sequences > 1:
        return (f"num_return_sequences {req.num_return_sequences} needs decoupled mode: each sequence answers "
                "on its own responses (deployment.yaml: llm.decoupled_mode, or serve without --model-config-name "
                "unary)")
    return None


def llm_outputs(req: BlsRequest, finish_reason: bool = True) -> list[str]:
    """The tensorrt_llm outputs to ask for: NVIDIA's, plus ours only when the client wants them, and the engine's
    finish_reason and failures as data (errors.py) unless the slot is NVIDIA's backend (which declares neither: the
    BLS parameter ``engine_finish_reason: false`` of the GPU profile)."""
    ours = ("finish_reason", *ERROR_OUTPUTS) if finish_reason else ()
    return [*LLM_OUTPUTS, *(TOP_OUTPUTS if req.top_logprobs > 0 else ()), *ours]


def inner_timeout_us(timeout_us: int, elapsed_s: float) -> int:
    """The inner tensorrt_llm request's Triton timeout: what is left of the client's (``timeout_us``,
    0 = none) after ``elapsed_s`` in the BLS (preprocessing included: the client's deadline covers the
    whole request). Never 0 once one was set, since 0 would mean no deadline at all."""
    if timeout_us <= 0:
        return 0
    return max(1, int(timeout_us) - int(elapsed_s * 1e6))


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
    bias = merge_bias(pre_outputs.get("EMBEDDING_BIAS"), req.logit_bias)
    if bias is not None:
        out["embedding_bias"] = bias
    return out


def prompt_ids(pre_outputs: Mapping[str, np.ndarray]) -> list[int]:
    ids = np.asarray(pre_outputs["INPUT_ID"]).reshape(-1)
    n = int(np.asarray(pre_outputs["REQUEST_INPUT_LEN"]).reshape(-1)[0])
    return ids[:n].tolist()
