"""Prompt-lookup (n-gram) speculative decoding, greedy and lossless.

A draft is the continuation of the most recent earlier occurrence of the sequence's last n tokens
(n from `ngram_max` down to `ngram_min`). The target model scores the last token plus the k draft tokens
in one forward pass; the longest draft prefix that equals the target's own argmax is accepted, followed by
the target's token at the first mismatch (or after the last draft). So the output is token for token the
non-speculative greedy output, and each step yields 1..k+1 tokens.
"""
from __future__ import annotations

import torch


def propose_ngram(tokens: list[int], k: int, ngram_max: int = 3, ngram_min: int = 1) -> list[int]:
    if k <= 0:
        return []
    n_tokens = len(tokens)
    for n in range(min(ngram_max, n_tokens - 1), ngram_min - 1, -1):
        tail = tokens[n_tokens - n:]
        # most recent earlier occurrence whose continuation exists
        for start in range(n_tokens - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


def verify_greedy(logits: torch.Tensor, draft: list[int]) -> tuple[list[int], torch.Tensor]:
    """`logits` [k+1, V]: rows for the last accepted token and each draft token.
    Returns the tokens to append (accepted draft prefix + one target token) and the target ids."""
    target = logits.argmax(-1).tolist()
    a = 0
    while a < len(draft) and draft[a] == target[a]:
        a += 1
    return draft[:a] + [target[a]], logits.new_tensor(target[:a + 1], dtype=torch.long)
