"""TensorRT-LLM LLM API results -> our types: output deltas, perf metrics, iteration stats (no tensorrt_llm import).

Every tensorrt_llm attribute or key read here goes through ``names`` (``attr`` / ``key``), so it is one of
the names in ``names.TABLE``.

Invariants of ``Stream.convert`` (one request's updates, in order):
- the deltas it returns add up to the visible generated tokens (``exclude_input_from_output=True``:
  TensorRT-LLM reports generated tokens only);
- as in our engine, a matched stop word stays in the output and the end token does not: a trailing
  end token of an update that finished by the end id (``finish_reason`` "stop", no ``stop_reason``) is
  dropped, whether or not TensorRT-LLM reports it; a multi-token stop word (which the LLM API cannot take as
  token ids) is matched here, the delta is cut right after it and the request is marked for abort;
- stop words count only once ``min_tokens`` tokens are out, as in our engine;
- after a final output (``finished``) it returns nothing more.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from ..engine.request import RequestMetrics, RequestOutput, SamplingParams
from ..metrics import TIMESTAMP_FORMAT
from . import names as N

# CompletionOutput.finish_reason -> ours ("abort": ended early, answered with what was produced).
FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort", "timeout": "abort"}
N.check("finish_reason", FINISH_REASONS)

# RequestPerfMetrics attribute path -> RequestMetrics field.
PERF_FIELDS = {
    "timing_metrics.arrival_time": "arrival_ns",
    "timing_metrics.first_scheduled_time": "first_scheduled_ns",
    "timing_metrics.first_token_time": "first_token_ns",
    "timing_metrics.last_token_time": "last_token_ns",
    "kv_cache_metrics.num_total_allocated_blocks": "kv_alloc_total_blocks",
    "kv_cache_metrics.num_new_allocated_blocks": "kv_alloc_new_blocks",
    "kv_cache_metrics.num_reused_blocks": "kv_reused_blocks",
    "speculative_decoding.total_draft_tokens": "draft_tokens",
    "speculative_decoding.total_accepted_draft_tokens": "accepted_draft_tokens",
}
N.check("RequestPerfMetrics", PERF_FIELDS)


def to_ns(value: Any) -> int:
    """A steady-clock time point as TensorRT-LLM's bindings give it (``datetime.timedelta`` since the clock's
    epoch; a number is taken as nanoseconds, as NVIDIA's model reads it with ``pd.Timedelta``) -> ns."""
    if isinstance(value, timedelta):
        return (value.days * 86_400 + value.seconds) * 1_000_000_000 + value.microseconds * 1_000
    return int(value)


def perf_metrics(pm: Any, base: RequestMetrics) -> RequestMetrics:
    """``base`` (our own timings) overlaid with every field TensorRT-LLM's RequestPerfMetrics reports."""
    out = replace(base)
    if pm is None:
        return out
    for path, name in PERF_FIELDS.items():
        value = N.attr(pm, "RequestPerfMetrics", path)
        if value is not None:
            setattr(out, name, to_ns(value) if name.endswith("_ns") else int(value))
    return out


def logprob_of(entry: Any, token: int) -> float:
    """The sampled token's log prob from one ``logprobs_diff`` entry: a float, or (PyTorch backend) a dict
    token id -> Logprob that holds the sampled token; NaN when it does not."""
    if isinstance(entry, dict):
        lp = entry.get(token)
        if lp is None:
            return math.nan
        return float(lp) if isinstance(lp, (int, float)) else float(N.attr(lp, "Logprob", "logprob", math.nan))
    return float(entry)


@dataclass
class Stream:
    """One request's state on the runner's event loop."""

    rid: str
    prompt_len: int
    params: SamplingParams
    end_id: int | None = None              # the end id TensorRT-LLM uses (read back after generate_async)
    multi_stops: list[list[int]] = field(default_factory=list)
    result: Any = None                     # the RequestOutput of generate_async
    task: Any = None                       # the asyncio task iterating it
    tokens: list[int] = field(default_factory=list)
    cum_logprob: float = 0.0
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    aborted: bool = False                  # abort() was called
    stop_matched: bool = False             # a multi-token stop word ended it (then aborted)
    done: bool = False                     # the final output went out

    def convert(self, completion: Any, finished: bool) -> RequestOutput | None:
        """One update (a CompletionOutput; ``finished`` = RequestOutput.finished) -> our delta, or None."""
        if self.done:
            return None
        ids = [int(t) for t in (N.attr(completion, "CompletionOutput", "token_ids_diff") or [])]
        lps: list[float] = []
        if self.params.return_log_probs:
            raw = list(N.attr(completion, "CompletionOutput", "logprobs_diff") or [])
            lps = [logprob_of(e, t) for e, t in zip(raw, ids)] + [math.nan] * max(len(ids) - len(raw), 0)
        reason = None
        if finished:
            trt_reason = N.attr(completion, "CompletionOutput", "finish_reason")
            reason = FINISH_REASONS.get(trt_reason, "abort" if self.aborted else "stop")
            stop_reason = N.attr(completion, "CompletionOutput", "stop_reason")
            if reason == "stop" and stop_reason is None and ids and ids[-1] == self.end_id:
                ids, lps = ids[:-1], lps[:-1]  # the end token is not output (our engine's rule)
        cut = self._match_stop(ids)
        if cut is not None:
            ids, lps, reason, finished = ids[:cut], lps[:cut], "stop", True
            self.stop_matched = True
        now = time.monotonic_ns()
        if ids:
            self.metrics.last_token_ns = now
            self.metrics.first_token_ns = self.metrics.first_token_ns or now
        self.tokens.extend(ids)
        self.cum_logprob += sum(lp for lp in lps if not math.isnan(lp))
        if not self.params.return_log_probs:  # no log probs of ours to add up: TensorRT-LLM's, if any
            trt_cum = N.attr(completion, "CompletionOutput", "cumulative_logprob")
            self.cum_logprob = float(trt_cum) if trt_cum is not None else self.cum_logprob
        if not ids and not finished:
            return None
        metrics = perf_metrics(N.attr(completion, "CompletionOutput", "request_perf_metrics"), self.metrics)
        self.done = finished
        return RequestOutput(self.rid, ids, lps, finished, reason, self.prompt_len, len(self.tokens),
                             self.cum_logprob, metrics=metrics)

    def _match_stop(self, ids: list[int]) -> int | None:
        """Index just past the first multi-token stop word completed within ``ids`` (None: no match)."""
        if not self.multi_stops:
            return None
        seen = list(self.tokens)
        for i, tok in enumerate(ids):
            seen.append(tok)
            if len(seen) < self.params.min_tokens:
                continue
            if any(len(seen) >= len(w) and seen[-len(w):] == w for w in self.multi_stops):
                return i + 1
        return None

    def final(self, reason: str, error: str | None = None) -> RequestOutput:
        """The final output when TensorRT-LLM sent none (abort, error, shutdown)."""
        self.done = True
        return RequestOutput(self.rid, [], [], True, reason, self.prompt_len, len(self.tokens), self.cum_logprob,
                             error=error, metrics=replace(self.metrics))


def nvidia_iteration_stats(entry: dict) -> dict[str, object]:
    """One ``LLM.get_stats`` entry (the executor's IterationStats JSON) -> the iteration-stats JSON NVIDIA's
    Triton backend reports (``metrics.iteration_stats`` keys: ``NvidiaMetrics.publish`` reads them). As
    NVIDIA's backend computes them: "Waiting Requests" = active - scheduled, the fraction = used / max."""
    k = N.key
    active = int(k(entry, "numActiveRequests"))
    scheduled = int(k(entry, "inflightBatchingStats.numScheduledRequests"))
    max_blocks = int(k(entry, "kvCacheStats.maxNumBlocks"))
    used = int(k(entry, "kvCacheStats.usedNumBlocks"))
    stamp = str(k(entry, "timestamp", ""))
    try:
        datetime.strptime(stamp, TIMESTAMP_FORMAT)
    except ValueError:  # not the format NVIDIA's metrics reporter parses: use the time we read it
        stamp = datetime.now().strftime(TIMESTAMP_FORMAT)
    return {
        "Active Request Count": active, "Max Request Count": int(k(entry, "maxNumActiveRequests")),
        "Scheduled Requests": scheduled,
        "Context Requests": int(k(entry, "inflightBatchingStats.numContextRequests")),
        "Waiting Requests": max(active - scheduled, 0),
        "Runtime CPU Memory Usage": int(k(entry, "cpuMemUsage")),
        "Runtime GPU Memory Usage": int(k(entry, "gpuMemUsage")),
        "Runtime Pinned Memory Usage": int(k(entry, "pinnedMemUsage")),
        "Max KV cache blocks": max_blocks, "Free KV cache blocks": int(k(entry, "kvCacheStats.freeNumBlocks")),
        "Used KV cache blocks": used, "Tokens per KV cache block": int(k(entry, "kvCacheStats.tokensPerBlock")),
        "Reused KV cache blocks": int(k(entry, "kvCacheStats.reusedBlocks")),
        "Fraction used KV cache blocks": used / max_blocks if max_blocks else 0.0,
        "Total Context Tokens": int(k(entry, "inflightBatchingStats.numCtxTokens")),
        "Generation Requests": int(k(entry, "inflightBatchingStats.numGenRequests")),
        "MicroBatch ID": int(k(entry, "inflightBatchingStats.microBatchId")),
        "Paused Requests": int(k(entry, "inflightBatchingStats.numPausedRequests")),
        "Timestamp": stamp, "Iteration Counter": int(k(entry, "iter")),
    }
