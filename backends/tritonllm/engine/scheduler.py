"""Iteration-level scheduler.

There are no prefill and decode phases: every request has ``token_ids`` (prompt + generated) and
``num_computed`` (tokens whose KV is cached); each step gives requests a number of new tokens to compute so
that ``num_computed`` catches up with ``len(token_ids)``, within a per-step token budget. A long prompt thus
prefills in chunks alongside decodes. Running requests are served first, highest priority first, then
oldest first; when KV blocks run out, a running request not yet served this step is preempted (blocks
freed, recomputed later from its tokens): the lowest priority, then the newest.
Idea after vLLM v1's scheduler; see vllm/v1/core/sched/scheduler.py.

Waiting queue invariants: preempted requests are at its head, in the order they are readmitted; behind
them, requests are admitted by effective priority ``priority + waited / priority_aging_s`` (TensorRT-LLM's
[0, 1], higher first), ties by arrival. Aging raises every waiting request at the same rate, so that order
never changes while they wait: ``add`` inserts in place (with equal priorities, at the end) and the queue
is never re-sorted. A request with ``prefill_after`` (prefix caching on) is skipped, not blocking the ones behind it,
while its sibling is in the engine and has not computed its prompt. ``clock`` is the time base of
``Request.arrival_time``, aging and deadlines (``allotted_time_ms``).
"""
from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass

from .config import EngineConfig
from .kv_manager import KVCacheManager
from .request import Request, Status


@dataclass
class ScheduledStep:
    items: list[tuple[Request, int]]       # (request, new tokens computed this step), in batch order
    preempted: list[Request]


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv  # the blocks' owner: the scheduler never touches the pool
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # id -> every request in the scheduler, waiting or running
        self.timed: list[Request] = []        # those with a deadline
        self.clock = time.monotonic
        self.prefix_hits = 0      # prompt tokens reused from the prefix cache (first admissions)
        self.prefix_queries = 0   # prompt tokens looked up
        self.reused_blocks = 0    # blocks taken from the prefix cache (every admission)

    def add(self, req: Request) -> None:
        bisect.insort_right(self.waiting, req, key=self._admission_key)
        self.requests[req.request_id] = req
        if req.deadline is not None:
            self.timed.append(req)

    def expired(self) -> list[Request]:
        """Requests past their deadline (waiting or running), in arrival order; the caller removes them."""
        if not self.timed:
            return []
        now = self.clock()
        return [r for r in self.timed if now >= r.deadline]

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _grow(self, req: Request, num_tokens: int) -> bool:
        total, new = self.kv.alloc_counts()
        if not self.kv.allocate_slots(req.block_table, num_tokens):
            return False
        if req.num_computed < req.num_prompt:  # context blocks (see RequestMetrics)
            total2, new2 = self.kv.alloc_counts()
            req.metrics.kv_alloc_total_blocks += total2 - total
            req.metrics.kv_alloc_new_blocks += new2 - new
        return True

    def free(self, req: Request) -> None:
        self.kv.free(req)

    def cache_full_blocks(self, req: Request) -> None:
        """Publishes the request's blocks that became full (tokens appended outside a scheduled step: drafts)."""
        self.kv.cache_full_blocks(req)

    def update_from_output(self, items: list[tuple[Request, int]]) -> None:
        """After the model ran a step: the scheduled tokens of requests without a draft now have KV (a
        draft's count once verified, by the engine), and blocks that became full enter the prefix cache."""
        for req, n in items:
            if not req.draft:
                req.num_computed += n
                self.kv.cache_full_blocks(req)

    def _preempt(self, req: Request) -> None:
        self.free(req)
        req.draft = []
        req.num_computed = 0
        req.num_preemptions += 1
        req.status = Status.WAITING
        self.waiting.appendleft(req)


    def _running_order(self) -> list[Request]:
        # oldest first (admission order) within a priority: the sort is stable, and linear when all are equal
        return sorted(self.running, key=lambda r: -r.params.priority)

    def _admission_key(self, r: Request):
        """Sort key of the waiting queue: priority + (now - arrival) / aging, highest first, is in the order
        of priority - arrival / aging whatever ``now`` is."""
        if r.num_preemptions:                # only preempted requests are at the head (``_preempt``)
            return (0, 0.0, 0.0)
        aging = self.config.priority_aging_s
        return (1, -(r.params.priority - (r.arrival_time / aging if aging > 0 else 0.0)), r.arrival_time)

    def _deferred(self, req: Request) -> bool:
        """Waits for the sibling's prompt to be in the prefix cache. Only a sibling without a
        ``prefill_after`` of its own is waited for, so chains and cycles cannot stall the queue; a
        preempted request (its prompt was computed once) never waits."""
        sib_id = req.params.prefill_after
        if sib_id is None or not self.config.enable_prefix_caching or req.num_preemptions:
            return False
        sib = self.requests.get(sib_id)
        return (sib is not None and sib is not req and sib.params.prefill_after is None
                and sib.num_computed < sib.num_prompt)

    def schedule(self) -> ScheduledStep:
        budget = self.config.max_num_tokens
        items: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        scheduled_running: list[Request] = []
        queue = self._running_order()
        while queue and budget > 0:
            req = queue.pop(0)
            n = min(len(req.token_ids) + len(req.draft) - req.num_computed, budget)
            if req.draft:  # a draft rides on a decode: trim it to the budget
                req.draft = req.draft[:n - 1]
            while not self._grow(req, req.num_computed + n):
                # `queue` is in serving order (priority, then age): its last is the lowest priority, newest
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
        still_running = len(kept)
        order = self.waiting if not preempted else ()  # already in admission order (see ``add``)
        for req in order:
            if budget <= 0 or len(kept) >= self.config.max_num_seqs:
                break
            if self._deferred(req):
                continue
            hit = -1
            if self.config.enable_prefix_caching and req.num_computed == 0 and req.params.pooling != "mean" \
                    and not req.params.prompt_logprobs:
                hit = req.num_computed = self.kv.match_prefix(req)  # a mean or a scored prompt reads every row
            remaining = len(req.token_ids) - req.num_computed
            if not self.config.enable_chunked_prefill and remaining > budget:
                break
            n = min(remaining, budget)
            if not self._grow(req, req.num_computed + n):
                if req.block_table:  # undo the prefix match: the request waits with nothing held
                    self.free(req)
                    req.num_computed = 0
                break
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
        if len(kept) > still_running:        # some were admitted: they leave the queue
            self.waiting = deque(r for r in order if r.status is Status.WAITING)
        self.running = kept
        return ScheduledStep(items, preempted)

    def remove(self, req: Request) -> None:
        """Drop a request wherever it is and free its blocks (finish, abort, timeout)."""
        if self.requests.get(req.request_id) is req:
            del self.requests[req.request_id]
        if req.deadline is not None and req in self.timed:
            self.timed.remove(req)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.free(req)
        req.status = Status.FINISHED
