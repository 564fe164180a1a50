"""What the engine counts: totals since start (EngineStats) and what its last step did (IterationStats).

Written by the engine thread only; other threads read them (the Triton adapter's metrics exporter). The
engine replaces ``last_step`` with a new IterationStats each step rather than mutating it, so a reader
always sees one step's values together.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """Monotonic counters since start."""

    prompt_tokens: int = 0          # prompt tokens of admitted requests
    generation_tokens: int = 0      # visible generated tokens
    preemptions: int = 0
    busy_seconds: float = 0.0       # wall time spent inside step()
    prefix_hit_tokens: int = 0      # prompt tokens whose KV came from the prefix cache
    prefix_query_tokens: int = 0    # prompt tokens looked up in the prefix cache
    draft_tokens: int = 0           # speculative tokens proposed
    accepted_draft_tokens: int = 0  # of which accepted by the target model
    iterations: int = 0             # steps that ran the model
    reused_blocks: int = 0          # KV blocks taken from the prefix cache (TensorRT-LLM's reusedBlocks)


@dataclass(frozen=True)
class IterationStats:
    """One engine step, as TensorRT-LLM's per-iteration stats describe it (InflightBatchingStats)."""

    iteration: int = 0              # EngineStats.iterations after this step
    timestamp: float = field(default_factory=time.time)  # wall clock (seconds since the epoch)
    active_requests: int = 0        # unfinished requests when the step was scheduled (running + waiting)
    scheduled_requests: int = 0     # requests that computed tokens this step
    context_requests: int = 0       # ... of which were (chunks of) prefills
    generation_requests: int = 0    # ... of which were decodes
    context_tokens: int = 0         # prompt tokens computed this step
    paused_requests: int = 0        # requests preempted this step (recomputed later)
    free_blocks: int = 0            # KV blocks free after the step (finished requests released theirs)
