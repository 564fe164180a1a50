"""Qwen2 / 2.5 (``Qwen2ForCausalLM``): biases on q, k and v; sliding window only with use_sliding_window."""
from .base import Architecture

QWEN2 = Architecture("Qwen2ForCausalLM", attention_bias=True, sliding_window_switch="use_sliding_window")
