"""Requests that read final hidden states of their prompt in one engine step: pooled ones (``SamplingParams.pooling``)
and scored ones (``prompt_logprobs``): which rows each reads, what it keeps across prefill chunks, and its result
once the prompt is computed.

A pooled request is prefill only: it never samples. "last" reads the prompt's last token's row (in the step that
computes it); "mean" reads every prompt row, over as many chunks as chunked prefill takes, and starts over when
its prompt is computed again from 0 (a preemption). A scored request reads every prompt row too, turns each into
the log prob of the prompt's next token (the model's LM head, then a log-softmax, a chunk of rows at a time), and
samples as usual once its prompt is computed. "mean" and scored requests never take prompt blocks from the prefix
cache (those rows would be missing: ``Scheduler``); "last" may, as generation does.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from .request import Request, RequestOutput


SCORE_ROWS = 64  # prompt rows scored at once: 64 x a 152k vocabulary is 39 MB of fp32 logits


class Pooled:
    def __init__(self) -> None:
        self.rows: list[int] = []  # rows of the step's flat batch whose hidden states are read
        self._spans: list[tuple[Request, int, int, int]] = []  # (request, offset in rows, count, first position)

    def schedule(self, req: Request, start: int, p0: int, n: int) -> None:
        """The request computes prompt positions [p0, p0 + n) at flat rows [start, start + n)."""
        if p0 == 0:  # its first chunk, or recomputed after a preemption
            req.pool_sum, req.pool_count, req.prompt_lp = None, 0, []
        if req.params.pooling == "mean":
            picked = range(start, start + n)
        elif req.params.prompt_logprobs:  # rows p0 .. the prompt's second-last: each predicts a prompt token
            picked = range(start, start + min(n, req.num_prompt - 1 - p0))
        else:
            picked = [start + n - 1] if p0 + n == req.num_prompt else []
        self._spans.append((req, len(self.rows), len(picked), p0))
        self.rows.extend(picked)

    def tensor(self, device: torch.device) -> torch.Tensor | None:
        """The rows for ``Transformer.forward``'s ``hidden_rows``; None when no request reads any."""
        return torch.tensor(self.rows, dtype=torch.long, device=device) if self.rows else None

    def add(self, hidden: torch.Tensor | None, logits: Callable[[torch.Tensor], torch.Tensor]) -> list[Request]:
        """Adds the step's hidden states (rows in ``self.rows`` order; ``logits`` is the model's LM head over final
        hidden states); returns the pooled requests now complete (call after the scheduler counted the step's
        tokens as computed)."""
        done = []
        for req, offset, count, p0 in self._spans:
            if req.params.prompt_logprobs:
                for at in range(0, count, SCORE_ROWS):  # [rows x vocabulary] fp32 logits, a chunk at a time
                    k = min(SCORE_ROWS, count - at)
                    lp = torch.log_softmax(logits(hidden[offset + at:offset + at + k]).float(), dim=-1)
                    nxt = torch.tensor(req.prompt_ids[p0 + at + 1:p0 + at + 1 + k], device=lp.device)
                    req.prompt_lp += lp.gather(1, nxt[:, None]).squeeze(1).tolist()
                continue
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
