"""Iteration-level scheduler.

There are no prefill and decode phases: every request has ``token_ids`` (prompt + generated) and
``num_computed`` (tokens whose KV is cached); each step gives requests a number of new tokens to compute so
that ``num_computed`` catches up with ``len(token_ids)``, within a per-step token budget. A long prompt thus
prefills in chunks alongside decodes. Running requests are served first (oldest first); when KV blocks run
out, the newest running request is preempted (blocks freed, recomputed later from its tokens).
Idea after vLLM v1's scheduler; see vllm/v1/core/sched/scheduler.py.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .config import EngineConfig
from .kv_cache import BlockPool, NoFreeBlocks
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

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _grow(self, req: Request, num_tokens: int) -> bool:
        need = -(-num_tokens // self.config.block_size) - len(req.block_table)
        if need <= 0:
            return True
        try:
            req.block_table.extend(self.pool.allocate(need))
            return True
        except NoFreeBlocks:
            return False

    def free(self, req: Request) -> None:
        self.pool.release(req.block_table)
        req.block_table = []

    def _preempt(self, req: Request) -> None:
        self.free(req)
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
            n = min(len(req.token_ids) - req.num_computed, budget)
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
            remaining = len(req.token_ids) - req.num_computed
            if not self.config.enable_chunked_prefill and remaining > budget:
                break
            n = min(remaining, budget)
            if not self._grow(req, req.num_computed + n):
                break
            self.waiting.popleft()
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
