"""Engine configuration: what the operator sets once per model (config.pbtxt parameters map onto it)."""
from __future__ import annotations

from dataclasses import dataclass, field

from typing import Callable

from .knobs import BY_FIELD, KNOBS, SPECULATIVE_MODES, KnobError, default

# prompt_lookup: n-gram drafts; draft_model (TensorRT-LLM: draft_tokens_external): the checkpoint in the
# `draft_model_path` parameter drafts.
DRAFT_MODEL_MODES = SPECULATIVE_MODES[1:]


@dataclass
class EngineConfig:
    """Capacity and scheduling knobs. Defaults and allowed values are the deployment knobs' (``knobs.KNOBS``).

    Invariants: ``block_size`` >= 1; the KV pool holds ``max_kv_tokens`` tokens rounded down to whole
    blocks when set, else ``kv_mem_fraction`` of free device memory (CUDA) or of available RAM (CPU);
    ``max_num_tokens`` bounds the tokens computed in one step (prefill chunks + decodes);
    ``priority_aging_s`` >= 0: a waiting request's effective priority grows by 1 per that many seconds.
    """

    block_size: int = default("block_size")                      # tokens_per_block
    max_kv_tokens: int | None = default("max_kv_tokens")         # max_tokens_in_paged_kv_cache
    kv_mem_fraction: float = default("kv_mem_fraction")          # kv_cache_free_gpu_mem_fraction
    max_num_tokens: int = default("max_num_tokens")              # per-step token budget
    max_num_seqs: int = default("max_num_seqs")                  # running batch bound
    max_queue_size: int = default("max_queue_size")              # beyond it add_request raises QueueFull
    enable_chunked_prefill: bool = default("enable_chunked_prefill")  # enable_chunked_context
    enable_prefix_caching: bool = default("enable_prefix_caching")    # enable_kv_cache_reuse
    priority_aging_s: float = default("priority_aging_s")
    max_draft_len: int = default("max_draft_len")                # speculative decoding (0 = off)
    draft_model_path: str | None = None  # drafts from this smaller checkpoint; None = prompt lookup (n-grams)
    ngram_max: int = default("ngram_max")
    max_input_len: int | None = default("max_input_len")
    max_seq_len: int | None = default("max_seq_len")
    device: str = default("device")                              # also cuda:N in code
    dtype: str = default("dtype")
    num_threads: int = default("num_threads")
    tokenizer_dir: str | None = None     # for guided decoding; defaults to the checkpoint directory
    quantization: str = default("quantization")
    quant_group_size: int = default("quant_group_size")
    activation_quantization: str = default("activation_quantization")
    guide_max_bytes: int = default("guide_max_bytes")
    guide_compile_timeout_s: float = default("guide_compile_timeout_s")
    guide_cache_bytes: int = default("guide_cache_bytes")
    fp8_matmul: str = default("fp8_matmul")
    kv_cache_dtype: str = default("kv_cache_dtype")
    cpu_kernels: str = default("cpu_kernels")
    lora_adapters: dict[int, str] = field(default_factory=dict)  # lora_task_id -> PEFT adapter folder
    max_loras: int = default("max_loras")
    lora_root: str | None = None  # the lora_root parameter, resolved: requests' lora_path folders live under it

    def __post_init__(self) -> None:
        for name, knob in BY_FIELD.items():
            if name == "device" and str(self.device).startswith("cuda:"):
                continue  # a chosen GPU: code only, deployment.yaml says cuda
            try:
                knob.check(getattr(self, name))
            except KnobError as e:
                raise ValueError(str(e)) from None


def engine_config_from_parameters(p: dict[str, str], resolve_path: Callable[[str, str], str] | None = None):
    """config.pbtxt / deployment.yaml parameters -> (EngineConfig, exclude_input_in_output), every knob parsed and
    checked by its row of ``knobs.KNOBS`` (ValueError naming the parameter). ``resolve_path(name, value)`` turns a
    path parameter into the path the engine opens (each front resolves against its own base: the model's folder
    in Triton, the repository for Dynamo); with it, the draft checkpoint is resolved for every mode that drafts
    from a model (``DRAFT_MODEL_MODES``: draft_model and TensorRT-LLM's draft_tokens_external alike)."""
    values = {knob.param: knob.parse(p.get(knob.param)) for knob in KNOBS}
    fields = {knob.field: values[knob.param] for knob in KNOBS if knob.field}
    if values["speculative_decoding_mode"] not in SPECULATIVE_MODES:
        fields["max_draft_len"] = 0
    config = EngineConfig(**fields)
    if resolve_path is not None and values["speculative_decoding_mode"] in DRAFT_MODEL_MODES:
        config.draft_model_path = resolve_path("draft_model_path", p.get("draft_model_path", ""))
    if resolve_path is not None and values["lora_root"]:
        config.lora_root = resolve_path("lora_root", values["lora_root"])
    return config, values["exclude_input_in_output"]
