"""Draft-model speculative decoding: a smaller checkpoint proposes k greedy tokens per request per step.

The drafter has its own paged KV cache and block tables (a separate BlockPool), so the target's cache,
prefix sharing and preemption are untouched. Per step it runs k batched forward passes over the drafting
requests: round 0 catches each request up from the drafter's last valid position to the sequence end
(the whole prompt the first time, usually one token later) and proposes d1; rounds 1..k-1 feed d_i and
propose d_{i+1}. The target verifies with `speculative.verify_greedy` / `verify_sampled`: a greedy draft
is a deterministic function of the prefix, so rejection sampling against it keeps the target's
distribution exactly (see speculative.py).

Invariants: ``_State.computed`` tokens of a request have valid drafter KV. After a proposal at sequence
length L and a verification that accepted ``a`` drafts, positions < L + min(a, k - 1) are valid (d_i's KV
was written at L + i - 1 for i < k; the target's own token at L + a is not). A request that cannot get
drafter blocks simply gets no draft. ``release`` returns a finished request's drafter blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .batch_layout import attention_meta
from .kv_cache import BlockPool, KVCache
from .kv_manager import KVCacheManager
from .model import Transformer
from .request import Request


@dataclass
class _State:
    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    proposed_at: int = 0   # sequence length L when the last draft was proposed
    proposed: int = 0      # k of the last draft


class DraftModel:
    def __init__(self, model: Transformer, target_vocab: int, num_blocks: int, block_size: int) -> None:
        if model.spec.vocab_size != target_vocab:
            raise ValueError(f"draft model vocabulary {model.spec.vocab_size} differs from the target's "
                             f"{target_vocab}: the drafter must share the target's tokenizer")
        spec = model.spec
        self.model = model
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.kv_manager = KVCacheManager(self.pool, block_size)  # no prefix cache: drafts are private
        self.kv = KVCache(spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_dim,
                          model.dtype, model.device)
        self.states: dict[str, _State] = {}

    def propose(self, reqs: list[Request], ks: list[int]) -> list[list[int]]:
        """k_i greedy draft tokens for each request (fewer or none when the drafter's cache is full)."""
        drafts: list[list[int]] = [[] for _ in reqs]
        active = []
        for i, (req, k) in enumerate(zip(reqs, ks)):
            if k > 0 and self._reserve(req, len(req.token_ids) + k - 1):
                active.append(i)
        if not active:
            return drafts
        # round 0: catch up to the sequence end, propose d1
        spans, ids, pos, rows = [], [], [], []
        for i in active:
            req, st = reqs[i], self.states[reqs[i].request_id]
            # at least the last token: its logits propose d1 (a request that was not scheduled since its
            # last proposal has nothing new, and recomputing that token rewrites the same KV)
            start = min(st.computed, len(req.token_ids) - 1)
            new = req.token_ids[start:]
            spans.append((st.blocks, start, len(new)))
            ids.extend(new)
            pos.extend(range(start, len(req.token_ids)))
            rows.append(len(ids) - 1)
        nxt = self._forward(spans, ids, pos, rows)
        for i, tok in zip(active, nxt):
            st = self.states[reqs[i].request_id]
            st.computed = len(reqs[i].token_ids)
            st.proposed_at, st.proposed = st.computed, ks[i]
            drafts[i].append(tok)
        # rounds 1..k-1: one token each for the requests that want more
        for r in range(1, max(ks[i] for i in active)):
            more = [i for i in active if ks[i] > r]
            spans = [(self.states[reqs[i].request_id].blocks, len(reqs[i].token_ids) + r - 1, 1) for i in more]
            nxt = self._forward(spans, [drafts[i][-1] for i in more],
                                [len(reqs[i].token_ids) + r - 1 for i in more], list(range(len(more))))
            for i, tok in zip(more, nxt):
                drafts[i].append(tok)
        return drafts

    def accepted(self, request_id: str, num_accepted: int) -> None:
        """After verification: the first `num_accepted` drafts are now part of the sequence."""
        st = self.states.get(request_id)
        if st is not None and st.proposed:
            st.computed = st.proposed_at + min(num_accepted, st.proposed - 1)
            st.proposed = 0

    def release(self, request_id: str) -> None:
        st = self.states.pop(request_id, None)
        if st is not None:
            self.kv_manager.release(st.blocks)

    def _reserve(self, req: Request, last_pos: int) -> bool:
        st = self.states.setdefault(req.request_id, _State())
        return self.kv_manager.allocate_slots(st.blocks, last_pos + 1)

    def _forward(self, spans, ids, pos, rows) -> list[int]:
        dev = self.model.device
        meta = attention_meta(spans, self.block_size, dev, self.model.spec.sliding_window)
        logits, _ = self.model.forward(torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta,
                                       self.kv.k, self.kv.v, torch.tensor(rows, dtype=torch.long, device=dev))
        return logits.argmax(-1).tolist()
