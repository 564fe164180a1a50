"""A prompt's KV blocks out of one engine and into another (disaggregated prefill / decode).

The unit moved is a run of *full* prompt blocks under their chained prefix-cache hashes
(``kv_cache.block_hash``): exactly what ``KVCacheManager.match_prefix`` looks up. So an imported prefix is
used the ordinary way: the decode engine admits the request, the prefix match takes the imported blocks,
and only the rest of the prompt (at least its last token, whose logits are needed) is computed there.
Nothing here changes what a request computes; a block that fails to arrive is recomputed.

Invariants:
- Both functions run on the engine's own thread (``EngineRunner.call``): the blocks and the KV tensors are
  not locked. Blocks are reached through the engine's ``KVCacheManager`` only.
- ``export_prefix`` copies the blocks (the copy is the transfer buffer), so the exporting engine may
  evict or reuse them the moment it returns.
- ``import_prefix`` leaves every imported block cached and free (ref count 0, most recently used end of
  the LRU list): the next admission of the same prompt takes them. The pool's invariants hold throughout
  (its allocation counters count the imported blocks). Blocks already cached under the same hash are kept,
  not overwritten.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_cache import KVCache, prefix_hashes
from .kv_manager import KVCacheManager


@dataclass
class KVPrefix:
    """Full prompt blocks as one tensor [num_layers, 2 (K, V), num_blocks * block_size, kv_heads, head_dim]."""
    hashes: list[int]
    data: torch.Tensor

    @property
    def num_blocks(self) -> int:
        return len(self.hashes)


def layout(kv: KVCache, num_blocks: int) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of the KVPrefix.data of ``num_blocks`` blocks of this cache."""
    slots, heads, dim = kv.k[0].shape
    del slots
    return (len(kv.k), 2, num_blocks * kv.block_size, heads, dim), kv.k[0].dtype


def _slots(blocks: list[int], block_size: int, device) -> torch.Tensor:
    base = torch.tensor(blocks, dtype=torch.long, device=device)[:, None] * block_size
    return (base + torch.arange(block_size, device=device)).reshape(-1)


def export_prefix(manager: KVCacheManager, kv: KVCache, prompt_ids: list[int],
                  root: int | None = None) -> KVPrefix:
    """Copies the longest cached run of the prompt's reusable blocks (possibly none)."""
    run = manager.cached_prefix(prompt_ids, root)
    hashes, blocks = [h for h, _ in run], [b for _, b in run]
    shape, dtype = layout(kv, len(blocks))
    if not blocks:
        return KVPrefix([], torch.empty(shape, dtype=dtype))
    idx = _slots(blocks, kv.block_size, kv.k[0].device)
    data = torch.stack([torch.stack((k.index_select(0, idx), v.index_select(0, idx))) for k, v in zip(kv.k, kv.v)])
    return KVPrefix(hashes, data.cpu().contiguous())


def import_prefix(manager: KVCacheManager, kv: KVCache, prompt_ids: list[int], prefix: KVPrefix,
                  root: int | None = None) -> int:
    """Writes the prefix's blocks into free blocks of this cache and publishes them; returns blocks written.

    Stops at the first hash that does not match this prompt's own chain (another prompt's KV is never
    installed), or when as many blocks as were free at the start are written (more would evict the
    prefix's own first blocks, which sit at the least recently used end of what was written)."""
    shape, dtype = layout(kv, prefix.num_blocks)
    if tuple(prefix.data.shape) != shape or prefix.data.dtype != dtype:
        raise ValueError(f"KV layout {tuple(prefix.data.shape)} {prefix.data.dtype} does not match this engine's "
                         f"{shape} {dtype}")
    bs = kv.block_size
    expected = prefix_hashes(prompt_ids, bs, root)
    written, parent, room = 0, root, manager.num_free
    for i, h in enumerate(prefix.hashes):
        if i >= len(expected) or expected[i] != h:
            break
        if not manager.is_cached(h):
            if written == room:
                break
            src = prefix.data[:, :, i * bs:(i + 1) * bs].to(kv.k[0].device)

            def write(b: int, src=src) -> None:
                for layer, (k, v) in enumerate(zip(kv.k, kv.v)):
                    k[b * bs:(b + 1) * bs] = src[layer, 0]
                    v[b * bs:(b + 1) * bs] = src[layer, 1]

            manager.adopt(h, parent, prompt_ids[i * bs:(i + 1) * bs], write, root)
            written += 1
        parent = h
    return written
