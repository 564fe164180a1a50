"""The KV cache's quantized forms (see ``kv_cache.kv_layout``): FP8 bits in uint8 rows (values divided by a
per-model scale, 1.0 unless the checkpoint carries k_scale / v_scale: torch's CPU index_copy_ / index_select have
no float8 kernels), or INT8 codes with each token-and-head row's own fp32 scale appended; reads convert back to
the compute dtype."""
from __future__ import annotations

import torch

from .fp8 import FP8, FP8_MAX


def store(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, scale: float) -> None:
    """x [T, heads, head_dim] into the cache rows `slots`: as is, as FP8 bits (uint8 cache, / scale), or as
    INT8 codes with the row's own scale (int8 cache, see kv_cache.kv_layout)."""
    if cache.dtype == torch.uint8:
        cache.index_copy_(0, slots, (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(torch.uint8))
    elif cache.dtype == torch.int8:
        xf = x.float()
        s = (xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127.0).contiguous()   # per token and head
        codes = torch.round(xf / s).clamp(-127, 127).to(torch.int8)
        cache.index_copy_(0, slots, torch.cat((codes, s.view(torch.int8)), dim=-1))
    else:
        cache.index_copy_(0, slots, x.to(cache.dtype))


def load(cache: torch.Tensor, index: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Cache rows `index` as [N, heads, head_dim] of `dtype`."""
    rows = cache.index_select(0, index)
    if cache.dtype == torch.uint8:
        return (rows.view(FP8).to(torch.float32) * scale).to(dtype)
    if cache.dtype == torch.int8:
        d = rows.shape[-1] - 4
        return (rows[..., :d].float() * rows[..., d:].contiguous().view(torch.float32)).to(dtype)
    return rows.to(dtype)
