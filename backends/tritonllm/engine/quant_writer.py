"""Round-to-nearest integer codes and the published checkpoint packings (the writing side of quant_formats.py).

Used by ``build_scripts/quantize.py`` to write quantized checkpoints and by the tests to build them. The
layouts are the ones quant_formats.py documents and reads; the tests check both sides against a third,
element-by-element dequantizer, so a mistake here cannot hide behind the same mistake there.

- ``rtn(w, cols, bits, symmetric, clip)``: codes over groups of input columns ``cols`` [groups, group_size]
  (contiguous groups, or GPTQ's act order). Scales are rounded to fp16 first, as checkpoints store them,
  so the codes are those a reader of the fp16 scales reconstructs. Asymmetric: zero = round(-lo / s),
  with lo <= 0 <= hi so that 0 is exact; symmetric: zero = 2^(bits-1), s = amax / (2^(bits-1) - 1).
  ``clip`` [out, groups] shrinks each group's range before the scale is taken (AWQ's clip search).
- ``pack_awq``: AutoAWQ GEMM (``qweight`` [in, out/8] int32 with AWQ_ORDER, ``qzeros`` [groups, out/8],
  fp16 ``scales`` [groups, out]); 4-bit only.
- ``pack_gptq``: AutoGPTQ v1 (``qweight`` [in*bits/32, out], ``qzeros`` stored as zero - 1 [groups, out*bits/32],
  ``scales``, ``g_idx``), or GPTQModel's v2 (the zero itself); 4 or 8 bits.
"""
from __future__ import annotations

import torch

from .quant_formats import AWQ_ORDER


def contiguous_groups(k: int, group_size: int) -> torch.Tensor:
    """Input columns [k / group_size, group_size] of groups laid out in order."""
    if group_size == -1:
        group_size = k
    if k % group_size:
        raise ValueError(f"group size {group_size} does not divide the input size {k}")
    return torch.arange(k).reshape(-1, group_size)


def rtn(w: torch.Tensor, cols: torch.Tensor, bits: int = 4, symmetric: bool = False,
        clip: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes [out, in] int64 (at the model's input positions, 0 .. 2^bits - 1), scales and zeros [out, groups]."""
    qmax = (1 << bits) - 1
    g = w.float()[:, cols]                                                  # [out, groups, group]
    if symmetric:
        amax = g.abs().amax(dim=2)
        if clip is not None:
            amax = amax * clip
        s = (amax / (qmax // 2)).half().float().clamp(min=2.0 ** -24)     # fp16's smallest: stored as is
        z = torch.full_like(s, float((qmax + 1) // 2))
    else:
        lo, hi = g.amin(dim=2).clamp(max=0), g.amax(dim=2).clamp(min=0)
        if clip is not None:
            lo, hi = lo * clip, hi * clip
        s = ((hi - lo) / qmax).half().float().clamp(min=2.0 ** -24)
        z = torch.round(-lo / s).clamp(0, qmax)
    q = torch.round(g / s[..., None] + z[..., None]).clamp(0, qmax)
    codes = torch.empty(w.shape, dtype=torch.int64)
    codes[:, cols.reshape(-1)] = q.reshape(w.shape[0], -1).to(torch.int64)
    return codes, s, z


def dequantize(codes: torch.Tensor, s: torch.Tensor, z: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The float weight [out, in] of rtn's output."""
    w = torch.empty(codes.shape)
    g = codes[:, cols].float()
    w[:, cols.reshape(-1)] = ((g - z[..., None]) * s[..., None]).reshape(codes.shape[0], -1)
    return w


def _pack_cols(v: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """[rows, per * c] -> int32 [rows, c], per = 32 / bits: field i of column c holds v[:, per * c + order[i]]."""
    per = 32 // bits
    order = tuple(range(per)) if order is None else order
    out = torch.zeros(v.shape[0], v.shape[1] // per, dtype=torch.int64)
    for i, o in enumerate(order):
        out |= v[:, o::per].to(torch.int64) << (bits * i)
    return _int32(out)


def _int32(v: torch.Tensor) -> torch.Tensor:
    """Low 32 bits as int32 (a field in the top bits sets the sign, as the packers' int32 arithmetic does)."""
    return ((v + (1 << 31)) % (1 << 32) - (1 << 31)).to(torch.int32)


def pack_awq(codes: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> dict:
    return {"qweight": _pack_cols(codes.t(), 4, AWQ_ORDER), "qzeros": _pack_cols(z.to(torch.int64).t(), 4, AWQ_ORDER),
            "scales": s.t().half().contiguous()}


def pack_gptq(codes: torch.Tensor, s: torch.Tensor, z: torch.Tensor, g_idx: torch.Tensor, bits: int = 4,
              v2: bool = False) -> dict:
    """v1 stores zero - 1 (a zero point of 0 cannot be stored: it would read back as 2^bits), v2 the zero."""
    if not v2 and bool((z < 1).any()):
        raise ValueError("GPTQ v1 stores zero - 1: a zero point of 0 cannot be stored (write checkpoint_format gptq_v2)")
    per = 32 // bits
    rows = codes.t()                                                        # [in, out]
    qweight = torch.zeros(rows.shape[0] // per, rows.shape[1], dtype=torch.int64)
    for j in range(per):
        qweight |= rows[j::per] << (bits * j)
    return {"qweight": _int32(qweight), "qzeros": _pack_cols((z - (0 if v2 else 1)).to(torch.int64).t(), bits),
            "scales": s.t().half().contiguous(), "g_idx": g_idx.to(torch.int32)}


def g_idx_of(cols: torch.Tensor) -> torch.Tensor:
    """GPTQ's g_idx [in]: the group of each input column."""
    g = torch.empty(cols.numel(), dtype=torch.int32)
    g[cols.reshape(-1)] = torch.arange(cols.shape[0], dtype=torch.int32).repeat_interleave(cols.shape[1])
    return g
