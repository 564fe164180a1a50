"""KVCacheManager: the one owner of a BlockPool's blocks (vLLM v1's seam: the scheduler asks it for slots, it
never touches the pool). Everything else that reaches the blocks goes through it too: the prefix transfer
between engines (``kv_transfer``: ``cached_prefix`` / ``adopt``), KV event listeners (``subscribe``) and the
load figures (``num_free`` / ``num_blocks`` / ``alloc_counts``).

Invariants:
- a block list it extends (``Request.block_table``, or a drafter's list) holds exactly the blocks it handed
  out, each counted once in the pool's reference counts; ``free`` gives every one back;
- ``Request.block_hashes[i]`` is the chained hash (``kv_cache.block_hash``, rooted at ``Request.lora_root``) of block
  i, recorded only once block i is full and computed, and then published in the prefix cache;
- a prefix match shares whole cached blocks only (ref count + 1 each) and always leaves at least the last
  prompt token to compute, because its logits are needed.
"""
from __future__ import annotations

from typing import Callable

from .kv_cache import BlockPool, NoFreeBlocks, block_hash, iter_prefix_hashes
from .request import Request


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool = False) -> None:
        self.pool = pool
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def alloc_counts(self) -> tuple[int, int]:
        """(blocks handed out so far, of which fresh rather than evicted from the prefix cache)."""
        return self.pool.num_alloc_total, self.pool.num_alloc_new

    def subscribe(self, listener: Callable[[tuple], None] | None) -> None:
        """KV events on the engine thread: ("stored", hash, parent, tokens) when a block enters the prefix
        cache, ("removed", hash) when a cached block is reused (Dynamo's router); None unsubscribes."""
        self.pool.listener = listener

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate_slots(self, blocks: list[int], num_tokens: int) -> bool:
        """Extends ``blocks`` in place until they hold ``num_tokens`` tokens; False (nothing taken) when the
        pool has too few free blocks."""
        need = self.blocks_for(num_tokens) - len(blocks)
        if need <= 0:
            return True
        try:
            blocks.extend(self.pool.allocate(need))
        except NoFreeBlocks:
            return False
        return True

    def match_prefix(self, req: Request) -> int:
        """Points a fresh request at the cached blocks of its longest cached prefix; returns the tokens
        reused (a multiple of the block size)."""
        for h in iter_prefix_hashes(req.token_ids, self.block_size, req.lora_root):
            b = self.pool.lookup(h)
            if b is None:
                break
            self.pool.take(b)
            req.block_table.append(b)
            req.block_hashes.append(h)
        return len(req.block_table) * self.block_size

    def cache_full_blocks(self, req: Request) -> None:
        """Publishes the request's blocks that became full and computed (prefix caching on)."""
        if not self.enable_prefix_caching or not req.block_table:
            return
        bs = self.block_size
        while len(req.block_hashes) < req.num_computed // bs:
            i = len(req.block_hashes)
            parent = req.block_hashes[-1] if i else req.lora_root
            tokens = req.token_ids[i * bs:(i + 1) * bs]
            h = block_hash(parent, tokens)
            self.pool.register(req.block_table[i], h, parent, tokens, req.lora_root)
            req.block_hashes.append(h)

    def cached_prefix(self, prompt_ids: list[int], root: int | None = None) -> list[tuple[int, int]]:
        """(hash, block) of the longest cached run of the prompt's reusable blocks, without taking them."""
        run = []
        for h in iter_prefix_hashes(prompt_ids, self.block_size, root):
            b = self.pool.lookup(h)
            if b is None:
                break
            run.append((h, b))
        return run

    def is_cached(self, h: int) -> bool:
        return self.pool.lookup(h) is not None

    def adopt(self, h: int, parent: int | None, tokens: list[int], write: Callable[[int], None],
              root: int | None = None) -> None:
        """A block computed elsewhere: a free block is filled by ``write(block)``, published under ``h`` and left
        cached and idle (the most recently used end of the LRU list), as a finished request leaves its blocks.
        Raises NoFreeBlocks when none is free."""
        (b,) = self.pool.allocate(1)
        try:
            write(b)
            self.pool.register(b, h, parent, tokens, root)
        finally:
            self.pool.release([b])

    def purge(self, root: int) -> int:
        """Drops from the prefix cache every block of an adapter that left (its ``root``); returns how many."""
        return self.pool.purge(root)

    def release(self, blocks: list[int]) -> None:
        """Gives back blocks it handed out (a drafter's list)."""
        self.pool.release(blocks)

    def free(self, req: Request) -> None:
        self.release(req.block_table)
        req.block_table = []
        req.block_hashes = []
