"""Llama 2 / 3 / 3.1+ (``LlamaForCausalLM``): the reference layout every other file varies."""
from .base import Architecture

LLAMA = Architecture("LlamaForCausalLM")
