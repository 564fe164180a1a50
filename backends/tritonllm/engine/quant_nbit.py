"""5- and 6-bit codes, packed: GGUF's Q5_0 / Q5_1 / Q5_K and Q6_K blocks held at the file's 5.5 to 6.6 bits a weight
(codes and scales, the K-quants' scales factored as the file has them) rather than as int8 codes (8.5 and 10): a
decode step reads every weight once, so its time is their bytes.

``IntNWeight``: codes 0 .. 2^bits - 1 with a fixed offset ``zero``: weight = d * (q - zero) (+ m). 5-bit: d and m
(or none) per row and 32-element block (Q5_0: zero 16; Q5_1, Q5_K: zero 0 and m); 6-bit: d per row and 16-element
half block, no m (Q6_K: zero 32). The native kernels (csrc/qgemm_nbit_cpu.cpp) compute exactly what the same weights
held as signed int8 codes give (Int8Weight.from_blocks): the offset leaves the integer sums exactly, and the scales
apply in the same order.
"""
from __future__ import annotations

import torch

from .quant_packed import QK, Packed, block_scales, check_factors, interleave, pad_rows, row_scales

BITS = (5, 6)


class IntNWeight(Packed):
    """Stored for the native kernels with 8 rows interleaved as Int4Weight: ``qx`` [G, nb, 4, 32] the codes' low
    nibbles in Int4Weight's layout; ``hx`` [G, nb, bits - 4, 32] their high bits: plane p holds chunks p * per ..
    p * per + per - 1 (per = 8 / (bits - 4)), chunk t at bits (bits - 4) * (t % per) of byte 4r + j (row r's code
    for input 4t + j); ``dx`` [G, nb or 2 nb, 8], ``mx`` [G, nb, 8] or None. ``codes()``, ``d``, ``m`` give them
    back per row."""

    TENSORS = ("qx", "hx", "dx", "mx", "dsup", "msup")
    KERNELS = ("linear_nbit", "linear_nbit_f32")
    DEQUANT = "dequant_nbit"

    @classmethod
    def from_blocks(cls, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, bits: int, zero: int,
                    native=None, factors: tuple | None = None) -> "IntNWeight":
        """Codes [N, K] (0 .. 2^bits - 1); 5-bit: d [N, K / 32] and m [N, K / 32] or None; 6-bit: d [N, K / 16];
        ``factors`` (Q5_K, Q6_K): d and m as the file factors them (quant.check_factors)."""
        n, k = codes.shape
        if bits not in BITS or not 0 <= zero < 1 << bits:
            raise ValueError(f"{bits}-bit codes with offset {zero}: bits must be one of {BITS}, the offset a code")
        per = 16 if bits == 6 else QK
        if k % QK or d.shape != (n, k // per) or (m is not None and (bits == 6 or m.shape != (n, k // QK))):
            raise ValueError(f"{bits}-bit blocks: codes {list(codes.shape)} with scales {list(d.shape)}"
                             f"{'' if m is None else f' and shifts {list(m.shape)}'} do not fit")
        if codes.numel() and int(codes.max()) >> bits:
            raise ValueError(f"{bits}-bit blocks: a code above {(1 << bits) - 1}")
        self = cls.__new__(cls)
        self.bits, self.zero = bits, int(zero)
        self._set(codes, d, m, native, check_factors(d, m, factors))
        return self

    def _set(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, native, factors=None) -> None:
        n, k = q.shape
        self.shape, self.group_size, self.native, self.perm = (n, k), QK, native, None
        groups, nb, hb = -(-n // 8), k // QK, self.bits - 4
        per = 8 // hb
        c = interleave(pad_rows(q.to(torch.uint8), groups), 8)                # [G, nb, t, r, j]
        self.qx = ((c[:, :, :4] & 0x0F) | ((c[:, :, 4:] & 0x0F) << 4)).reshape(groups, nb, 4, 32).contiguous()
        high = (c >> 4).to(torch.int32).reshape(groups, nb, hb, per, 8, 4)     # chunk t = p * per + s
        shifts = (torch.arange(per, dtype=torch.int32) * hb).view(1, 1, 1, per, 1, 1)
        self.hx = (high << shifts).sum(dim=3).to(torch.uint8).reshape(groups, nb, hb, 32).contiguous()
        if factors is not None:
            dq, dsup, mq, msup = (None if f is None else block_scales(f, groups) for f in factors)
            self._store_scales(dq, mq, dsup, msup)
        else:
            self._store_scales(block_scales(d, groups), None if m is None else block_scales(m, groups))

    def kernel_args(self) -> tuple[tuple, tuple]:
        return (self.qx, self.hx), (self.zero, self.dsup, self.msup)

    @classmethod
    def _repack(cls, parts: list):
        first = parts[0]
        self = cls.__new__(cls)
        self.bits, self.zero = first.bits, first.zero
        self._set(torch.cat([p.codes() for p in parts]), torch.cat([p.d for p in parts]),
                  None if first.mx is None else torch.cat([p.m for p in parts]), first.native)
        return self

    def layout(self) -> tuple:
        return (self.bits, self.zero, self.mx is not None, self.dsup is not None)

    @property
    def d(self) -> torch.Tensor:
        """Scales [N, K / 32] (5-bit) or [N, K / 16] (6-bit), fp32."""
        return row_scales(self._scale_values(self.dx, self.dsup), self.shape[0])

    @property
    def m(self) -> torch.Tensor | None:
        return None if self.mx is None else row_scales(self._scale_values(self.mx, self.msup), self.shape[0])

    def _unpack(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """lo [R, nb, 4, 4] and hi [R, nb, bits - 4, 4] (a row's bytes per chunk) -> codes [R, nb * 32]."""
        hb = self.bits - 4
        per = 8 // hb
        t = torch.arange(8)
        high = (hi[:, :, t // per].to(torch.int32) >> ((t % per) * hb).view(1, 1, 8, 1)) & ((1 << hb) - 1)
        low = torch.cat((lo & 0x0F, lo >> 4), dim=2).to(torch.int32)              # [R, nb, t, j]
        return (low | (high << 4)).to(torch.uint8).reshape(lo.shape[0], -1)

    def codes(self) -> torch.Tensor:
        """The unpacked codes [N, K] (0 .. 2^bits - 1)."""
        n, k = self.shape
        g, nb = self.qx.shape[:2]
        lo = self.qx.view(g, nb, 4, 8, 4).permute(0, 3, 1, 2, 4).reshape(g * 8, nb, 4, 4)
        hi = self.hx.view(g, nb, self.bits - 4, 8, 4).permute(0, 3, 1, 2, 4).reshape(g * 8, nb, self.bits - 4, 4)
        return self._unpack(lo, hi)[:n, :k]

    def _values(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        """(q - zero) * d per block or half block, then + m per block: the kernels' values, bit for bit."""
        n, k = q.shape
        w = ((q.float() - self.zero).reshape(n, d.shape[1], -1) * d[..., None]).reshape(n, k)
        return w if m is None else (w.reshape(n, m.shape[1], -1) + m[..., None]).reshape(n, k)

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._values(self.codes(), self.d, self.m).to(dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float rows ``ids`` of the weight (a quantized embedding's lookup), as ``dequant()[ids]``."""
        g, r = ids // 8, ids % 8
        nb, hb = self.qx.shape[1], self.bits - 4
        lo = self.qx.view(self.qx.shape[0], nb, 4, 8, 4)[g, :, :, r, :]
        hi = self.hx.view(self.hx.shape[0], nb, hb, 8, 4)[g, :, :, r, :]
        m = None if self.mx is None else self._scale_rows(self.mx, self.msup, g, r)
        return self._values(self._unpack(lo, hi)[:, :self.shape[1]], self._scale_rows(self.dx, self.dsup, g, r),
                            m).to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held: packed codes (with padding) and scales, as stored."""
        return sum(t.numel() * t.element_size() for t in (self.qx, self.hx, self.dx, self.mx, self.dsup, self.msup)
                   if t is not None)
