"""Paged KV cache: a pool of fixed-size blocks and the tensors that hold them.

Invariants (checked by tests):
- a block id is either in the free list (ref count 0) or referenced (ref count >= 1), never both;
- ``num_free + sum(1 for referenced blocks) == num_blocks`` at all times;
- a request's block table covers ceil(num_computed_tokens / block_size) blocks at least, and its token at
  position p lives in slot ``table[p // block_size] * block_size + p % block_size``.
Prefix caching (``enable_kv_cache_reuse``): a full block whose KV is computed may be registered under the
hash of its tokens chained with the hashes of all blocks before it. A released block keeps its hash while
it sits in the free list, ordered least recently used first; allocation takes the LRU block and evicts its
hash, and a prefix hit takes a cached block back out of the free list (ref count 0 -> 1) or shares it
(ref count + 1). A block is in ``_cached`` iff ``_hash_of`` has it, and a hash maps to one block.
A cached block of a LoRA adapter's requests also records the adapter's root (``_root_of``), so ``purge`` can
drop them all when the adapter leaves: they could never be matched again, and would only age out.
``num_alloc_total`` / ``num_alloc_new`` count allocated blocks since start, the latter those that held no
cached prefix (TensorRT-LLM's allocTotalBlocks / allocNewBlocks).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch


class NoFreeBlocks(RuntimeError):
    """Raised by BlockPool.allocate when fewer blocks are free than asked for; nothing is allocated."""


def block_hash(parent: int | None, tokens) -> int:
    """128-bit content hash of a block's tokens chained to its prefix (collisions would corrupt outputs,
    so not Python's 64-bit hash)."""
    data = np.asarray(tokens, dtype=np.int64).tobytes()
    prefix = (parent or 0).to_bytes(16, "little")
    return int.from_bytes(hashlib.blake2b(prefix + data, digest_size=16).digest(), "little")


def iter_prefix_hashes(token_ids, block_size: int, root: int | None = None):
    """Chained hashes of the blocks a prefix match may reuse, lazily (a caller that stops at the first miss
    hashes no further): every full block except the one holding the last token, whose logits are needed.
    ``root``: the parent of the first block, None for the base model, the LoRA adapter's ``root`` for its
    requests (whose KV differs from the base model's for the same tokens)."""
    parent = root
    for i in range((len(token_ids) - 1) // block_size):
        parent = block_hash(parent, token_ids[i * block_size:(i + 1) * block_size])
        yield parent


def prefix_hashes(token_ids, block_size: int, root: int | None = None) -> list[int]:
    return list(iter_prefix_hashes(token_ids, block_size, root))


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache must hold at least one block")
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks
        self._cached: dict[int, int] = {}     # hash -> block
        self._hash_of: dict[int, int] = {}    # block -> hash
        self._root_of: dict[int, int] = {}    # cached block -> its chain's LoRA root (base-model blocks: absent)
        self.num_alloc_total = 0
        self.num_alloc_new = 0
        # KV events (e.g. Dynamo's router): called on the engine thread with ("stored", hash, parent,
        # tokens) when a block enters the prefix cache and ("removed", hash) when a cached block is reused.
        self.listener = None

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise NoFreeBlocks(f"asked for {n} blocks, {len(self._free)} free")
        out = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            if b in self._hash_of:
                self._forget(b)
            else:
                self.num_alloc_new += 1
            self._refs[b] = 1
            out.append(b)
        self.num_alloc_total += n
        return out

    def release(self, blocks: list[int]) -> None:
        # Released in reverse so a sequence's tail (least likely shared) is evicted first.
        for b in reversed(blocks):
            if self._refs[b] <= 0:
                raise RuntimeError(f"double free of KV block {b}")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def lookup(self, h: int) -> int | None:
        return self._cached.get(h)

    def take(self, block: int) -> None:
        """Adds a reference to a cached block (a prefix hit), taking it out of the free list if idle."""
        if self._refs[block] == 0:
            del self._free[block]
        self._refs[block] += 1

    def register(self, block: int, h: int, parent: int | None = None, tokens=None, root: int | None = None) -> None:
        """Publishes a full, computed block under its chained hash (first writer wins); ``parent`` and
        ``tokens`` only feed the listener; ``root`` is the chain's LoRA root (None: the base model)."""
        if h not in self._cached and block not in self._hash_of:
            self._cached[h] = block
            self._hash_of[block] = h
            if root is not None:
                self._root_of[block] = root
            if self.listener is not None:
                self.listener(("stored", h, parent, tuple(tokens or ())))

    def purge(self, root: int) -> int:
        """Unpublishes every cached block of the chains rooted at ``root`` (an adapter that left); the idle ones
        move to the least recently used end of the free list, to be taken first. Returns how many."""
        blocks = [b for b, r in self._root_of.items() if r == root]
        for b in blocks:
            self._forget(b)
            if self._refs[b] == 0:
                self._free.move_to_end(b, last=False)
        return len(blocks)

    def _forget(self, block: int) -> None:
        h = self._hash_of.pop(block)
        del self._cached[h]
        self._root_of.pop(block, None)
        if self.listener is not None:
            self.listener(("removed", h))


def kv_layout(kv_cache_dtype: str, dtype: torch.dtype, head_dim: int) -> tuple[torch.dtype, int]:
    """(storage dtype, row width) of one head's K or V in the cache: ``auto`` the compute dtype; ``fp8``
    float8_e4m3fn bits in uint8 (torch's CPU index_copy_ has no float8 kernel); ``int8`` codes of the row
    scaled by its own amax / 127, the fp32 scale in 4 more bytes of the row (per token and head: no
    calibration, and one outlier token costs only its own precision); ``fp16`` half the bytes of fp32 rows, the
    form llama.cpp keeps by default."""
    if kv_cache_dtype == "fp8":
        return torch.uint8, head_dim
    if kv_cache_dtype == "int8":
        return torch.int8, head_dim + 4
    if kv_cache_dtype == "fp16":
        return torch.float16, head_dim
    return dtype, head_dim


class KVCache:
    """Per-layer K and V tensors of shape [num_blocks * block_size, kv_heads, row width] (flat slots; the
    row width is head_dim, or more for a layout that keeps scales in the row: ``kv_layout``)."""

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
