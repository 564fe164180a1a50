"""Iteration-level scheduler.

There are no prefill and decode phases: every request has ``token_ids`` (prompt + generated) and
``num_computed`` (tokens whose KV is cached); each step gives requests a number of new tokens to compute so
that ``num_computed`` catches up with ``len(token_ids)``, within a per-step token budget. A long prompt thus
prefills in chunks alongside decodes. Running requests are served first (oldest first); when KV blocks run
out, the newest running request is preempted (blocks freed, recomputed later from its tokens).
Idea after vLLM v1's scheduler; see vllm/v1/core/sched/scheduler.py.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from .config import EngineConfig
from .kv_cache import BlockPool, NoFreeBlocks, adapter_root, block_hash
from .request import Request, Status


@dataclass
class ScheduledStep:
    items: list[tuple[Request, int]]       # (request, new tokens computed this step), in batch order
    preempted: list[Request]


class Scheduler:
    def __init__(self, config: EngineConfig, pool: BlockPool) -> None:
        self.config = config
        self.pool = pool
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.prefix_hits = 0      # prompt tokens reused from the prefix cache (first admissions)
        self.prefix_queries = 0   # prompt tokens looked up
        self.reused_blocks = 0    # blocks taken from the prefix cache (every admission)

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _grow(self, req: Request, num_tokens: int) -> bool:
        need = -(-num_tokens // self.config.block_size) - len(req.block_table)
        if need <= 0:
            return True
        total, new = self.pool.num_alloc_total, self.pool.num_alloc_new
        try:
            req.block_table.extend(self.pool.allocate(need))
        except NoFreeBlocks:
            return False
        if req.num_computed < req.num_prompt:  # context blocks (see RequestMetrics)
            req.metrics.kv_alloc_total_blocks += self.pool.num_alloc_total - total
            req.metrics.kv_alloc_new_blocks += self.pool.num_alloc_new - new
        return True

    def free(self, req: Request) -> None:
        self.pool.release(req.block_table)
        req.block_table = []
        req.block_hashes = []

    def _match_prefix(self, req: Request) -> int:
        """Points a fresh request at cached blocks of its longest cached prefix; returns tokens reused.
        At least the last token is always recomputed: its logits are needed."""
        bs = self.config.block_size
        parent = adapter_root(req.params.lora_task_id)
        for i in range((len(req.token_ids) - 1) // bs):
            h = block_hash(parent, req.token_ids[i * bs:(i + 1) * bs])
            b = self.pool.lookup(h)
            if b is None:
                break
            self.pool.take(b)
            req.block_table.append(b)
            req.block_hashes.append(h)
            parent = h
        req.num_computed = len(req.block_table) * bs
        return req.num_computed

    def register_full_blocks(self, req: Request) -> None:
        """Publishes blocks that became full and computed (prefix caching on)."""
        bs = self.config.block_size
        while len(req.block_hashes) < req.num_computed // bs:
            i = len(req.block_hashes)
            parent = req.block_hashes[-1] if i else adapter_root(req.params.lora_task_id)
            tokens = req.token_ids[i * bs:(i + 1) * bs]
            h = block_hash(parent, tokens)
            self.pool.register(req.block_table[i], h, parent, tokens)
            req.block_hashes.append(h)

    def _preempt(self, req: Request) -> None:
        self.free(req)
        req.draft = []
        req.num_computed = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def schedule(self) -> ScheduledStep:
        budget = self.config.max_num_tokens
        items: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        scheduled_running: list[Request] = []
        queue = list(self.running)
        while queue and budget > 0:
            req = queue.pop(0)
            n = min(len(req.token_ids) + len(req.draft) - req.num_computed, budget)
            if req.draft:  # a draft rides on a decode: trim it to the budget
                req.draft = req.draft[:n - 1]
            while not self._grow(req, req.num_computed + n):
                victim = queue.pop() if queue else None
                if victim is None:
                    break
                self._preempt(victim)
                preempted.append(victim)
            else:
                items.append((req, n))
                scheduled_running.append(req)
                budget -= n
                continue
            self._preempt(req)               # nothing left to preempt: this one waits
            preempted.append(req)
        kept = scheduled_running + queue     # `queue` holds running requests the budget did not reach
        while self.waiting and budget > 0 and len(kept) < self.config.max_num_seqs and not preempted:
            req = self.waiting[0]
            hit = -1
            if self.config.enable_prefix_caching and req.num_computed == 0:
                hit = self._match_prefix(req)
            remaining = len(req.token_ids) - req.num_computed
            if not self.config.enable_chunked_prefill and remaining > budget:
                break
            n = min(remaining, budget)
            if not self._grow(req, req.num_computed + n):
                if req.block_table:  # undo the prefix match: the request waits with nothing held
                    self.free(req)
                    req.num_computed = 0
                break
            self.waiting.popleft()
            if hit >= 0 and req.num_preemptions == 0:
                self.prefix_hits += hit
                self.prefix_queries += len(req.token_ids)
            if hit > 0:
                req.metrics.kv_reused_blocks += hit // self.config.block_size
                self.reused_blocks += hit // self.config.block_size
            if not req.metrics.first_scheduled_ns:
                req.metrics.first_scheduled_ns = time.monotonic_ns()
            req.status = Status.RUNNING
            items.append((req, n))
            kept.append(req)
            budget -= n
        self.running = kept
        return ScheduledStep(items, preempted)

    def remove(self, req: Request) -> None:
        """Drop a request wherever it is and free its blocks (finish, abort)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.free(req)
        req.status = Status.FINISHED
