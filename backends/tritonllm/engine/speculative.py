"""Prompt-lookup (n-gram) speculative decoding, greedy and lossless.

A draft is the continuation of the most recent earlier occurrence of the sequence's last n tokens
(n from `ngram_max` down to `ngram_min`), copied with overlap as in LZ77: when that continuation runs into
the end of the sequence, the copy goes on over the tokens it has just drafted, so a repeating pattern of
period p < k still yields k draft tokens (a run of one token, a repeated short phrase). The target model scores the last token plus the k draft tokens
in one forward pass; the longest draft prefix that equals the target's own argmax is accepted, followed by
the target's token at the first mismatch (or after the last draft). So the output is token for token the
non-speculative greedy output, and each step yields 1..k+1 tokens.

Sampled requests (temperature / top-k / top-p, no penalties) use rejection sampling: the draft is a
deterministic proposal, so draft token d is accepted with probability p(d) under the target distribution,
and on rejection the token is drawn from p with d removed (renormalised). Each emitted token is then
distributed exactly as p: P(d) = p(d), P(x != d) = (1 - p(d)) p(x) / (1 - p(d)).
"""
from __future__ import annotations

import torch

from .sampler import needs_processors, scaled, target_probs


def may_draft(req) -> bool:
    """Whether a request may draft: the verifiers see the raw logits, so only requests without logits
    processors qualify (``sampler.needs_processors``), and they report no top log-probs; a pooled request
    (an embedding) never samples."""
    return not needs_processors(req) and not req.params.top_logprobs and not req.params.pooling


def propose_ngram(tokens: list[int], k: int, ngram_max: int = 3, ngram_min: int = 1) -> list[int]:
    if k <= 0:
        return []
    n_tokens = len(tokens)
    for n in range(min(ngram_max, n_tokens - 1), ngram_min - 1, -1):
        tail = tokens[n_tokens - n:]
        # most recent earlier occurrence whose continuation exists
        for start in range(n_tokens - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                seq = list(tokens[start + n:])   # the continuation, then the draft itself (overlapping copy)
                while len(seq) < k:
                    seq.append(seq[len(seq) - (n_tokens - start - n)])
                return seq[:k]
    return []


def verify_greedy(logits: torch.Tensor, draft: list[int]) -> tuple[list[int], torch.Tensor]:
    """`logits` [k+1, V]: rows for the last accepted token and each draft token.
    Returns the tokens to append (accepted draft prefix + one target token) and the target ids."""
    target = logits.argmax(-1).tolist()
    a = 0
    while a < len(draft) and draft[a] == target[a]:
        a += 1
    return draft[:a] + [target[a]], logits.new_tensor(target[:a + 1], dtype=torch.long)


def verify_sampled(logits: torch.Tensor, draft: list[int], params, generator) -> tuple[list[int], list[float]]:
    """`logits` [k+1, V] as in verify_greedy. Returns the tokens to append and their log-probs."""
    out: list[int] = []
    lps: list[float] = []
    for i in range(len(draft) + 1):
        row = scaled(logits[i], params)
        probs = target_probs(row, params)
        logp = torch.log_softmax(row, -1)
        if i < len(draft):
            d = draft[i]
            u = torch.rand((), generator=generator, device=probs.device)
            if u < probs[d]:
                out.append(d)
                lps.append(float(logp[d]))
                continue
            probs = probs.clone()
            probs[d] = 0.0
        tok = int(torch.multinomial(probs, 1, generator=generator).item())
        out.append(tok)
        lps.append(float(logp[tok]))
        break
    return out, lps
