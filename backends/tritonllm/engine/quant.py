"""INT8 and INT4 weights: round-to-nearest quantization, the packed layouts, dequantization, and the matmul.

- ``Int8Weight``: symmetric per output channel: codes -127..127, ``d = amax(row) / 127``; weight = d * q
  (``quantization: int8``); from a checkpoint's 8-bit groups, codes -128..127 with a scale and a zero share
  per 32-element block (``from_codes``).
- ``Int4Weight``: per group of ``group_size`` (32, 64 or 128) along K: codes 0..15, weight = d * (q - z);
  asymmetric (``z`` from the group's min and max, as AWQ / GPTQ with zeros) or symmetric (``z = 8``,
  ``d = amax / 7``). Stored for the native kernel with 8 rows interleaved per 32-element block (the class
  docstring), ``d`` and ``m = -d * z`` per block (a group of 64 / 128 repeats its d and m over its blocks).

``matmul(x, b)``: with the native kernels (fp32 CPU, ``cpu_kernels`` auto / native) and at most
``cpu_kernels.MAX_ROWS`` rows, ``csrc/qgemm_cpu.cpp`` multiplies with int8 dot products, the activations
quantized per row and 32-element block to int8 (d = amax / 127). That rounding is the only difference from
the float matmul of the dequantized weights: per output it is at most sum_k |w_k| d_k / 2 (tests bound it).
Otherwise (prefill, other dtypes or devices, ``cpu_kernels: torch``) the weight is dequantized to the
compute dtype for the call and multiplied by torch: exactly the float model of the dequantized weights.
"""
from __future__ import annotations

import torch

from .cpu_kernels import native_rows

MODES = ("int8", "int4")
GROUP_SIZES = (32, 64, 128)
QK = 32  # the native kernels' block


class _Packed:
    """What Int8Weight and Int4Weight share: the stored input order (``perm``, GPTQ act order: x[:, perm] @ W^T
    is the product), fusing rows over one input (``cat``), moving to a device."""

    perm = None
    TENSORS: tuple[str, ...] = ()

    @classmethod
    def cat(cls, parts: list):
        """Rows of several weights over the same input (fused q/k/v, gate/up): one weight of this class, or a
        RowStack when the parts differ in layout (input order, group size, per-channel vs per-group scales)."""
        first = parts[0]
        if any(type(p) is not cls or p.shape[1] != first.shape[1] for p in parts):
            raise ValueError("fused quantized weights need the same type and input size")
        same = all(p.layout() == first.layout() for p in parts) and all(
            (p.perm is None and first.perm is None) or
            (p.perm is not None and first.perm is not None and torch.equal(p.perm, first.perm)) for p in parts)
        if not same:
            return RowStack(parts)
        return cls._fuse(parts)

    @classmethod
    def _fuse(cls, parts: list):
        """Parts of the same layout and input order, stacked row-wise."""
        self = cls.__new__(cls)
        self.__dict__.update(parts[0].__dict__)
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        for name in self.TENSORS:
            if getattr(parts[0], name) is not None:
                setattr(self, name, torch.cat([getattr(p, name) for p in parts]).contiguous())
        return self

    def to(self, device: torch.device):
        for name in self.TENSORS:
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        self.perm = None if self.perm is None else self.perm.to(device)
        return self

    def _in_model_order(self, w: torch.Tensor) -> torch.Tensor:
        return w if self.perm is None else torch.empty_like(w).index_copy_(1, self.perm, w)

    def _stored_order(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.perm is None else x.index_select(1, self.perm)


class Int8Weight(_Packed):
    """int8 codes q [N, K] (-128..127) and either one scale per output channel (d [N], weight = d * q: what
    ``quantization: int8`` makes) or, from a checkpoint's 8-bit groups, scales d and zero shares m per
    32-element block (d, m [N, K / 32], weight = d * q + m)."""

    TENSORS = ("q", "d", "m")

    def __init__(self, w: torch.Tensor, native=None) -> None:
        w = w.float()
        self.shape = tuple(w.shape)
        self.d = (w.abs().amax(dim=1).clamp(min=1e-12) / 127.0).contiguous()
        self.q = torch.round(w / self.d[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.m, self.group_size = None, w.shape[1]
        self.native = native if w.shape[1] % QK == 0 else None

    @classmethod
    def from_codes(cls, codes: torch.Tensor, d: torch.Tensor, z: torch.Tensor | None, group_size: int,
                   perm: torch.Tensor | None = None, native=None) -> "Int8Weight":
        """A checkpoint's unsigned codes [N, K] (0..255), scales and zero points [N, K / group_size]: weight =
        d * (codes - z). Stored as signed codes (codes - 128) with m = d * (128 - z); symmetric one-group rows
        (z = 128 everywhere, group = K) keep one scale per channel."""
        n, k = codes.shape
        if k % group_size:
            raise ValueError(f"int8 groups of {group_size} do not divide the input size {k}")
        self = cls.__new__(cls)
        self.shape, self.group_size, self.perm = (n, k), group_size, None if perm is None else perm.to(torch.long)
        self.q = (codes.to(torch.int16) - 128).to(torch.int8).contiguous()
        d = d.float().reshape(n, k // group_size)
        zero_share = None if z is None else d * (128.0 - z.float().reshape(n, k // group_size))
        if zero_share is not None and not zero_share.any():  # symmetric: no zero points' share to add
            zero_share = None
        if group_size == k and zero_share is None:
            self.d, self.m = d.reshape(n).contiguous(), None
        elif group_size % QK:
            raise ValueError(f"int8 groups of {group_size} with their own scales: need a multiple of 32")
        else:
            rep = group_size // QK
            self.d = d.repeat_interleave(rep, dim=1).contiguous()
            self.m = None if zero_share is None else zero_share.repeat_interleave(rep, dim=1).contiguous()
        self.native = native if k % QK == 0 else None
        return self

    def layout(self) -> tuple:
        return (self.d.dim(), self.m is not None, self.group_size if self.d.dim() == 2 else None)

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.d.dim() == 1:
            w = self.q.float() * self.d[:, None]
        else:
            n, k = self.shape
            w = self.q.float().reshape(n, k // QK, QK) * self.d[..., None]
            if self.m is not None:
                w = w + self.m[..., None]
            w = w.reshape(n, k)
        return self._in_model_order(w).to(dtype)

    def matmul(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.native is not None and native_rows(x):
            return self.native.linear_q8(self._stored_order(x).contiguous(), self.q, self.d, self.m, b)
        return _torch_linear(x, self.dequant(x.dtype), b)

    @property
    def nbytes(self) -> int:
        extra = self.d.numel() + (0 if self.m is None else self.m.numel())  # per group, repeated per block
        return self.q.numel() + extra * 4 // (1 if self.d.dim() == 1 else self.group_size // QK)


class Int4Weight(_Packed):
    """Codes 0..15 with a scale d and a zero share m = -d * z per row and 32-element block (a group of 64 / 128
    repeats its pair over its blocks), stored for the native kernel (``linear_q4x8``) with 8 rows interleaved:
    rows in groups of 8 (the last padded with zero rows), per group and block 4 chunks of 32 bytes, byte
    4r + j of chunk t holding row r's code for input 4t + j in the low nibble and 4(t + 4) + j in the high
    one; ``dx``, ``mx`` [groups, blocks, 8]. ``d``, ``m`` and ``codes()`` give them back per row."""

    TENSORS = ("qx", "dx", "mx")

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

    def _set(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, group_size: int, native) -> None:
        """q [N, K] codes, d and m [N, K / 32] per block."""
        n, k = q.shape
        self.shape, self.group_size, self.symmetric, self.native, self.perm = (n, k), group_size, False, native, None
        groups, nb = -(-n // 8), k // QK
        pad = groups * 8 - n
        if pad:
            q = torch.cat((q, q.new_zeros(pad, k)))
            d, m = (torch.cat((t, t.new_zeros(pad, nb))) for t in (d, m))
        c = q.to(torch.uint8).reshape(groups, 8, nb, 8, 4).permute(0, 2, 3, 1, 4)   # [G, nb, t, r, j]
        self.qx = (c[:, :, :4] | (c[:, :, 4:] << 4)).reshape(groups, nb, 4, 32).contiguous()
        self.dx = d.float().reshape(groups, 8, nb).transpose(1, 2).contiguous()
        self.mx = m.float().reshape(groups, 8, nb).transpose(1, 2).contiguous()

    @classmethod
    def _fuse(cls, parts: list):
        if all(p.shape[0] % 8 == 0 for p in parts):  # whole groups: the interleaved layouts stack as they are
            return super()._fuse(parts)
        self = cls.__new__(cls)
        self._set(torch.cat([p.codes() for p in parts]), torch.cat([p.d for p in parts]),
                  torch.cat([p.m for p in parts]), parts[0].group_size, parts[0].native)
        self.perm, self.symmetric = parts[0].perm, parts[0].symmetric
        return self

    def layout(self) -> tuple:
        return (self.group_size,)

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2).reshape(-1, t.shape[1])[: self.shape[0]]

    @property
    def d(self) -> torch.Tensor:
        """Scales [N, K / 32], per row and block."""
        return self._rows(self.dx)

    @property
    def m(self) -> torch.Tensor:
        return self._rows(self.mx)

    def codes(self) -> torch.Tensor:
        """The unpacked codes [N, K] (0..15), in the stored input order."""
        n, k = self.shape
        p = self.qx.reshape(self.qx.shape[0], k // QK, 4, 8, 4)
        c = torch.cat((p & 0x0F, p >> 4), dim=2)                                     # [G, nb, t, r, j]
        return c.permute(0, 3, 1, 2, 4).reshape(-1, k)[:n]

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [N, K] in the model's input order."""
        n, k = self.shape
        q = self.codes().float().reshape(n, k // QK, QK)
        return self._in_model_order((q * self.d[..., None] + self.m[..., None]).reshape(n, k)).to(dtype)

    def matmul(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.native is not None and native_rows(x):
            return self.native.linear_q4x8(self._stored_order(x).contiguous(), self.qx, self.dx, self.mx, b,
                                           self.shape[0])
        return _torch_linear(x, self.dequant(x.dtype), b)

    @property
    def nbytes(self) -> int:
        n, k = self.shape
        return n * k // 2 + n * (k // QK) * 8 // (self.group_size // QK)


class RowStack:
    """Weights over one input whose outputs are concatenated: y = [x W_1^T, x W_2^T, ...]."""

    def __init__(self, parts: list) -> None:
        self.parts = parts
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])

    @property
    def native(self):
        return self.parts[0].native

    @native.setter
    def native(self, ext) -> None:
        for p in self.parts:
            p.native = ext

    def matmul(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = torch.cat([p.matmul(x, None) for p in self.parts], dim=1)
        return y if b is None else y + b

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.cat([p.dequant(dtype) for p in self.parts])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def quantize(w: torch.Tensor, mode: str, group_size: int = 32, symmetric: bool = False, native=None):
    if mode == "int8":
        return Int8Weight(w, native)
    if mode == "int4":
        return Int4Weight(w, group_size, symmetric, native)
    raise ValueError(f"quantization mode must be one of {MODES}, got {mode!r}")


def _torch_linear(x, w, b):
    from .fp8 import linear

    return linear(x, w, b)
