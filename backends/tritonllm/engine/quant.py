"""INT8 and INT4 weights: round-to-nearest quantization, the packed layouts, dequantization, and the matmul.

- ``Int8Weight``: symmetric per output channel: codes -127..127, ``d = amax(row) / 127``; weight = d * q.
- ``Int4Weight``: per group of ``group_size`` (32, 64 or 128) along K: codes 0..15, weight = d * (q - z);
  asymmetric (``z`` from the group's min and max, as AWQ / GPTQ with zeros) or symmetric (``z = 8``,
  ``d = amax / 7``). Stored in 32-element blocks for the native kernel: nibbles packed two per byte in
  llama.cpp's Q4 order (byte j of a block holds element j low, element j + 16 high), and per block
  ``d`` and ``m = -d * z`` (a group of 64 / 128 repeats its d and m over its blocks).

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


class Int8Weight:
    def __init__(self, w: torch.Tensor, native=None) -> None:
        w = w.float()
        self.shape = tuple(w.shape)
        self.d = (w.abs().amax(dim=1).clamp(min=1e-12) / 127.0).contiguous()
        self.q = torch.round(w / self.d[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.native = native if w.shape[1] % QK == 0 else None

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.q.float() * self.d[:, None]).to(dtype)

    def matmul(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.native is not None and native_rows(x):
            return self.native.linear_q8(x.contiguous(), self.q, self.d, b)
        return _torch_linear(x, self.dequant(x.dtype), b)

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.d.numel() * 4


class Int4Weight:
    def __init__(self, w: torch.Tensor, group_size: int = 32, symmetric: bool = False, native=None) -> None:
        if group_size not in GROUP_SIZES:
            raise ValueError(f"quant_group_size must be one of {GROUP_SIZES}, got {group_size}")
        w = w.float()
        n, k = w.shape
        if k % group_size:
            raise ValueError(f"int4 needs the input size ({k}) to be a multiple of quant_group_size ({group_size})")
        self.shape, self.group_size, self.symmetric = (n, k), group_size, symmetric
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
        self.d = d.repeat_interleave(rep, dim=1).contiguous()                  # [N, K / 32]
        self.m = (-d * z).repeat_interleave(rep, dim=1).contiguous()
        blocks = q.reshape(n, k // QK, QK)
        self.q = (blocks[..., :QK // 2] | (blocks[..., QK // 2:] << 4)).reshape(n, k // 2).contiguous()
        self.native = native

    def codes(self) -> torch.Tensor:
        """The unpacked codes [N, K] (0..15)."""
        n, k = self.shape
        b = self.q.reshape(n, k // QK, QK // 2)
        return torch.cat((b & 0x0F, b >> 4), dim=2).reshape(n, k)

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.shape
        q = self.codes().float().reshape(n, k // QK, QK)
        return (q * self.d[..., None] + self.m[..., None]).reshape(n, k).to(dtype)

    def matmul(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.native is not None and native_rows(x):
            return self.native.linear_q4(x.contiguous(), self.q, self.d, self.m, b)
        return _torch_linear(x, self.dequant(x.dtype), b)

    @property
    def nbytes(self) -> int:
        return self.q.numel() + (self.d.numel() + self.m.numel()) * 4 // (self.group_size // QK)


def quantize(w: torch.Tensor, mode: str, group_size: int = 32, symmetric: bool = False, native=None):
    if mode == "int8":
        return Int8Weight(w, native)
    if mode == "int4":
        return Int4Weight(w, group_size, symmetric, native)
    raise ValueError(f"quantization mode must be one of {MODES}, got {mode!r}")


def _torch_linear(x, w, b):
    from .fp8 import linear

    return linear(x, w, b)
