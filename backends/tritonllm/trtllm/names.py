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
  ``BaseLLM.__init__`` refuses any key that is not a model field ("LLM got invalid argument", llm.py@4c05a74);
  a QuantConfig that does reach the PyTorch loader is ignored with a warning (``CachedModelLoader.__call__``,
  llm_utils.py@0066b2a). Quantized weights therefore come from a pre-quantized checkpoint: ``QuantAlgo`` /
  ``quant_method`` below are what ``build_scripts/profiles/_quant_checkpoint.py`` reads a checkpoint folder
  into, the way ``ModelLoader._update_from_hf_quant_config`` and ``ModelConfig.load_hf_quant_config`` do.
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
# Quantized checkpoints (build_scripts/profiles/_quant_checkpoint.py; docs/quantization.md, last section)
LLM_UTILS_PY = f"{_REPO} tensorrt_llm/llmapi/llm_utils.py@0066b2a5696f5819dc4c98befa25e957e6e24fe5"
MODEL_CONFIG_PY = f"{_REPO} tensorrt_llm/_torch/model_config.py@008e0af8980fc560003631ba4ac37828836a91c8"
QUANT_CONFIG_UTILS_PY = f"{_REPO} tensorrt_llm/models/quant_config_utils.py@21156a7a57acd21e17feb5c2721c30f035e0f2af"
MODELOPT_CONFIG_PY = f"{_REPO} tensorrt_llm/quantization/modelopt_config.py@2edf354d4b92161efd50b10b71e8e20fb6c5925a"
LINEAR_PY = f"{_REPO} tensorrt_llm/_torch/modules/linear.py@00bbf71e796406ea8593a77cbfb828356182db16"
GPTQ_PR_PY = (f"{_REPO} tensorrt_llm/_torch/models/checkpoints/hf/gptq.py@cec694d850a5b165389fc92259927a7ee3ebd45e"
              " (PR #19442, open when read)")
LLAMA_CONVERT_PY = f"{_REPO} examples/models/core/llama/convert_checkpoint.py@368f8f2ade001e8fcb955be39e4812f918d7fb92"
QUANTIZE_PY = (f"{_REPO} examples/quantization/quantize.py@059c97c10c12e948e91676c8db3c9f137b0a2389"
               " (same choices plus fp8_pc_pt @c8c6df08)")
QUANTIZE_BY_MODELOPT_PY = (f"{_REPO} tensorrt_llm/quantization/quantize_by_modelopt.py"
                           "@042c510d33e3ba07ac0e3d1ef810b82198b90e0c")
SUPPORT_MATRIX_MD = f"{_REPO} docs/source/reference/support-matrix.md@9b062a8325a134de7966e9131984f8b2037c2ed6"

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
    # QuantAlgo members a checkpoint is read into or refused by (the enum's values are its names)
    "QuantAlgo": (MODEL_CONFIG_PY + "; " + LINEAR_PY + " (get_quant_method); " + QUANTIZE_BY_MODELOPT_PY + "; "
                  + LLAMA_CONVERT_PY, frozenset({
                      "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_BLOCK_SCALES", "NVFP4", "NVFP4_ARC", "MXFP8",
                      "W4A8_NVFP4_FP8", "W4A8_MXFP4_FP8", "W4A8_MXFP4_MXFP8", "W4A16_MXFP4", "W8A16", "W4A16",
                      "W4A16_AWQ", "W4A8_AWQ", "W4A16_GPTQ", "W8A16_GPTQ", "W8A8_SQ_PER_CHANNEL",
                      "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
                      "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN",
                      "W4A8_QSERVE_PER_GROUP", "W4A8_QSERVE_PER_CHANNEL", "INT8", "MIXED_PRECISION", "NO_QUANT"})),
    # quantization_config.quant_method values the PyTorch loader has a branch for ("modelopt": prefix match)
    "quant_method": (LLM_UTILS_PY + " (_update_from_hf_quant_config); " + MODEL_CONFIG_PY + " (load_hf_quant_config)",
                     frozenset({"fp8", "mxfp4", "mxfp8", "compressed-tensors", "nvfp4", "modelopt"})),
    # examples/quantization/quantize.py --qformat choices (the legacy engine path)
    "qformat": (QUANTIZE_PY, frozenset({"nvfp4", "fp8", "fp8_pc_pt", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo",
                                        "int4_wo", "full_prec"})),
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
