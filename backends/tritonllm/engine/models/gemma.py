"""Gemma (``GemmaForCausalLM``, Gemma 1): RMSNorm scales by (1 + weight), embeddings are multiplied by
sqrt(hidden_size), the gated MLP uses GELU (tanh approximation as transformers' ``gelu_pytorch_tanh``, or
exact ``gelu``), embeddings tied to the LM head. Gemma 2 / 3 (logit soft-capping, extra norms, alternating
sliding windows) are other architectures, not served yet."""
from .base import Architecture

GEMMA = Architecture("GemmaForCausalLM", norm_offset=1.0, embed_scale=True,
                     activations=(("gelu_pytorch_tanh", "gelu_tanh"), ("gelu", "gelu")))
