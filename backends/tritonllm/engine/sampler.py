"""Per-request sampling inside one batch.

Each row is processed with its own parameters; a seeded request draws from its own torch.Generator, so
its tokens do not depend on what else is in the batch. Rows that are plain greedy (no bias, penalties, bad
words, pending min_tokens or grammar) take one batched argmax. A request's embedding bias is added to its
row before anything else. Log-probs, and the ``top_logprobs`` most likely ids, are log-softmax of the
(biased, penalised, temperature-scaled) logits, before top-k/top-p truncation.
"""
from __future__ import annotations

import torch

from .request import Request

TopLogprobs = list[tuple[int, float]]


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


def target_probs(logits: torch.Tensor, params) -> torch.Tensor:
    """The distribution a sampled request draws from: temperature-scaled logits, then top-k and top-p."""
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if 0.0 < params.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        cum = sorted_p.cumsum(-1)
        drop = (cum - sorted_p) > params.top_p     # keep the smallest prefix whose mass reaches top_p
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return probs


def _sample_row(logits: torch.Tensor, req: Request) -> int:
    return int(torch.multinomial(target_probs(logits, req.params), 1, generator=req.generator).item())


def device_bias(bias: torch.Tensor, vocab_size: int, device: torch.device) -> torch.Tensor:
    """A request's embedding bias as the engine keeps it: fp32, zero-padded to ``vocab_size``, on ``device``
    (made once at admission, not per step)."""
    out = torch.zeros(vocab_size, dtype=torch.float32, device=device)
    out[:bias.numel()] = bias.detach().to(device=device, dtype=torch.float32)
    return out


def top_logprobs(logp: torch.Tensor, ks: list[int]) -> list[TopLogprobs]:
    """Per row of ``logp`` [n, V], its ``ks[j]`` largest entries as (id, log prob), descending, ties by id.

    One batched topk and one transfer; a row whose k-th value is tied with entries outside its top k
    (where topk's choice among equals is unspecified) is redone exactly: every entry >= the k-th value,
    stable-sorted, so equal values keep ascending ids."""
    ks = [min(k, logp.shape[-1]) for k in ks]
    vals, ids = torch.topk(logp, max(ks), dim=-1)
    kth = vals[torch.arange(len(ks), device=logp.device), torch.tensor(ks, device=logp.device) - 1]
    at_least = (logp >= kth[:, None]).sum(-1).tolist()
    vals, ids = vals.tolist(), ids.tolist()
    out = []
    for j, k in enumerate(ks):
        if at_least[j] == k:
            out.append(sorted(zip(ids[j][:k], vals[j][:k]), key=lambda e: (-e[1], e[0])))
            continue
        cand = (logp[j] >= kth[j]).nonzero().squeeze(1)
        v, order = logp[j, cand].sort(descending=True, stable=True)
        out.append(list(zip(cand[order[:k]].tolist(), v[:k].tolist())))
    return out


def needs_processors(req: Request) -> bool:
    """Its logits need more than temperature / top-k / top-p this step: an embedding bias, a grammar,
    penalties, bad words or a pending min_tokens. The one definition the greedy fast path and speculative
    drafting (``speculative.may_draft``) both read, so a new processor cannot be skipped by either."""
    p = req.params
    return (p.needs_penalties or bool(p.bad_words) or req.num_output < p.min_tokens or req.matcher is not None
            or req.embedding_bias is not None)


def scaled(logits: torch.Tensor, params) -> torch.Tensor:
    """The logits a request samples from and reports log probs of: temperature-scaled (greedy: as they are)."""
    return logits if params.greedy else logits / params.temperature


def _fast_greedy(req: Request) -> bool:
    return req.params.greedy and not needs_processors(req)


def sample(logits: torch.Tensor, reqs: list[Request],
           end_ids_of) -> tuple[list[int], list[float], list[TopLogprobs]]:
    """Returns per row one token id, its log-prob (0.0 unless ``return_log_probs``) and its top log-probs
    ([] unless ``top_logprobs``). `end_ids_of(req)` gives a request's EOS ids."""
    tokens: list[int] = [0] * len(reqs)
    logprobs: list[float] = [0.0] * len(reqs)
    tops: list[TopLogprobs] = [[] for _ in reqs]
    plain = [i for i, r in enumerate(reqs) if _fast_greedy(r)]
    if plain:
        rows = logits[plain]
        ids = rows.argmax(-1)
        want_lp = any(reqs[i].params.return_log_probs for i in plain)
        k = max(reqs[i].params.top_logprobs for i in plain)
        logp = torch.log_softmax(rows, -1) if want_lp or k else None
        lps = logp.gather(1, ids[:, None]).squeeze(1).tolist() if want_lp else None
        for j, i in enumerate(plain):
            tokens[i] = int(ids[j])
            if reqs[i].params.return_log_probs:
                logprobs[i] = lps[j]
        asking = [j for j, i in enumerate(plain) if reqs[i].params.top_logprobs]
        if asking:
            found = top_logprobs(logp[asking], [reqs[plain[j]].params.top_logprobs for j in asking])
            for j, top in zip(asking, found):
                tops[plain[j]] = top
    done = set(plain)
    for i, req in enumerate(reqs):
        if i in done:
            continue
        row = logits[i].clone()
        if req.embedding_bias is not None:
            row += req.embedding_bias
        if req.matcher is not None:
            req.matcher.mask(row)
        apply_processors(row, req, end_ids_of(req))
        row = scaled(row, req.params)
        tok = int(row.argmax()) if req.params.greedy else _sample_row(row, req)
        tokens[i] = tok
        if req.matcher is not None:
            req.matcher.accept(tok)
        if req.params.return_log_probs or req.params.top_logprobs:
            logp = torch.log_softmax(row, -1)
            if req.params.return_log_probs:
                logprobs[i] = float(logp[tok])
            if req.params.top_logprobs:
                tops[i] = top_logprobs(logp[None], [req.params.top_logprobs])[0]
    return tokens, logprobs, tops
