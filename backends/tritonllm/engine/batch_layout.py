"""The flat token batch of one forward pass -> AttentionMeta (cache slots, decode gathers, prefill masks).

Each span is one sequence's new tokens: its block table, the position of its first new token ``p0`` and
the count ``n``. Tokens [0, p0 + n) of the sequence must have slots in its block table. Spans with n == 1
(decodes) are attended together through one padded gather; longer spans (prefill chunks, drafts under
verification) one by one with a causal mask. Shared by the target model and the draft model.
"""
from __future__ import annotations

import torch

from .model import AttentionMeta


def attention_meta(spans: list[tuple[list[int], int, int]], block_size: int, device: torch.device,
                   window: int | None = None) -> AttentionMeta:
    slots, prefills = [], []
    decode_rows, decode_slots, decode_lens = [], [], []
    start = 0
    for table, p0, n in spans:
        t = torch.tensor(table, dtype=torch.long)
        all_slots = (t[:, None] * block_size + torch.arange(block_size)[None, :]).reshape(-1)[:p0 + n]
        slots.append(all_slots[p0:p0 + n])
        if n == 1:
            decode_rows.append(start)
            decode_slots.append(all_slots)
            decode_lens.append(p0 + 1)
        else:
            kpos = torch.arange(p0 + n)
            qpos = torch.arange(p0, p0 + n)
            mask = kpos[None, :] <= qpos[:, None]
            if window:
                mask &= kpos[None, :] > qpos[:, None] - window
            prefills.append((start, n, all_slots.to(device), mask.to(device)))
        start += n
    meta = AttentionMeta(torch.cat(slots).to(device), None, None, None, prefills)
    if decode_rows:
        kmax = max(decode_lens)
        gather = torch.zeros(len(decode_rows), kmax, dtype=torch.long)
        for i, s in enumerate(decode_slots):
            gather[i, :len(s)] = s
        lens = torch.tensor(decode_lens)
        kpos = torch.arange(kmax)[None, :]
        mask = kpos < lens[:, None]
        if window:
            mask &= kpos > (lens[:, None] - 1 - window)
        meta.decode_rows = torch.tensor(decode_rows, device=device)
        meta.decode_gather = gather.to(device)
        meta.decode_mask = mask[:, None, None, :].to(device)
        meta.decode_lo = ((lens - window).clamp(min=0) if window else torch.zeros_like(lens)).to(device)
        meta.decode_hi = lens.to(device)
    return meta
