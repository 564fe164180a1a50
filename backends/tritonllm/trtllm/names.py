"""Every ``tensorrt_llm`` name our LLM API runner uses, in ONE table, each group citing the NVIDIA source it
was read from (NVIDIA/TensorRT-LLM ``path@commit``). TensorRT-LLM cannot be installed on the development
machines: these names were read from NVIDIA's source, never run here.

Invariant: ``llmapi_runner`` / ``llmapi_outputs`` / ``llmapi_settings`` use no tensorrt_llm name outside this
table -- every kwarg dict they build passes ``kwargs(kind, d)`` and every attribute they read goes
through ``attr(obj, kind, path)``, both of which raise ``UnknownName`` for a name not listed here, and
the profile renders only ``LLM(...)`` arguments listed here. The unit tests compare the table with the
fields transcribed from the sources (tests/unit/test_llmapi_runner.py).

Version notes (what the sources say; not verified against a running TensorRT-LLM):
- ``quant_config`` is not an ``LLM(...)`` argument of the PyTorch backend: in ``TorchLlmArgs`` it is a
  private attribute behind a property (llm_args.py@0004396, ``_quant_config = PrivateAttr``), and
  ``BaseLLM.__init__`` refuses any key that is not a model field ("LLM got invalid argument", llm.py@4c05a74).
  FP8 weights therefore come from a pre-quantized (ModelOpt) checkpoint, e.g. nvidia/Llama-3.1-8B-Instruct-FP8.
- ``SamplingParams`` takes stop / bad words as strings (tokenized by TensorRT-LLM) or as *single* token ids
  (``stop_token_ids`` / ``bad_token_ids``); token-id sequences have no public field (``_stop_word_ids`` is
  ``init=False``), so the runner matches multi-token stop words itself (llmapi_outputs.StopMatcher).
- The iteration-stats keys are those of the executor's JSON (``get_stats`` returns the parsed dicts;
  older versions return the JSON strings, which the runner parses).
"""
from __future__ import annotations

from typing import Any

_REPO = "NVIDIA/TensorRT-LLM"
LLM_PY = f"{_REPO} tensorrt_llm/llmapi/llm.py@4c05a74891e4df8066f08ed4ce14b0972abe4e25"
LLM_ARGS_PY = f"{_REPO} tensorrt_llm/llmapi/llm_args.py@0004396720054fd8e205cbf616f21f0b57c6b412"
LLMAPI_INIT = f"{_REPO} tensorrt_llm/llmapi/__init__.py@036a60f7ff9257595c96a578560651da5c4df577"
SAMPLING_PY = f"{_REPO} tensorrt_llm/sampling_params.py@a98a9061d72f6fd39f5d055ebdd2c6878a100e2c"
RESULT_PY = f"{_REPO} tensorrt_llm/executor/result.py@a678b91aafbeff265cd0b764abb59d7def624ac2"
JSON_CPP = f"{_REPO} cpp/tensorrt_llm/executor/jsonSerialization.cpp@092229bb6e1ce6e7f0db2ba010b7fdaf654e1549"
TRITON_LLMAPI = f"{_REPO} triton_backend/all_models/llmapi/tensorrt_llm/1/"
MODEL_PY = f"{TRITON_LLMAPI}model.py@044a90d209e380c95e23e8ae42f3583fa05ada78"

# kind -> (where it was read, names). Dotted names are attribute paths.
TABLE: dict[str, tuple[str, frozenset[str]]] = {
    # module -> the attributes imported from it
    "import tensorrt_llm": (LLM_PY + "; " + SAMPLING_PY, frozenset({"LLM", "SamplingParams"})),
    "import tensorrt_llm.llmapi": (LLMAPI_INIT, frozenset({"KvCacheConfig"})),
    # LLM(**kwargs): BaseLlmArgs / TorchLlmArgs model fields (BaseLLM.__init__ refuses other keys)
    "LLM": (LLM_ARGS_PY + " (BaseLlmArgs ~212k, TorchLlmArgs ~243k-262k); " + LLM_PY + " (BaseLLM.__init__)",
            frozenset({"model", "backend", "tensor_parallel_size", "pipeline_parallel_size", "kv_cache_config",
                       "enable_chunked_prefill", "max_batch_size", "max_num_tokens", "max_seq_len",
                       "trust_remote_code", "enable_iter_perf_stats"})),
    "LLM method": (LLM_PY, frozenset({"generate_async", "get_stats", "shutdown"})),
    "generate_async": (LLM_PY + " (generate_async(inputs, sampling_params=None, lora_request=None, "
                       "prompt_adapter_request=None, streaming=False, ...))",
                       frozenset({"sampling_params", "lora_request", "streaming"})),
    "get_stats": (LLM_PY + " (get_stats(timeout=2) -> List[dict])", frozenset({"timeout"})),
    "KvCacheConfig": (LLM_ARGS_PY + " (KvCacheConfig ~180k)",
                      frozenset({"free_gpu_memory_fraction", "enable_block_reuse", "dtype", "max_tokens"})),
    "SamplingParams": (SAMPLING_PY, frozenset({
        "max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "presence_penalty",
        "frequency_penalty", "min_tokens", "seed", "end_id", "ignore_eos", "stop_token_ids", "bad_token_ids",
        "include_stop_str_in_output", "logprobs", "return_perf_metrics", "exclude_input_from_output",
        "detokenize"})),
    # the result of generate_async (RequestOutput(GenerationResult)); async iteration yields itself
    "RequestOutput": (RESULT_PY + " (GenerationResult); " + LLM_PY + " (RequestOutput)",
                      frozenset({"outputs", "finished", "abort"})),
    "CompletionOutput": (RESULT_PY, frozenset({
        "token_ids_diff", "logprobs_diff", "finish_reason", "stop_reason", "cumulative_logprob",
        "request_perf_metrics"})),
    "Logprob": (RESULT_PY + " (Logprob; PyTorch logprobs are dicts token id -> Logprob)", frozenset({"logprob"})),
    "finish_reason": (RESULT_PY + " (CompletionOutput.finish_reason Literal)",
                      frozenset({"stop", "length", "timeout", "cancelled"})),
    "RequestPerfMetrics": (MODEL_PY + " L686-770 (NVIDIA's llmapi model reads these paths)", frozenset({
        "kv_cache_metrics.num_total_allocated_blocks", "kv_cache_metrics.num_new_allocated_blocks",
        "kv_cache_metrics.num_reused_blocks", "timing_metrics.arrival_time",
        "timing_metrics.first_scheduled_time", "timing_metrics.first_token_time",
        "timing_metrics.last_token_time", "speculative_decoding.total_draft_tokens",
        "speculative_decoding.total_accepted_draft_tokens"})),
    # LLM.get_stats(timeout) entries: the executor's IterationStats JSON
    "IterationStats": (JSON_CPP, frozenset({
        "timestamp", "iter", "iterLatencyMS", "numActiveRequests", "numQueuedRequests", "maxNumActiveRequests",
        "gpuMemUsage", "cpuMemUsage", "pinnedMemUsage",
        "kvCacheStats.maxNumBlocks", "kvCacheStats.freeNumBlocks", "kvCacheStats.usedNumBlocks",
        "kvCacheStats.tokensPerBlock", "kvCacheStats.reusedBlocks",
        "inflightBatchingStats.numScheduledRequests", "inflightBatchingStats.numContextRequests",
        "inflightBatchingStats.numGenRequests", "inflightBatchingStats.numPausedRequests",
        "inflightBatchingStats.numCtxTokens", "inflightBatchingStats.microBatchId"})),
}


class UnknownName(KeyError):
    """A tensorrt_llm name that is not in ``TABLE`` (a bug in the runner, never a request error)."""


def fields(kind: str) -> frozenset[str]:
    return TABLE[kind][1]


def source(kind: str) -> str:
    return TABLE[kind][0]


def check(kind: str, names) -> None:
    unknown = sorted(set(names) - fields(kind))
    if unknown:
        raise UnknownName(f"{kind}: {unknown} not in tritonllm.trtllm.names.TABLE")


def kwargs(kind: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` after checking every key against the table (returned as is)."""
    check(kind, values)
    return values


def attr(obj: Any, kind: str, path: str, default: Any = None) -> Any:
    """``obj.<path>`` (dotted) for a path in the table; ``default`` where an attribute is missing or None."""
    check(kind, (path,))
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return default
    return obj


def key(stats: dict, path: str, default: Any = 0) -> Any:
    """``stats[a][b]`` for an IterationStats key path ``a.b`` in the table."""
    check("IterationStats", (path,))
    for part in path.split("."):
        stats = stats.get(part) if isinstance(stats, dict) else None
        if stats is None:
            return default
    return stats


def module(kind: str, name: str):
    """``import <module>; <module>.<name>`` for an import listed in the table (lazily, at call time)."""
    import importlib

    check(kind, (name,))
    return getattr(importlib.import_module(kind.removeprefix("import ")), name)
