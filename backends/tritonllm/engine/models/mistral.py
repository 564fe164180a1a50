"""Mistral (``MistralForCausalLM``): Llama's layout; sliding_window applies whenever the config sets it."""
from .base import Architecture

MISTRAL = Architecture("MistralForCausalLM")
