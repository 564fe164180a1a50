"""Every ``parameters`` key NVIDIA's C++ ``tensorrtllm`` backend reads, as one table (no renderer: the
leading underscore keeps ``render_configs.discover_profiles`` from taking this for a profile).

Read from NVIDIA's source, not run (TensorRT-LLM cannot be installed on these machines):
NVIDIA/TensorRT-LLM ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc`` at commit
0c8de69a1ca6213eebb20a51873890ff128666c2 (the last version before PR #15907 removed the backend; the
same keys at the same lines as triton-inference-server/tensorrtllm_backend c2e65b88, its 1.0 release)
and ``model_state.cc`` at 5cdd69218f8815d6c8c101ca1facf2ec4ac4b622.

How the backend reads them (``ModelState::GetParameter<T>``, model_state.cc:248-334): a missing key
throws "Cannot find parameter with name: <key>". Most reads sit in ``try {} catch`` and fall back to a
default, so for them a missing key, ``""`` and an unfilled ``${...}`` placeholder all mean "unset".
``required=True`` marks the reads with no such fallback: without the key the model instance is not
created. For ``tokenizer_dir`` / ``xgrammar_tokenizer_info_path`` / ``guided_decoding_backend`` only the
key must exist; an empty value turns guided decoding off (model_instance_state.cc:424-427).
"""
from __future__ import annotations

from typing import NamedTuple

MIS = "model_instance_state.cc"
MS = "model_state.cc"


class BackendParam(NamedTuple):
    key: str
    source: str          # file:line of the GetParameter call
    required: bool = False
    default: str = ""    # the backend's own default when unset ("" = the executor's or none)


PARAMS: tuple[BackendParam, ...] = (
    BackendParam("gpt_model_type", f"{MIS}:62", required=True),  # and V1 | inflight_(fused_)batching only
    BackendParam("max_tokens_in_paged_kv_cache", f"{MIS}:86"),
    BackendParam("kv_cache_free_gpu_mem_fraction", f"{MIS}:99", default="0.9"),
    BackendParam("cross_kv_cache_fraction", f"{MIS}:112"),
    BackendParam("kv_cache_host_memory_bytes", f"{MIS}:123", default="0"),
    BackendParam("kv_cache_onboard_blocks", f"{MIS}:133", default="true"),
    BackendParam("max_attention_window_size", f"{MIS}:144"),
    BackendParam("sink_token_length", f"{MIS}:157"),
    BackendParam("enable_kv_cache_reuse", f"{MIS}:170", default="true"),
    BackendParam("multi_block_mode", f"{MIS}:194", default="true"),
    BackendParam("enable_context_fmha_fp32_acc", f"{MIS}:205", default="false"),
    BackendParam("cuda_graph_mode", f"{MIS}:216", default="false"),
    BackendParam("cuda_graph_cache_size", f"{MIS}:227", default="0"),
    BackendParam("num_nodes", f"{MIS}:276", default="1"),
    BackendParam("lora_cache_max_adapter_size", f"{MIS}:305", default="64"),
    BackendParam("lora_cache_optimal_adapter_size", f"{MIS}:315", default="8"),
    BackendParam("lora_cache_gpu_memory_fraction", f"{MIS}:324", default="0.05"),
    BackendParam("lora_cache_host_memory_bytes", f"{MIS}:333", default="1073741824"),
    BackendParam("lora_prefetch_dir", f"{MIS}:342"),
    BackendParam("batch_scheduler_policy", f"{MIS}:360", default="guaranteed_no_evict"),
    BackendParam("speculative_decoding_fast_logits", f"{MIS}:390", default="false"),
    BackendParam("tokenizer_dir", f"{MIS}:413", required=True),
    BackendParam("xgrammar_tokenizer_info_path", f"{MIS}:414", required=True),
    BackendParam("guided_decoding_backend", f"{MIS}:415", required=True),
    BackendParam("max_beam_width", f"{MIS}:462", default="1"),
    BackendParam("iter_stats_max_iterations", f"{MIS}:473", default="1000"),
    BackendParam("request_stats_max_iterations", f"{MIS}:485", default="0"),
    BackendParam("enable_trt_overlap", f"{MIS}:497", default="false"),
    BackendParam("normalize_log_probs", f"{MIS}:506", default="true"),
    BackendParam("enable_chunked_context", f"{MIS}:521", default="false"),
    BackendParam("decoding_mode", f"{MIS}:548"),
    BackendParam("medusa_choices", f"{MIS}:598"),
    BackendParam("eagle_choices", f"{MIS}:613"),
    BackendParam("lookahead_window_size", f"{MIS}:632"),            # required when decoding_mode=lookahead
    BackendParam("lookahead_ngram_size", f"{MIS}:633"),
    BackendParam("lookahead_verification_set_size", f"{MIS}:634"),
    BackendParam("gpu_weights_percent", f"{MIS}:652", default="1.0"),
    BackendParam("recv_poll_period_ms", f"{MIS}:685", default="0"),
    BackendParam("gpt_model_path", f"{MIS}:748"),        # this or encoder_model_path must exist (:773)
    BackendParam("encoder_model_path", f"{MIS}:762"),
    BackendParam("exclude_input_in_output", f"{MIS}:802", default="false"),
    BackendParam("cancellation_check_period_ms", f"{MIS}:814", default="100"),
    BackendParam("stats_check_period_ms", f"{MIS}:826", default="100"),
    BackendParam("gpu_device_ids", f"{MS}:97"),
    BackendParam("participant_ids", f"{MS}:124"),
    BackendParam("executor_worker_path", f"{MS}:183"),   # orchestrator mode only
)
BY_KEY = {p.key: p for p in PARAMS}
REQUIRED = tuple(p.key for p in PARAMS if p.required)
# In NVIDIA's template (all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt:617) but read by no C++
# code; kept because NVIDIA's configs always carry it.
TEMPLATE_ONLY = ("FORCE_CPU_ONLY_INPUT_TENSORS",)
