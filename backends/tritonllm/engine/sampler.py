"""Per-request sampling inside one batch.

Each row is processed with its own parameters; a seeded request draws from its own torch.Generator, so
its tokens do not depend on what else is in the batch. Rows that are plain greedy take one batched argmax.
Log-probs are log-softmax of the (penalised, temperature-scaled) logits, before top-k/top-p truncation.
"""
from __future__ import annotations

import torch

from .request import Request


def _ban(logits: torch.Tensor, ids) -> None:
    if ids:
        logits[list(ids)] = float("-inf")


def apply_processors(logits: torch.Tensor, req: Request, end_ids: frozenset[int]) -> None:
    """In-place: penalties, bad words, min_tokens. `logits` is one fp32 row [V]."""
    p = req.params
    out = req.output_ids
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(req.token_ids)), dtype=torch.long, device=logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and out:
        ids, counts = torch.tensor(out, dtype=torch.long, device=logits.device).unique(return_counts=True)
        logits[ids] -= p.presence_penalty + p.frequency_penalty * counts.to(logits.dtype)
    for word in p.bad_words:
        if len(word) == 1 or (len(word) <= len(req.token_ids) + 1
                              and req.token_ids[len(req.token_ids) - len(word) + 1:] == word[:-1]):
            logits[word[-1]] = float("-inf")
    if req.num_output < p.min_tokens:
        _ban(logits, end_ids)
        _ban(logits, {w[0] for w in p.stop_words if len(w) == 1})


def target_probs(scaled: torch.Tensor, params) -> torch.Tensor:
    """The distribution a sampled request draws from: temperature-scaled logits, top-k, then top-p."""
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.shape[-1])).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if 0.0 < params.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        cum = sorted_p.cumsum(-1)
        drop = (cum - sorted_p) > params.top_p     # keep the smallest prefix whose mass reaches top_p
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return probs


def _sample_row(logits: torch.Tensor, req: Request) -> int:
    return int(torch.multinomial(target_probs(logits, req.params), 1, generator=req.generator).item())


def sample(logits: torch.Tensor, reqs: list[Request], end_ids_of) -> tuple[list[int], list[float]]:
    """Returns one token id and its log-prob per row. `end_ids_of(req)` gives a request's EOS ids."""
    tokens: list[int] = [0] * len(reqs)
    logprobs: list[float] = [0.0] * len(reqs)
    want_lp = any(r.params.return_log_probs for r in reqs)
    plain = [i for i, r in enumerate(reqs) if r.params.greedy and not r.params.needs_penalties
             and not r.params.bad_words and r.num_output >= r.params.min_tokens and r.matcher is None]
    if plain:
        rows = logits[plain]
        ids = rows.argmax(-1)
        lps = torch.log_softmax(rows, -1).gather(1, ids[:, None]).squeeze(1) if want_lp else None
        for j, i in enumerate(plain):
            tokens[i] = int(ids[j])
            if lps is not None:
                logprobs[i] = float(lps[j])
    done = set(plain)
    for i, req in enumerate(reqs):
        if i in done:
            continue
        row = logits[i].clone()
        if req.matcher is not None:
            req.matcher.mask(row)
        apply_processors(row, req, end_ids_of(req))
        if req.params.greedy:
            tok = int(row.argmax())
            scaled = row
        else:
            scaled = row / req.params.temperature
            tok = _sample_row(scaled, req)
        tokens[i] = tok
        if req.matcher is not None:
            req.matcher.accept(tok)
        if req.params.return_log_probs:
            logprobs[i] = float(torch.log_softmax(scaled, -1)[tok])
    return tokens, logprobs
