"""Qwen3 (``Qwen3ForCausalLM``): RMSNorm of each head's q and k before RoPE; no q/k/v biases by default."""
from .base import Architecture

QWEN3 = Architecture("Qwen3ForCausalLM", qk_norm=True, sliding_window_switch="use_sliding_window")
