"""Pooled requests (``SamplingParams.pooling``) in one engine step: which final hidden-state rows each reads, their
running sums across prefill chunks, and the pooled vector once the prompt is computed.

A pooled request is prefill only: it never samples. "last" reads the prompt's last token's row (in the step that
computes it); "mean" reads every prompt row, over as many chunks as chunked prefill takes, and starts over when
its prompt is computed again from 0 (a preemption). A "mean" request never takes prompt blocks from the prefix
cache (their hidden states would be missing from the mean: ``Scheduler``); "last" may, as generation does.
"""
from __future__ import annotations

import dataclasses

import torch

from .request import Request, RequestOutput


class Pooled:
    def __init__(self) -> None:
        self.rows: list[int] = []  # rows of the step's flat batch whose hidden states are read
        self._spans: list[tuple[Request, int, int]] = []  # (request, offset in rows, count)

    def schedule(self, req: Request, start: int, p0: int, n: int) -> None:
        """The request computes prompt positions [p0, p0 + n) at flat rows [start, start + n)."""
        if p0 == 0:  # its first chunk, or recomputed after a preemption
            req.pool_sum, req.pool_count = None, 0
        if req.params.pooling == "mean":
            picked = range(start, start + n)
        else:
            picked = [start + n - 1] if p0 + n == req.num_prompt else []
        self._spans.append((req, len(self.rows), len(picked)))
        self.rows.extend(picked)

    def tensor(self, device: torch.device) -> torch.Tensor | None:
        """The rows for ``Transformer.forward``'s ``hidden_rows``; None when no request reads any."""
        return torch.tensor(self.rows, dtype=torch.long, device=device) if self.rows else None

    def add(self, hidden: torch.Tensor | None) -> list[Request]:
        """Adds the step's hidden states (rows in ``self.rows`` order); returns the requests now complete (call
        after the scheduler counted the step's tokens as computed)."""
        done = []
        for req, offset, count in self._spans:
            if count:
                part = hidden[offset:offset + count].sum(0, dtype=torch.float64)
                req.pool_sum = part if req.pool_sum is None else req.pool_sum + part
                req.pool_count += count
            if req.num_computed >= req.num_prompt:
                done.append(req)
        return done

    @staticmethod
    def output(req: Request) -> RequestOutput:
        """The request's final output: the pooled vector, finish reason "stop", no tokens."""
        req.finish_reason = "stop"
        vector = (req.pool_sum / req.pool_count).float().cpu().tolist()
        return RequestOutput(req.request_id, [], [], True, "stop", req.num_prompt, 0, 0.0,
                             metrics=dataclasses.replace(req.metrics), embedding=vector)
