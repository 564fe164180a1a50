"""INT8 and INT4 weights: round-to-nearest quantization, the packed layouts, dequantization, and the matmul.

- ``Int8Weight``: symmetric per output channel: codes -127..127, ``d = amax(row) / 127``; weight = d * q
  (``quantization: int8``); from a checkpoint's 8-bit groups, codes -128..127 with a scale and a zero share
  per 32-element block (``from_codes``).
- ``Int4Weight``: per group of ``group_size`` (32, 64 or 128) along K: codes 0..15, weight = d * (q - z);
  asymmetric (``z`` from the group's min and max, as AWQ / GPTQ with zeros) or symmetric (``z = 8``,
  ``d = amax / 7``). Stored for the native kernel with 8 rows interleaved per 32-element block (the class
  docstring), ``d`` and ``m = -d * z`` per block (a group of 64 / 128 repeats its d and m over its blocks).

``matmul(x, b)`` on fp32 CPU with the native kernels (``cpu_kernels`` auto / native):
- ``activation_quantization: int8`` (``auto`` on a GGUF file's tensors: loader.activation_mode), at every row
  count: ``csrc/qgemm_cpu.cpp`` multiplies with int8 dot products, the activations quantized per row and 32-element
  block to int8 (d = amax / 127), as llama.cpp's quantized matmuls do (a 512-row prefill: 2.8-4.1x oneDNN's fp32
  GEMM over the dequantized weight). That rounding is the only difference from the float matmul of the dequantized
  weights: per output it is at most sum_k |w_k| d_k / 2 (tests bound it).
- fp32 activations (``none``), up to ``cpu_kernels.TILE_MAX_ROWS`` rows:
  ``csrc/qgemm_f32_cpu.cpp``, the codes widened in registers (fewer than 8 rows) or dequantized once per 16
  weight rows into an fp32 tile that every row multiplies: the float matmul of the dequantized weights up to
  summation order.
- longer prefills: the weight dequantized natively, then oneDNN's fp32 GEMM.
Other dtypes or devices and ``cpu_kernels: torch`` dequantize in torch: exactly the float model either way.
(quant_packed.Packed chooses among these for every layout; quant_nbit.IntNWeight is the 5- / 6-bit one.)
"""
from __future__ import annotations

import torch

from .quant_packed import QK, Packed, RowStack, block_scales, check_factors, interleave, pad_rows, row_scales

MODES = ("int8", "int4")
GROUP_SIZES = (32, 64, 128)
class Int8Weight(Packed):
    """int8 codes (-128..127) and either one scale per output channel (weight = d * q: what
    ``quantization: int8`` makes) or, from a checkpoint's 8-bit groups, a scale and a zero share per row and
    32-element block (weight = d * q + m). Stored for the native kernel (``linear_q8x8``) with 8 rows
    interleaved: rows in groups of 8 (the last padded with zero rows), per group and block 8 chunks of 32
    bytes, byte 4r + j of chunk t holding row r's code for input 4t + j; inputs padded with zeros to a
    multiple of 32. ``q``, ``d``, ``m`` give them back per row."""

    TENSORS = ("qx", "dx", "mx")
    KERNELS = ("linear_q8x8", "linear_q8x8_f32")

    def __init__(self, w: torch.Tensor, native=None) -> None:
        w = w.float()
        d = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w / d[:, None]).clamp(-127, 127).to(torch.int8)
        self._set(q, d, None, w.shape[1], native)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, d: torch.Tensor, z: torch.Tensor | None, group_size: int,
                   perm: torch.Tensor | None = None, native=None) -> "Int8Weight":
        """A checkpoint's unsigned codes [N, K] (0..255), scales and zero points [N, K / group_size]: weight =
        d * (codes - z). Stored as signed codes (codes - 128) with m = d * (128 - z); symmetric one-group rows
        (z = 128 everywhere, group = K) keep one scale per channel."""
        n, k = codes.shape
        if k % group_size:
            raise ValueError(f"int8 groups of {group_size} do not divide the input size {k}")
        q = (codes.to(torch.int16) - 128).to(torch.int8)
        d = d.float().reshape(n, k // group_size)
        zero_share = None if z is None else d * (128.0 - z.float().reshape(n, k // group_size))
        if zero_share is not None and not zero_share.any():  # symmetric: no zero points' share to add
            zero_share = None
        self = cls.__new__(cls)
        if group_size == k and zero_share is None:
            self._set(q, d.reshape(n), None, group_size, native)
        elif group_size % QK:
            raise ValueError(f"int8 groups of {group_size} with their own scales: need a multiple of 32")
        else:
            rep = group_size // QK
            self._set(q, d.repeat_interleave(rep, dim=1),
                      None if zero_share is None else zero_share.repeat_interleave(rep, dim=1), group_size, native)
        self.perm = None if perm is None else perm.to(torch.long)
        return self

    @classmethod
    def from_blocks(cls, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, native=None) -> "Int8Weight":
        """Signed codes [N, K] with a scale per 32-element block (d [N, K / 32], weight = d * q + m, m [N, K / 32]
        or None) or per 16-element half block (d [N, K / 16], no m): GGUF's Q8_0 / Q5_x / Q6_K blocks as they are."""
        n, k = codes.shape
        if k % QK or d.shape not in ((n, k // QK), (n, 2 * k // QK)) or (m is not None and m.shape != (n, k // QK)) \
                or (m is not None and d.shape[1] != k // QK):
            raise ValueError(f"int8 blocks: codes {list(codes.shape)} with scales {list(d.shape)}"
                             f"{'' if m is None else f' and shifts {list(m.shape)}'} do not fit")
        self = cls.__new__(cls)
        self._set(codes, d, m, k // d.shape[1], native)
        return self

    def _set(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, group_size: int, native) -> None:
        """q [N, K] signed codes; d [N] (per row), [N, K / 32] with m [N, K / 32] or None, or [N, K / 16]
        (half blocks: the kernel's two accumulators per block) without m."""
        n, k = q.shape
        self.shape, self.group_size, self.perm = (n, k), group_size, None
        self.native = native if k % QK == 0 else None
        groups, kp = -(-n // 8), -(-k // QK) * QK
        q = pad_rows(q.to(torch.int8), groups)
        if kp != k:
            q = torch.cat((q, q.new_zeros(q.shape[0], kp - k)), dim=1)
        self.qx = interleave(q, 8).reshape(groups, kp // QK, 8, 32).contiguous()
        self._store_scales(pad_rows(d.float(), groups).reshape(groups, 8) if d.dim() == 1 else block_scales(d, groups),
                           None if m is None else block_scales(m, groups))

    @classmethod
    def _repack(cls, parts: list):
        first = parts[0]
        self = cls.__new__(cls)
        self._set(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]),
                  None if first.mx is None else torch.cat([p.m for p in parts]), first.group_size, first.native)
        self.perm = first.perm
        return self

    def layout(self) -> tuple:
        return (self.dx.dim(), self.mx is not None, self.group_size if self.dx.dim() == 3 else None,
                self.dx.shape[1] if self.dx.dim() == 3 else None)

    @property
    def q(self) -> torch.Tensor:
        """Signed codes [N, K], in the stored input order."""
        n, k = self.shape
        g, nb = self.qx.shape[:2]
        return self.qx.reshape(g, nb, 8, 8, 4).permute(0, 3, 1, 2, 4).reshape(g * 8, nb * QK)[:n, :k]

    @property
    def d(self) -> torch.Tensor:
        """Scales [N] (per row), [N, K / 32] (per row and block) or [N, K / 16] (per half block), fp32."""
        n = self.shape[0]
        return (self.dx.reshape(-1)[:n] if self.dx.dim() == 2 else row_scales(self.dx, n)).float()

    @property
    def m(self) -> torch.Tensor | None:
        return None if self.mx is None else row_scales(self.mx, self.shape[0]).float()

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._in_model_order(self._values(self.q, self.d, self.m)).to(dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float rows ``ids`` of the weight (a quantized embedding's lookup), as ``dequant()[ids]``."""
        g, r = ids // 8, ids % 8
        nb = self.qx.shape[1]
        q = self.qx.view(self.qx.shape[0], nb, 8, 8, 4)[g, :, :, r, :].reshape(len(ids), nb * QK)[:, :self.shape[1]]
        d = (self.dx[g, r] if self.dx.dim() == 2 else self.dx[g, :, r]).float()
        m = None if self.mx is None else self.mx[g, :, r].float()
        return self._in_model_order(self._values(q, d, m)).to(dtype)

    @staticmethod
    def _values(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        """codes [R, K] * scales (per row [R] or per block [R, K / block]) + shifts [R, K / 32]: the kernels'
        formula, one rounding per weight."""
        n, k = q.shape
        q = q.float()
        if d.dim() == 1:
            return q * d[:, None]
        w = (q.reshape(n, d.shape[1], -1) * d[..., None]).reshape(n, k)
        return w if m is None else (w.reshape(n, m.shape[1], -1) + m[..., None]).reshape(n, k)

    @property
    def nbytes(self) -> int:
        """Bytes held: codes (with padding) and scales, as stored."""
        return sum(t.numel() * t.element_size() for t in (self.qx, self.dx, self.mx) if t is not None)


class Int4Weight(Packed):
    """Codes 0..15 with a scale d and a zero share m = -d * z per row and 32-element block (a group of 64 / 128
    repeats its pair over its blocks), stored for the native kernel (``linear_q4x8``) with 8 rows interleaved:
    rows in groups of 8 (the last padded with zero rows), per group and block 4 chunks of 32 bytes, byte
    4r + j of chunk t holding row r's code for input 4t + j in the low nibble and 4(t + 4) + j in the high
    one; ``dx``, ``mx`` [groups, blocks, 8] (a Q4_K file's as int8 codes with ``dsup``, ``msup`` [groups, K / 256,
    8]). ``d``, ``m`` and ``codes()`` give them back per row."""

    TENSORS = ("qx", "dx", "mx", "dsup", "msup")
    KERNELS = ("linear_q4x8", "linear_q4x8_f32")

    def __init__(self, w: torch.Tensor, group_size: int = 32, symmetric: bool = False, native=None) -> None:
        if group_size not in GROUP_SIZES:
            raise ValueError(f"quant_group_size must be one of {GROUP_SIZES}, got {group_size}")
        w = w.float()
        n, k = w.shape
        if k % group_size:
            raise ValueError(f"int4 needs the input size ({k}) to be a multiple of quant_group_size ({group_size})")
        g = w.reshape(n, k // group_size, group_size)
        if symmetric:
            d = g.abs().amax(dim=2).clamp(min=1e-12) / 7.0
            z = torch.full_like(d, 8.0)
        else:
            lo, hi = g.amin(dim=2).clamp(max=0.0), g.amax(dim=2).clamp(min=0.0)  # 0 exactly representable
            d = ((hi - lo) / 15.0).clamp(min=1e-12)
            z = torch.round(-lo / d).clamp(0, 15)
        q = torch.round(g / d[..., None] + z[..., None]).clamp(0, 15).to(torch.uint8).reshape(n, k)
        rep = group_size // QK
        self._set(q, d.repeat_interleave(rep, dim=1), (-d * z).repeat_interleave(rep, dim=1), group_size, native)
        self.symmetric = symmetric

    @classmethod
    def from_codes(cls, codes: torch.Tensor, d: torch.Tensor, z: torch.Tensor, group_size: int,
                   perm: torch.Tensor | None = None, native=None) -> "Int4Weight":
        """A checkpoint's own codes [N, K] (0..15), scales and zero points [N, K / group_size]: weight =
        d * (codes - z). ``perm``: the input order the codes are stored in (GPTQ act-order), so that
        x[:, perm] @ W^T is the product; groups are contiguous in that order."""
        n, k = codes.shape
        if group_size % QK or k % group_size:
            raise ValueError(f"int4 groups of {group_size} over {k} inputs: need a multiple of 32 dividing the input size")
        self = cls.__new__(cls)
        rep = group_size // QK
        d, z = d.float(), z.float()
        self._set(codes.to(torch.uint8), d.repeat_interleave(rep, dim=1), (-d * z).repeat_interleave(rep, dim=1),
                  group_size, native)
        self.perm = None if perm is None else perm.to(torch.long).contiguous()
        return self

    @classmethod
    def from_blocks(cls, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, native=None,
                    factors: tuple | None = None) -> "Int4Weight":
        """Codes [N, K] (0..15) with d and m [N, K / 32] per 32-element block (weight = d * q + m): GGUF's Q4_0 /
        Q4_1 / Q4_K blocks as they are; ``factors`` (Q4_K): d and m as the file factors them (check_factors)."""
        n, k = codes.shape
        if k % QK or d.shape != (n, k // QK) or m.shape != (n, k // QK):
            raise ValueError(f"int4 blocks: codes {list(codes.shape)} with scales {list(d.shape)} and shifts "
                             f"{list(m.shape)} do not fit")
        self = cls.__new__(cls)
        self._set(codes, d, m, QK, native, check_factors(d, m, factors))
        return self

    def _set(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, group_size: int, native,
             factors: tuple | None = None) -> None:
        """q [N, K] codes, d and m [N, K / 32] per block (or their checked factors)."""
        n, k = q.shape
        self.shape, self.group_size, self.symmetric, self.native, self.perm = (n, k), group_size, False, native, None
        groups, nb = -(-n // 8), k // QK
        c = interleave(pad_rows(q.to(torch.uint8), groups), 8)                # [G, nb, t, r, j]
        self.qx = (c[:, :, :4] | (c[:, :, 4:] << 4)).reshape(groups, nb, 4, 32).contiguous()
        if factors is not None:
            dq, dsup, mq, msup = (None if f is None else block_scales(f, groups) for f in factors)
            self._store_scales(dq, mq, dsup, msup)
        else:
            self._store_scales(block_scales(d, groups), block_scales(m, groups))

    def kernel_args(self) -> tuple[tuple, tuple]:
        return (self.qx,), (self.dsup, self.msup)

    @classmethod
    def _repack(cls, parts: list):
        self = cls.__new__(cls)
        self._set(torch.cat([p.codes() for p in parts]), torch.cat([p.d for p in parts]),
                  torch.cat([p.m for p in parts]), parts[0].group_size, parts[0].native)
        self.perm, self.symmetric = parts[0].perm, parts[0].symmetric
        return self

    def layout(self) -> tuple:
        return (self.group_size, self.dsup is not None)

    @property
    def d(self) -> torch.Tensor:
        """Scales [N, K / 32], per row and block, fp32."""
        return row_scales(self._scale_values(self.dx, self.dsup), self.shape[0])

    @property
    def m(self) -> torch.Tensor:
        return row_scales(self._scale_values(self.mx, self.msup), self.shape[0])

    def codes(self) -> torch.Tensor:
        """The unpacked codes [N, K] (0..15), in the stored input order."""
        n, k = self.shape
        p = self.qx.reshape(self.qx.shape[0], k // QK, 4, 8, 4)
        c = torch.cat((p & 0x0F, p >> 4), dim=2)                                     # [G, nb, t, r, j]
        return c.permute(0, 3, 1, 2, 4).reshape(-1, k)[:n]

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [N, K] in the model's input order."""
        return self._in_model_order(self._values(self.codes(), self.d, self.m)).to(dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float rows ``ids`` of the weight (a quantized embedding's lookup), as ``dequant()[ids]``."""
        g, r = ids // 8, ids % 8
        nb = self.qx.shape[1]
        p = self.qx.view(self.qx.shape[0], nb, 4, 8, 4)[g, :, :, r, :]                # [R, nb, t, j]
        q = torch.cat((p & 0x0F, p >> 4), dim=2).reshape(len(ids), nb * QK)
        d, m = self._scale_rows(self.dx, self.dsup, g, r), self._scale_rows(self.mx, self.msup, g, r)
        return self._in_model_order(self._values(q, d, m)).to(dtype)

    @staticmethod
    def _values(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        n, k = q.shape
        return (q.float().reshape(n, k // QK, QK) * d[..., None] + m[..., None]).reshape(n, k)

    @property
    def nbytes(self) -> int:
        """Bytes held: packed codes (with padding) and scales, as stored (a group of 64 / 128 repeats its pair per
        32-block)."""
        return sum(t.numel() * t.element_size() for t in (self.qx, self.dx, self.mx, self.dsup, self.msup)
                   if t is not None)


def quantize(w: torch.Tensor, mode: str, group_size: int = 32, symmetric: bool = False, native=None):
    if mode == "int8":
        return Int8Weight(w, native)
    if mode == "int4":
        return Int4Weight(w, group_size, symmetric, native)
    raise ValueError(f"quantization mode must be one of {MODES}, got {mode!r}")
