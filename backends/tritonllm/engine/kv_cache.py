"""Paged KV cache: a pool of fixed-size blocks and the tensors that hold them.

Invariants (checked by tests):
- a block id is either in the free list (ref count 0) or referenced (ref count >= 1), never both;
- ``num_free + sum(1 for referenced blocks) == num_blocks`` at all times;
- a request's block table covers ceil(num_computed_tokens / block_size) blocks at least, and its token at
  position p lives in slot ``table[p // block_size] * block_size + p % block_size``.
"""
from __future__ import annotations

from collections import deque

import torch


class NoFreeBlocks(RuntimeError):
    """Raised by BlockPool.allocate when fewer blocks are free than asked for; nothing is allocated."""


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache must hold at least one block")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise NoFreeBlocks(f"asked for {n} blocks, {len(self._free)} free")
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._refs[b] = 1
        return out

    def ref(self, block: int) -> None:
        self._refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        # Released in reverse so the tail of a sequence (least likely shared) is reused first.
        for b in reversed(blocks):
            if self._refs[b] <= 0:
                raise RuntimeError(f"double free of KV block {b}")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)

    def ref_count(self, block: int) -> int:
        return self._refs[block]


class KVCache:
    """Per-layer K and V tensors of shape [num_blocks * block_size, kv_heads, head_dim] (flat slots)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (num_blocks * block_size, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
