"""``Tensor``: one declared input or output of a model config (name, Triton dtype, dims, flags).

Shared by the contract modules (``contract.py``: NVIDIA's inflight-batcher models; ``contract_llmapi.py``:
NVIDIA's LLM-API model). Library code: no Triton import.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # Triton config enum name, e.g. "TYPE_INT32"
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None  # () = NVIDIA's `reshape: { shape: [ ] }`
    ragged: bool = False  # allow_ragged_batch
    nvidia: bool = True   # False: ours, not in NVIDIA's config (see contract.ENGINE_WIRING)


def scalars(dtype: str, names: str, *, reshape=(), optional=True) -> list[Tensor]:
    return [Tensor(n, dtype, (1,), optional, reshape) for n in names.split()]
