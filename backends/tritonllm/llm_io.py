"""NVIDIA tensorrt_llm tensor contract <-> engine types, as plain numpy (no Triton imports).

`parse_request` turns one Triton request's input arrays (batch dim first, as Triton delivers them with
max_batch_size > 0) into a `ParsedBatch`: one `ParsedRequest` per batch row, or a stop request. Errors
raise InvalidRequest naming the input. `response_arrays` builds the output arrays of one response for one
row, with NVIDIA's shapes and presence rules; `stack_rows` joins rows into one batched response (unary
mode, where one response must answer the whole batch).

Semantics follow NVIDIA's C++ backend (TensorRT-LLM ``triton_backend/inflight_batcher_llm/src``, read
from their source, not run here):
- ``stop`` is read before anything else; a stop request's other inputs are ignored (NVIDIA's client sends
  ``input_ids`` of garbage, ``input_lengths`` 0, ``request_output_len`` 0);
- a batch of N rows is N engine requests, every input sliced per row; ``input_ids`` rows are cut to
  their ``input_lengths``;
- accepted and ignored, as NVIDIA's backend ignores them in this configuration: ``IGNORED_INPUTS`` (each
  with its reason); every other declared input changes the request or is refused (a unit test sends each
  one);
- ``num_return_sequences`` n: n engine requests of the row (``lifecycle.sequence_params``: seeds seed + i,
  prompt KV shared), each answering with ``sequence_index`` (only when n > 1); decoupled models only;
- ``embedding_bias`` (dense, added to the logits), ``top_logprobs`` / ``priority`` (ours) and the
  request's Triton timeout (the engine's allotted time: the request ends normally, tokens so far) go to
  the engine;
- outputs appear only when asked for: log probs with ``return_log_probs``, ``num_input_tokens`` /
  ``num_output_tokens`` with ``return_num_input_tokens`` / ``return_num_output_tokens``, the ten perf
  tensors with ``return_perf_metrics``, ``batch_index`` when the batch has more than one row,
  ``top_log_probs`` / ``top_log_prob_ids`` with ``top_logprobs`` > 0, ``embedding`` on a ``pooling`` request's
  final response (ours: the prompt's pooled hidden states, no tokens generated).
  ``num_output_tokens`` counts the ids of *that* response (the prompt too when it is included).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import contract as C
from .engine.request import InvalidRequest, RequestMetrics, SamplingParams

if TYPE_CHECKING:  # lora_loader imports torch: the text steps import this module and need none
    from .engine.lora_loader import LoraSource

# SamplingParams field <- tensorrt_llm scalar input, conversion: one row each (an input not sent keeps the
# field's default, which SamplingParams holds: TensorRT-LLM's).
SCALAR_FIELDS: tuple[tuple[str, str, type], ...] = (
    ("temperature", "temperature", float),
    ("top_k", "runtime_top_k", int),
    ("top_p", "runtime_top_p", float),
    ("repetition_penalty", "repetition_penalty", float),
    ("presence_penalty", "presence_penalty", float),
    ("frequency_penalty", "frequency_penalty", float),
    ("min_tokens", "min_tokens", int),
    ("seed", "seed", int),
    ("end_id", "end_id", int),
    ("return_log_probs", "return_log_probs", bool),
    ("lora_task_id", "lora_task_id", int),
    ("top_logprobs", "top_logprobs", int),
    ("priority", "priority", float),
)
# The engine names its own fields in errors (SamplingParams.verify, LLMEngine.validate); on the tensor
# contract they are the inputs they came from, where the names differ.
TENSOR_OF_FIELD: dict[str, str] = {
    **{field: name for field, name, _ in SCALAR_FIELDS if field != name},
    "prompt_ids": "input_ids", "max_tokens": "request_output_len", "stop_words": "stop_words_list",
    "bad_words": "bad_words_list", "guide": "guided_decoding_guide_type", "allotted_time_ms": "timeout",
}
_FIELD_WORD = re.compile(r"\b(" + "|".join(TENSOR_OF_FIELD) + r")\b")


def in_tensor_names(message: str) -> str:
    """An engine error in the tensorrt_llm contract's input names ("max_tokens must be >= 1" ->
    "request_output_len must be >= 1"); messages already in those names are unchanged. Only the engine's
    own words are renamed: what follows the first ": " may quote the client (a schema that does not
    compile), and stays as the client wrote it."""
    head, sep, tail = message.partition(": ")
    return _FIELD_WORD.sub(lambda m: TENSOR_OF_FIELD[m.group(1)], head) + sep + tail


# Declared inputs that do not change what is generated here, as in NVIDIA's backend for a decoder-only
# engine at beam width 1. Everything else declared is served or refused (tests/unit/test_llm_io.py).
IGNORED_INPUTS: dict[str, str] = {
    "decoder_input_ids": "encoder-decoder models only (NVIDIA's preprocessing always sends [[pad_id]])",
    "decoder_input_lengths": "encoder-decoder models only",
    "len_penalty": "beam search only; beam width is 1",
    "early_stopping": "beam search only; beam width is 1",
    "beam_search_diversity_rate": "beam search only; beam width is 1",
    "pad_id": "pads beams of different lengths; one beam here",
    "draft_input_ids": "client drafts: verification is lossless, so only speed is lost",
    "runtime_top_p_min": "only shapes a top-p decay, which is refused (runtime_top_p_decay)",
    "runtime_top_p_reset_ids": "only shapes a top-p decay, which is refused (runtime_top_p_decay)",
    "ensemble_names": "ours: read by the adapter to name the ensemble's inputs in errors",
}
_DTYPES = {t.name: np.dtype(C.numpy_dtype(t.dtype)) for t in C.TENSORRT_LLM_INPUTS}
INPUT_NAMES = tuple(t.name for t in C.TENSORRT_LLM_INPUTS)


# Each sequence answers on its own responses (NVIDIA's backend): a unary model has one response to give.
SEQUENCES_NEED_DECOUPLED = ("several sequences answer on their own responses, which needs decoupled mode "
                            "(deployment.yaml: llm.decoupled_mode)")
# NVIDIA's refusal of streaming by a model that is not decoupled (their utils.cc), plus how to switch.
STREAMING_NEEDS_DECOUPLED = ("Streaming is only supported if model is deployed using decoupled mode. "
                             "(deployment.yaml: llm.decoupled_mode, or serve without --model-config-name unary)")


@dataclass
class OutputFlags:
    """Which optional outputs a row asked for."""

    log_probs: bool = False
    num_input_tokens: bool = False
    num_output_tokens: bool = False
    perf_metrics: bool = False
    top_logprobs: int = 0     # alternatives per token in top_log_probs / top_log_prob_ids (ours)


@dataclass
class ParsedRequest:
    """One batch row: an engine request."""

    prompt_ids: list[int]
    params: SamplingParams
    streaming: bool
    exclude_input: bool
    flags: OutputFlags
    num_sequences: int = 1    # num_return_sequences: each sequence is its own engine request


@dataclass
class ParsedBatch:
    rows: list[ParsedRequest]
    stop: bool = False


def _scalar(arrays: dict, name: str, default=None):
    a = arrays.get(name)
    if a is None:
        return default
    if a.size != 1:
        raise InvalidRequest(f"{name} must hold exactly one value per request, got shape {list(a.shape)}")
    return a.reshape(-1)[0].item()


def _text(arrays: dict, name: str) -> str:
    a = arrays.get(name)
    if a is None or a.size == 0:
        return ""
    if a.size != 1:
        raise InvalidRequest(f"{name} must hold exactly one string, got shape {list(a.shape)}")
    v = a.reshape(-1)[0]
    try:
        return v.decode("utf-8") if isinstance(v, bytes) else str(v)
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"{name} is not valid UTF-8") from e


def _check_dtypes(arrays: dict) -> None:
    for name, arr in arrays.items():
        want = _DTYPES.get(name)
        if want is not None and arr.dtype != want and not (want == object and arr.dtype.kind in "OSU"):
            raise InvalidRequest(f"{name} must be {'BYTES' if want == object else want.name}, got {arr.dtype.name}")


def decode_word_list(arr: np.ndarray | None, name: str) -> list[list[int]]:
    """TensorRT-LLM [2, N] word list (row 0 flat ids, row 1 cumulative end offsets padded by -1)."""
    if arr is None:
        return []
    a = arr.reshape(arr.shape[-2:]) if arr.ndim == 3 and arr.shape[0] == 1 else arr
    if a.ndim != 2 or a.shape[0] != 2:
        raise InvalidRequest(f"{name} must have shape [2, N] (per request), got {list(arr.shape)}")
    ids, offsets = a[0].tolist(), [int(o) for o in a[1].tolist() if o >= 0]
    words, prev = [], 0
    for off in offsets:
        if off <= prev or off > len(ids):
            raise InvalidRequest(f"{name} has invalid offsets {offsets[:8]} for {len(ids)} ids")
        words.append([int(t) for t in ids[prev:off]])
        prev = off
    return words


def is_stop_request(arrays: dict[str, np.ndarray]) -> bool:
    """NVIDIA reads ``stop`` first, from its first element, and nothing else of a stop request."""
    stop = arrays.get("stop")
    if stop is None or stop.size == 0:
        return False
    if stop.dtype != np.bool_:
        raise InvalidRequest(f"stop must be BOOL, got {stop.dtype.name}")
    return bool(stop.reshape(-1)[0])


def wants_ensemble_names(arrays: dict[str, np.ndarray]) -> bool:
    """The request came through the ensemble (our ``ensemble_names`` input): errors also name its inputs."""
    a = arrays.get("ensemble_names")
    return a is not None and a.dtype == np.bool_ and bool(a.any())


def _rows(arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Every input sliced per batch row (each keeps a leading dim of 1)."""
    ids = arrays.get("input_ids")
    if ids is None:
        raise InvalidRequest("input_ids is required")
    if ids.ndim != 2 or ids.shape[0] == 0:
        raise InvalidRequest(f"input_ids must have shape [batch, tokens], got {list(ids.shape)}")
    return C.batch_rows(arrays, "input_ids", InvalidRequest)


def _parse_row(arrays: dict[str, np.ndarray], default_exclude_input: bool, timeout_us: int) -> ParsedRequest:
    prompt = arrays["input_ids"].reshape(-1).tolist()
    n = _scalar(arrays, "input_lengths")
    if n is None:
        raise InvalidRequest("input_lengths is required")
    if not 0 < n <= len(prompt):
        raise InvalidRequest(f"input_lengths {n} does not fit input_ids of length {len(prompt)}")
    prompt = prompt[:n]
    out_len = _scalar(arrays, "request_output_len")
    if out_len is None:
        raise InvalidRequest("request_output_len is required")
    beam = _scalar(arrays, "beam_width", 1)
    if beam != 1:
        raise InvalidRequest(f"beam_width {beam} is not supported (only 1)")
    nret = _scalar(arrays, "num_return_sequences", 1)
    if not 1 <= nret <= C.MAX_RETURN_SEQUENCES:
        raise InvalidRequest(f"num_return_sequences must be in [1, {C.MAX_RETURN_SEQUENCES}], got {nret}")
    lora_source = _lora_source(arrays)
    bias = arrays.get("embedding_bias")
    if bias is not None and bias.size:
        import torch  # only here: the text steps import this module and need no torch

        bias = torch.from_numpy(np.array(bias, dtype=np.float32).reshape(-1))
    else:
        bias = None
    for flag in ("return_context_logits", "return_generation_logits"):
        if _scalar(arrays, flag, False):
            raise InvalidRequest(f"{flag} is not supported by this engine")
    decay = _scalar(arrays, "runtime_top_p_decay", 1.0)
    if decay != 1.0:
        raise InvalidRequest(f"runtime_top_p_decay {decay} is not supported (only 1.0: no decay)")
    pooling = _text(arrays, "pooling") or None
    if pooling is not None and nret != 1:
        raise InvalidRequest("pooling answers one embedding per prompt: num_return_sequences must be 1")
    guide_type = _text(arrays, "guided_decoding_guide_type")
    guide = (guide_type, _text(arrays, "guided_decoding_guide")) if guide_type else None
    if guide is None and _text(arrays, "guided_decoding_guide"):
        raise InvalidRequest("guided_decoding_guide needs guided_decoding_guide_type (json, json_schema, regex "
                             "or ebnf_grammar)")
    scalars = {}
    for field, name, conv in SCALAR_FIELDS:  # an input not sent keeps SamplingParams' default
        value = _scalar(arrays, name)
        if value is not None:
            scalars[field] = conv(value)
    params = SamplingParams(
        max_tokens=int(out_len),
        **scalars,
        stop_words=decode_word_list(arrays.get("stop_words_list"), "stop_words_list"),
        bad_words=decode_word_list(arrays.get("bad_words_list"), "bad_words_list"),
        guide=guide,
        embedding_bias=bias,
        allotted_time_ms=-(-timeout_us // 1000) if timeout_us > 0 else None,
        pooling=pooling,
        lora_source=lora_source,
    )
    flags = OutputFlags(log_probs=params.return_log_probs,
                        num_input_tokens=bool(_scalar(arrays, "return_num_input_tokens", False)),
                        num_output_tokens=bool(_scalar(arrays, "return_num_output_tokens", False)),
                        perf_metrics=bool(_scalar(arrays, "return_perf_metrics", False)),
                        top_logprobs=params.top_logprobs)
    return ParsedRequest(prompt, params, bool(_scalar(arrays, "streaming", False)),
                         bool(_scalar(arrays, "exclude_input_in_output", default_exclude_input)), flags,
                         num_sequences=int(nret))


def _lora_source(arrays: dict[str, np.ndarray]) -> LoraSource | None:
    """Where a run-time adapter comes from: ``lora_path`` (ours, NVIDIA's LLM-API name) or TensorRT-LLM's
    ``lora_weights`` + ``lora_config`` (one request's rows; the batch dimension dropped)."""
    path = _text(arrays, "lora_path") or None
    tensors = [arrays.get(n) for n in ("lora_weights", "lora_config")]
    tensors = [None if t is None or t.size == 0 else t.reshape(t.shape[-2:]) if t.ndim == 3 and t.shape[0] == 1
               else t for t in tensors]
    if path is None and all(t is None for t in tensors):
        return None
    from .engine.lora_loader import LoraSource  # torch through lora.py: the engine's side only

    return LoraSource(path, *tensors)


def parse_request(arrays: dict[str, np.ndarray], default_exclude_input: bool, timeout_us: int = 0) -> ParsedBatch:
    """One Triton request -> its rows (see the module docstring); InvalidRequest names the input, and the
    row (``batch item 2: ...``) when the batch has several. ``timeout_us`` is the request's Triton timeout
    (0 = none): the engine's allotted time (TensorRT-LLM's allotted_time_ms)."""
    if is_stop_request(arrays):
        return ParsedBatch([], stop=True)
    _check_dtypes(arrays)
    rows = _rows(arrays)
    parsed = []
    for i, row in enumerate(rows):
        try:
            parsed.append(_parse_row(row, default_exclude_input, timeout_us))
        except InvalidRequest as e:
            raise InvalidRequest(f"batch item {i}: {e}" if len(rows) > 1 else str(e)) from None
    return ParsedBatch(parsed)


def response_arrays(token_ids: list[int], logprobs: list[float], cum_logprob: float, num_input: int,
                    flags: OutputFlags, metrics: RequestMetrics | None = None, batch_index: int | None = None,
                    request_key: int = 0, is_final: bool = True, sequence_index: int | None = None,
                    top: list[list[tuple[int, float]]] | None = None,
                    finish_reason: str | None = None, embedding: list[float] | None = None) -> dict[str, np.ndarray]:
    """Arrays of one response of one row: batch 1, beam 1 (output_ids [1, 1, N], sequence_length [1, 1], ...).

    `request_key` (unique per engine request) and `is_final` are not NVIDIA outputs: wired to the
    postprocessing model's REQUEST_KEY / IS_FINAL they make ensemble streaming exact without relying on
    client request ids."""
    n = len(token_ids)
    out = {  # output_ids first: NVIDIA's benchmark client reads the first output's shape
        "output_ids": np.asarray(token_ids, dtype=np.int32).reshape(1, 1, n),
        "sequence_length": np.asarray([[n]], dtype=np.int32),
    }
    if flags.log_probs:
        out["cum_log_probs"] = np.asarray([[cum_logprob]], dtype=np.float32)
        out["output_log_probs"] = np.asarray(logprobs, dtype=np.float32).reshape(1, 1, len(logprobs))
    if batch_index is not None:
        out["batch_index"] = np.asarray([[batch_index]], dtype=np.int32)
    if sequence_index is not None:
        out["sequence_index"] = np.asarray([[sequence_index]], dtype=np.int32)
    if flags.top_logprobs:
        out.update(top_arrays(top or [], flags.top_logprobs))
    if flags.num_input_tokens:
        out["num_input_tokens"] = np.asarray([[num_input]], dtype=np.int32)
    if flags.num_output_tokens:
        out["num_output_tokens"] = np.asarray([[n]], dtype=np.int32)
    if flags.perf_metrics and metrics is not None:
        out.update(perf_arrays(metrics))
    out["request_key"] = np.asarray([[request_key]], dtype=np.uint64)
    out["is_final"] = np.asarray([[is_final]], dtype=np.bool_)
    out["finish_reason"] = np.asarray([[(finish_reason or "").encode()]], dtype=object)
    if embedding is not None:
        out["embedding"] = np.asarray(embedding, dtype=np.float32).reshape(1, -1)
    return out


def top_arrays(top: list[list[tuple[int, float]]], k: int) -> dict[str, np.ndarray]:
    """``top_log_prob_ids`` / ``top_log_probs`` [1, tokens, k] of one response (rows padded with id -1 and
    -inf should the vocabulary hold fewer than k tokens)."""
    ids = np.full((1, len(top), k), -1, dtype=np.int32)
    lps = np.full((1, len(top), k), -np.inf, dtype=np.float32)
    for t, alternatives in enumerate(top):
        for j, (tok, lp) in enumerate(alternatives[:k]):
            ids[0, t, j], lps[0, t, j] = tok, lp
    return {"top_log_prob_ids": ids, "top_log_probs": lps}


def perf_arrays(m: RequestMetrics) -> dict[str, np.ndarray]:
    """The ten perf tensors of TensorRT-LLM's RequestPerfMetrics, each [1, 1]."""
    def col(value, dtype):
        return np.asarray([[value]], dtype=dtype)

    return {
        "kv_cache_alloc_new_blocks": col(m.kv_alloc_new_blocks, np.int32),
        "kv_cache_reused_blocks": col(m.kv_reused_blocks, np.int32),
        "kv_cache_alloc_total_blocks": col(m.kv_alloc_total_blocks, np.int32),
        "arrival_time_ns": col(m.arrival_ns, np.int64),
        "first_scheduled_time_ns": col(m.first_scheduled_ns, np.int64),
        "first_token_time_ns": col(m.first_token_ns, np.int64),
        "last_token_time_ns": col(m.last_token_ns, np.int64),
        "acceptance_rate": col(m.acceptance_rate, np.float32),
        "total_accepted_draft_tokens": col(m.accepted_draft_tokens, np.int32),
        "total_draft_tokens": col(m.draft_tokens, np.int32),
    }


def stack_rows(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-row response arrays -> one response for the whole batch (row i = batch item i). Ragged token
    axes are padded with -1, as NVIDIA pads beams of different lengths. Only names every row has."""
    names = [k for k in rows[0] if all(k in r for r in rows)]
    out = {}
    for name in names:
        parts = [r[name] for r in rows]
        width = max(p.shape[-1] for p in parts)
        if any(p.shape[-1] != width for p in parts):
            parts = [np.pad(p, [(0, 0)] * (p.ndim - 1) + [(0, width - p.shape[-1])], constant_values=-1)
                     for p in parts]
        out[name] = np.concatenate(parts, axis=0)
    return out
