"""NVIDIA's LLM-API text contract (model ``llmapi`` here; ``tensorrt_llm`` in NVIDIA's repository).

Read from NVIDIA/TensorRT-LLM ``triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt`` (commit
0a71057313ec0626527e164a8fc0205c5822e2f5) and its ``1/model.py`` / ``1/helpers.py`` (0ebb1536, 0df60f9a):
text in, text out, ``sampling_param_*`` as ``tensorrt_llm.SamplingParams`` fields. Their model calls
``tensorrt_llm.LLM``; ours is the BLS (backend ``llm_bls``, parameter ``contract: llmapi``) over our
``preprocessing`` and ``tensorrt_llm``, so it serves on CPU with our engine and on GPUs with either GPU
profile's ``tensorrt_llm``.

Invariants:
- ``max_batch_size: 0`` as NVIDIA's (their model does not batch, JIRA-4496): dims are the request's
  shapes. ``text_input`` ``[-1]``: the first string is the prompt, as in NVIDIA's model.
- Outputs other than ``text_output`` are sent as strings (``str(value)``), which is what NVIDIA's model
  puts on the wire although its config declares FP32 / INT32 / INT64; we declare TYPE_STRING, what is
  sent. ``finish_reason`` / ``stop_reason`` / ``cumulative_logprob`` only when their ``return_*`` input
  is true, the perf outputs only with ``sampling_param_return_perf_metrics``.
- Left out: ``image_url`` (multimodal), ``sampling_param_best_of`` > 1 (refused, as n > 1 is).
Library code: no Triton import.
"""
from __future__ import annotations

from .tensor_spec import Tensor
from .tensor_spec import scalars as _scalars

LLMAPI_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (-1,)),
    *_scalars("TYPE_BOOL", "streaming", reshape=None),
    *_scalars("TYPE_INT32", "sampling_param_best_of", reshape=None),
    *_scalars("TYPE_FP32", "sampling_param_temperature", reshape=None),
    *_scalars("TYPE_INT32", "sampling_param_top_k", reshape=None),
    *_scalars("TYPE_FP32", "sampling_param_top_p sampling_param_frequency_penalty "
                           "sampling_param_presence_penalty", reshape=None),
    *_scalars("TYPE_INT32", "sampling_param_max_tokens", reshape=None),
    Tensor("sampling_param_stop", "TYPE_STRING", (-1,), optional=True),
    *_scalars("TYPE_UINT64", "sampling_param_seed", reshape=None),
    *_scalars("TYPE_BOOL", "sampling_param_exclude_input_from_output sampling_param_return_perf_metrics "
                           "return_finish_reason return_stop_reason return_cumulative_logprob stop", reshape=None),
    *_scalars("TYPE_UINT64", "lora_id", reshape=None),
    *_scalars("TYPE_STRING", "lora_name lora_path lora_ckpt_source", reshape=None),
)
# NVIDIA's perf outputs <- (our tensorrt_llm output, how): the LLM API's RequestPerfMetrics, of which
# "missed" blocks are the newly allocated ones and the hit rate is reused / (reused + missed).
PERF_FROM: dict[str, str] = {
    "kv_cache_reused_block": "kv_cache_reused_blocks",
    "kv_cache_missed_block": "kv_cache_alloc_new_blocks",
    "kv_cache_alloc_new_blocks": "kv_cache_alloc_new_blocks",
    "kv_cache_alloc_total_blocks": "kv_cache_alloc_total_blocks",
    "kv_cache_hit_rate": "",  # derived
    "arrival_time_ns": "arrival_time_ns",
    "first_scheduled_time_ns": "first_scheduled_time_ns",
    "first_token_time_ns": "first_token_time_ns",
    "last_token_time_ns": "last_token_time_ns",
    "acceptance_rate": "acceptance_rate",
    "total_accepted_draft_tokens": "total_accepted_draft_tokens",
    "total_draft_tokens": "total_draft_tokens",
}
REASON_OUTPUTS = {"return_finish_reason": "finish_reason", "return_stop_reason": "stop_reason",
                  "return_cumulative_logprob": "cumulative_logprob"}
LLMAPI_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    *(Tensor(name, "TYPE_STRING", (-1,)) for name in REASON_OUTPUTS.values()),
    *(Tensor(name, "TYPE_STRING", (-1,) if name.startswith("kv_cache") else (1,)) for name in PERF_FROM),
)
# LLM-API input -> the ensemble / BLS input with the same meaning (one request becomes a BLS row).
TO_TEXT_INPUTS: dict[str, str] = {
    "sampling_param_max_tokens": "max_tokens", "sampling_param_temperature": "temperature",
    "sampling_param_top_k": "top_k", "sampling_param_top_p": "top_p",
    "sampling_param_frequency_penalty": "frequency_penalty", "sampling_param_presence_penalty": "presence_penalty",
    "sampling_param_seed": "seed", "sampling_param_stop": "stop_words",
    "sampling_param_return_perf_metrics": "return_perf_metrics", "streaming": "stream", "lora_id": "lora_task_id",
    "lora_path": "lora_path",
}
DEFAULT_MAX_TOKENS = 32             # tensorrt_llm.SamplingParams.max_tokens
DEFAULT_EXCLUDE_INPUT = False       # NVIDIA's helpers.get_sampling_params_from_request default
LORA_INPUTS = ("lora_id", "lora_name", "lora_path")  # all or none (NVIDIA's helpers)
LORA_CKPT_SOURCES = ("hf", "nemo")
