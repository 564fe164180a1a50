"""Engine configuration: what the operator sets once per model (config.pbtxt parameters map onto it)."""
from __future__ import annotations

from dataclasses import dataclass, field

# Weight formats: fp8 (fp8.py), int8 per channel, int4 group-wise with zero points (AWQ / GPTQ style) or
# symmetric (quant.py).
QUANTIZATIONS = ("none", "fp8", "int8", "int4", "int4_sym")


@dataclass
class EngineConfig:
    """Capacity and scheduling knobs.

    Invariants: ``block_size`` >= 1; the KV pool holds ``max_kv_tokens`` tokens rounded down to whole
    blocks when set, else ``kv_mem_fraction`` of free device memory (CUDA) or of available RAM (CPU);
    ``max_num_tokens`` bounds the tokens computed in one step (prefill chunks + decodes);
    ``priority_aging_s`` >= 0: a waiting request's effective priority grows by 1 per that many seconds.
    """

    block_size: int = 16                 # tokens_per_block
    max_kv_tokens: int | None = None     # max_tokens_in_paged_kv_cache
    kv_mem_fraction: float = 0.9         # kv_cache_free_gpu_mem_fraction
    max_num_tokens: int = 512            # per-step token budget
    max_num_seqs: int = 64               # running batch bound
    max_queue_size: int = 1024           # waiting requests bound; beyond it add_request raises QueueFull
    enable_chunked_prefill: bool = True  # enable_chunked_context
    enable_prefix_caching: bool = False  # enable_kv_cache_reuse
    priority_aging_s: float = 30.0       # waiting this long adds 1 to a request's priority; 0 = no aging
    max_draft_len: int = 0               # speculative decoding: draft tokens per step (0 = off)
    draft_model_path: str | None = None  # drafts from this smaller checkpoint; None = prompt lookup (n-grams)
    ngram_max: int = 3                   # longest n-gram matched for a draft
    max_input_len: int | None = None     # defaults to the checkpoint's context length
    max_seq_len: int | None = None       # prompt + output; defaults to the checkpoint's context length
    device: str = "auto"                 # auto | cpu | cuda[:N]
    dtype: str = "auto"                  # auto | float32 | bfloat16 | float16
    num_threads: int = 0                 # torch intra-op threads on CPU; 0 keeps torch's default
    tokenizer_dir: str | None = None     # for guided decoding; defaults to the checkpoint directory
    quantization: str = "none"           # none | fp8 | int8 | int4 | int4_sym (weights; see quant.py, fp8.py)
    quant_group_size: int = 32           # int4: weights per scale / zero point along the input (32 | 64 | 128)
    fp8_matmul: str = "auto"             # auto (scaled FP8 on SM >= 8.9, else dequant) | scaled | dequant
    kv_cache_dtype: str = "auto"         # auto (= compute dtype) | fp8 | int8 (per token and head scales)
    cpu_kernels: str = "auto"            # auto (native AVX2 kernels for fp32 on CPU) | native | torch
    lora_adapters: dict[int, str] = field(default_factory=dict)  # lora_task_id -> PEFT adapter folder

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("tokens_per_block must be >= 1")
        if self.max_num_tokens < 1:
            raise ValueError("max_num_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_sequences must be >= 1")
        if self.max_queue_size < 0:
            raise ValueError("max_queue_size must be >= 0")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.quant_group_size not in (32, 64, 128):
            raise ValueError(f"quant_group_size must be 32, 64 or 128, got {self.quant_group_size}")
        if self.kv_cache_dtype not in ("auto", "fp8", "int8"):
            raise ValueError(f"kv_cache_dtype must be auto, fp8 or int8, got {self.kv_cache_dtype!r}")
        if self.cpu_kernels not in ("auto", "native", "torch"):
            raise ValueError(f"cpu_kernels must be auto, native or torch, got {self.cpu_kernels!r}")
        if not 0.0 <= self.priority_aging_s < float("inf"):
            raise ValueError(f"priority_aging_s must be finite and >= 0, got {self.priority_aging_s}")
        if not 0.0 < self.kv_mem_fraction <= 1.0:
            raise ValueError("kv_cache_free_gpu_mem_fraction must be in (0, 1]")
