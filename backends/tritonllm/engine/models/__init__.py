"""The architectures the engine serves: config.json's ``architectures`` name -> ``Architecture``.

Adding one: a file in this folder (its ``Architecture``: weight names, switches, what it refuses), a line
in ``ARCHITECTURES`` and the architecture in ``tests/unit/engine_helpers.make_checkpoint`` /
``test_engine_parity.ARCHS`` (greedy output equal to transformers' token for token).
"""
from .base import Architecture
from .gemma import GEMMA
from .llama import LLAMA
from .mistral import MISTRAL
from .phi3 import PHI3
from .qwen2 import QWEN2
from .qwen3 import QWEN3

ARCHITECTURES: dict[str, Architecture] = {a.hf_name: a for a in (LLAMA, MISTRAL, QWEN2, QWEN3, PHI3, GEMMA)}

__all__ = ["ARCHITECTURES", "Architecture"]
