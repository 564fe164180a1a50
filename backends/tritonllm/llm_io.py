"""NVIDIA tensorrt_llm tensor contract <-> engine types, as plain numpy (no Triton imports).

`parse_request` turns one request's input arrays (batch dim of 1 included, as Triton delivers them with
max_batch_size > 0) into a prompt and SamplingParams, raising InvalidRequest that names the input.
`response_arrays` builds the output arrays of one response.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine.request import InvalidRequest, SamplingParams

_EXPECTED_DTYPES = {
    "input_ids": np.int32, "input_lengths": np.int32, "request_output_len": np.int32,
    "end_id": np.int32, "pad_id": np.int32, "beam_width": np.int32, "runtime_top_k": np.int32,
    "num_return_sequences": np.int32, "min_tokens": np.int32,
    "temperature": np.float32, "runtime_top_p": np.float32, "repetition_penalty": np.float32,
    "presence_penalty": np.float32, "frequency_penalty": np.float32, "len_penalty": np.float32,
    "seed": np.uint64, "streaming": np.bool_, "return_log_probs": np.bool_,
    "exclude_input_in_output": np.bool_, "stop": np.bool_, "return_context_logits": np.bool_,
    "return_generation_logits": np.bool_, "stop_words_list": np.int32, "bad_words_list": np.int32,
    "lora_task_id": np.uint64,
}


@dataclass
class ParsedRequest:
    prompt_ids: list[int]
    params: SamplingParams
    streaming: bool
    exclude_input: bool
    stop: bool


def _scalar(arrays: dict, name: str, default=None):
    a = arrays.get(name)
    if a is None:
        return default
    if a.size != 1:
        raise InvalidRequest(f"{name} must hold exactly one value, got shape {list(a.shape)}")
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
        want = _EXPECTED_DTYPES.get(name)
        if want is not None and arr.dtype != want:
            raise InvalidRequest(f"{name} must be {np.dtype(want).name}, got {arr.dtype.name}")


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


def parse_request(arrays: dict[str, np.ndarray], default_exclude_input: bool) -> ParsedRequest:
    _check_dtypes(arrays)
    stop = bool(_scalar(arrays, "stop", False))
    ids = arrays.get("input_ids")
    if ids is None:
        if stop:
            return ParsedRequest([], SamplingParams(), False, True, True)
        raise InvalidRequest("input_ids is required")
    if ids.ndim > 2 or (ids.ndim == 2 and ids.shape[0] != 1):
        raise InvalidRequest(f"input_ids must have shape [1, N], got {list(ids.shape)}")
    prompt = ids.reshape(-1).tolist()
    n = _scalar(arrays, "input_lengths")
    if n is not None:
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
    if nret != 1:
        raise InvalidRequest(f"num_return_sequences {nret} is not supported (only 1)")
    for name in ("lora_weights", "lora_config"):
        if arrays.get(name) is not None and arrays[name].size:
            raise InvalidRequest(f"{name}: in-request LoRA weights are not supported; adapters are loaded from "
                                 "the model's lora_adapters parameter and chosen with lora_task_id")
    lora = _scalar(arrays, "lora_task_id")
    bias = arrays.get("embedding_bias")
    if bias is not None and bias.size:
        raise InvalidRequest("embedding_bias is not supported by this engine")
    for flag in ("return_context_logits", "return_generation_logits"):
        if _scalar(arrays, flag, False):
            raise InvalidRequest(f"{flag} is not supported by this engine")
    guide_type = _text(arrays, "guided_decoding_guide_type")
    guide = (guide_type, _text(arrays, "guided_decoding_guide")) if guide_type else None
    seed = _scalar(arrays, "seed")
    params = SamplingParams(
        max_tokens=int(out_len),
        temperature=float(_scalar(arrays, "temperature", 1.0)),
        top_k=int(_scalar(arrays, "runtime_top_k", 0)),
        top_p=float(_scalar(arrays, "runtime_top_p", 0.0)),
        repetition_penalty=float(_scalar(arrays, "repetition_penalty", 1.0)),
        presence_penalty=float(_scalar(arrays, "presence_penalty", 0.0)),
        frequency_penalty=float(_scalar(arrays, "frequency_penalty", 0.0)),
        min_tokens=int(_scalar(arrays, "min_tokens", 0)),
        seed=int(seed) if seed is not None else None,
        end_id=_scalar(arrays, "end_id"),
        stop_words=decode_word_list(arrays.get("stop_words_list"), "stop_words_list"),
        bad_words=decode_word_list(arrays.get("bad_words_list"), "bad_words_list"),
        return_log_probs=bool(_scalar(arrays, "return_log_probs", False)),
        guide=guide,
        lora_task_id=int(lora) if lora is not None else None,
    )
    return ParsedRequest(prompt, params, bool(_scalar(arrays, "streaming", False)),
                         bool(_scalar(arrays, "exclude_input_in_output", default_exclude_input)), stop)


def response_arrays(token_ids: list[int], logprobs: list[float], cum_logprob: float,
                    num_input: int, num_output: int, request_key: int = 0,
                    is_final: bool = True) -> dict[str, np.ndarray]:
    """Arrays of one response: batch 1, beam 1 (output_ids [1, 1, N], sequence_length [1, 1], ...).

    `request_key` (unique per engine request) and `is_final` are not NVIDIA outputs: wired to the
    postprocessing model's REQUEST_KEY / IS_FINAL they make ensemble streaming exact without relying on
    client request ids."""
    n = len(token_ids)
    return {
        "output_ids": np.asarray(token_ids, dtype=np.int32).reshape(1, 1, n),
        "sequence_length": np.asarray([[n]], dtype=np.int32),
        "cum_log_probs": np.asarray([[cum_logprob]], dtype=np.float32),
        "output_log_probs": np.asarray(logprobs, dtype=np.float32).reshape(1, 1, len(logprobs)),
        "context_logits": np.zeros((1, 1, 1), dtype=np.float32),
        "generation_logits": np.zeros((1, 1, 1, 1), dtype=np.float32),
        "batch_index": np.asarray([[0]], dtype=np.int32),
        "num_input_tokens": np.asarray([[num_input]], dtype=np.int32),
        "num_output_tokens": np.asarray([[num_output]], dtype=np.int32),
        "request_key": np.asarray([[request_key]], dtype=np.uint64),
        "is_final": np.asarray([[is_final]], dtype=np.bool_),
    }


# prompt_lookup: n-gram drafts; draft_model (TensorRT-LLM: draft_tokens_external): the checkpoint in the
# `draft_model_path` parameter drafts (the adapter resolves that path).
SPECULATIVE_MODES = ("prompt_lookup", "draft_model", "draft_tokens_external")
DRAFT_MODEL_MODES = SPECULATIVE_MODES[1:]


def engine_config_from_parameters(p: dict[str, str]):
    """config.pbtxt parameters (NVIDIA's names where they exist) -> EngineConfig."""
    from .engine.config import EngineConfig

    def get(name, conv, default=None):
        v = p.get(name)
        if v is None or v == "" or v.startswith("${"):
            return default
        try:
            return conv(v)
        except ValueError as e:
            raise ValueError(f"parameter {name}={v!r}: {e}") from e

    def boolean(v: str) -> bool:
        if v.lower() in ("1", "true", "yes", "on"):
            return True
        if v.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError("expected true or false")

    return EngineConfig(
        block_size=get("tokens_per_block", int, 16),
        max_kv_tokens=get("max_tokens_in_paged_kv_cache", int),
        kv_mem_fraction=get("kv_cache_free_gpu_mem_fraction", float, 0.9),
        max_num_tokens=get("max_num_tokens", int, 512),
        max_num_seqs=get("max_num_sequences", int, 64),
        max_queue_size=get("max_queue_size", int, 1024),
        enable_chunked_prefill=get("enable_chunked_context", boolean, True),
        enable_prefix_caching=get("enable_kv_cache_reuse", boolean, False),
        max_draft_len=(get("max_draft_len", int, 0)
                       if get("speculative_decoding_mode", str, "") in SPECULATIVE_MODES else 0),
        ngram_max=get("prompt_lookup_ngram", int, 3),
        quantization=get("quantization", str, "none"),
        fp8_matmul=get("fp8_matmul", str, "auto"),
        cpu_kernels=get("cpu_kernels", str, "auto"),
        kv_cache_dtype=get("kv_cache_dtype", str, "auto"),
        max_input_len=get("max_input_len", int),
        max_seq_len=get("max_seq_len", int),
        device=get("engine_device", str, "auto"),
        dtype=get("engine_dtype", str, "auto"),
        num_threads=get("num_threads", int, 0),
    ), get("exclude_input_in_output", boolean, True)
