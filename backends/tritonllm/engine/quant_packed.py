"""The packed weights' common part: the 8-rows-interleaved layout every native quantized kernel reads (csrc/qgemm.h),
its scales (fp32, fp16 where exact, or a GGUF K-quant's int8 codes times float16 super-block scales), row fusing,
moving to a device, and the matmul's choice of kernel. Int8Weight / Int4Weight (quant.py) and IntNWeight
(quant_nbit.py) are its layouts.
"""
from __future__ import annotations

import torch

from .cpu_kernels import TILE_MAX_ROWS
from .linear import linear

QK = 32  # the native kernels' block


class Packed:
    """What Int8Weight and Int4Weight share: the stored input order (``perm``, GPTQ act order: x[:, perm] @ W^T
    is the product), fusing rows over one input (``cat``), moving to a device, the scales' storage type."""

    perm = None
    dsup = msup = None  # K-quant super-block scales: dx / mx then hold int8 codes (csrc/qgemm.h, KScale)
    TENSORS: tuple[str, ...] = ()

    def _store_scales(self, dx: torch.Tensor, mx: torch.Tensor | None, dsup: torch.Tensor | None = None,
                      msup: torch.Tensor | None = None) -> None:
        """fp16 when every scale and shift is exactly a float16 (a GGUF file's own d and m), else fp32: half the
        scale bytes where nothing is lost (the kernels read either). With ``dsup``: dx (and mx) are int8 codes and
        dsup (msup) their float16 scales per row and 256 inputs [G, K / 256, 8], the scale their product (a GGUF
        K-quant's factoring, exact in fp32)."""
        if dsup is not None:
            self.dx, self.dsup = dx.to(torch.int8).contiguous(), dsup.half().contiguous()
            self.mx = None if mx is None else mx.to(torch.int8).contiguous()
            self.msup = None if msup is None else msup.half().contiguous()
            return
        self.dsup = self.msup = None
        dx, mx = dx.float(), None if mx is None else mx.float()
        if all(t is None or torch.equal(t.half().float(), t) for t in (dx, mx)):
            dx, mx = dx.half(), None if mx is None else mx.half()
        self.dx, self.mx = dx.contiguous(), None if mx is None else mx.contiguous()

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
        """Parts of the same layout and input order, stacked row-wise: whole groups of 8 rows stack as they are
        interleaved; a part that ends in a partial group is unpacked and packed again (``_repack``)."""
        if not all(p.shape[0] % 8 == 0 for p in parts):
            return cls._repack(parts)
        self = cls.__new__(cls)
        self.__dict__.update(parts[0].__dict__)
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        for name in self.TENSORS:  # the codes (and high-bit planes, factored scales) row-wise; float scales below
            if name not in ("dx", "mx") or parts[0].dsup is not None:
                if getattr(parts[0], name) is not None:
                    setattr(self, name, torch.cat([getattr(p, name) for p in parts]).contiguous())
        if parts[0].dsup is not None:
            return self
        self._store_scales(torch.cat([p.dx.float() for p in parts]),
                           None if parts[0].mx is None else torch.cat([p.mx.float() for p in parts]))
        return self

    @classmethod
    def _repack(cls, parts: list):
        """The parts' rows, unpacked and packed as one weight (each layout's own)."""
        raise NotImplementedError

    int8_activations = True  # the native few-row matmul quantizes activations per 32-block (else fp32 activations)

    def use_kernels(self, native, int8_activations: bool = True) -> None:
        """Multiply with the native kernels ``native`` (None: torch) where the layout allows (whole 32-blocks),
        with activations quantized to int8 (llama.cpp's way) or kept in fp32 (the dequantized weights' float
        product)."""
        self.native = native if native is not None and self.shape[1] % QK == 0 else None
        self.int8_activations = int8_activations

    def to(self, device: torch.device):
        for name in self.TENSORS:
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).to(device))
        self.perm = None if self.perm is None else self.perm.to(device)
        return self

    @staticmethod
    def _scale_values(t: torch.Tensor, sup: torch.Tensor | None) -> torch.Tensor:
        """Stored scales [..., V, 8] (or their rows' slice [R, V]) as fp32: factored ones times their super-block's."""
        if sup is None:
            return t.float()
        per = t.shape[-2 if t.dim() == 3 else -1] // sup.shape[-2 if sup.dim() == 3 else -1]
        return t.float() * sup.float().repeat_interleave(per, dim=-2 if t.dim() == 3 else -1)

    def _scale_rows(self, t: torch.Tensor, sup: torch.Tensor | None, g: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """Rows (g, r) of stored scales [G, V, 8] as fp32 [R, V]."""
        return self._scale_values(t[g, :, r], None if sup is None else sup[g, :, r])

    def _in_model_order(self, w: torch.Tensor) -> torch.Tensor:
        return w if self.perm is None else torch.empty_like(w).index_copy_(1, self.perm, w)

    def _stored_order(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.perm is None else x.index_select(1, self.perm)

    KERNELS: tuple[str, str] = ("", "")  # the native kernels' names: int8 activations, fp32 activations
    DEQUANT = "dequant_x8"                # the native dequantization's

    def kernel_args(self) -> tuple[tuple, tuple]:
        """The native kernels' weight arguments: those before the scales (the codes) and those after N."""
        return (self.qx,), ()

    def dequant_native(self, native) -> torch.Tensor:
        """The float weight [N, K] in the stored input order, dequantized by the native kernels ``native``."""
        codes, tail = self.kernel_args()
        return getattr(native, self.DEQUANT)(*codes, self.dx, self.mx, self.shape[0], *tail)

    def matmul(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.native is None or not (x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu"):
            return torch_linear(x, self.dequant(x.dtype), b)
        if self.int8_activations:  # integer dot products at every row count (prefill: ~3x oneDNN's fp32 GEMM)
            kernel = getattr(self.native, self.KERNELS[0])
        elif x.shape[0] > TILE_MAX_ROWS:
            return torch_linear(self._stored_order(x), self.dequant_native(self.native), b)
        else:
            kernel = getattr(self.native, self.KERNELS[1])
        codes, tail = self.kernel_args()
        return kernel(self._stored_order(x).contiguous(), *codes, self.dx, self.mx, b, self.shape[0], *tail)


class RowStack:
    """Weights over one input whose outputs are concatenated: y = [x W_1^T, x W_2^T, ...]."""

    def __init__(self, parts: list) -> None:
        self.parts = parts
        self.shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])

    @property
    def native(self):
        return self.parts[0].native

    @property
    def int8_activations(self) -> bool:
        return self.parts[0].int8_activations

    def use_kernels(self, native, int8_activations: bool = True) -> None:
        for p in self.parts:
            p.use_kernels(native, int8_activations)

    def to(self, device: torch.device):
        self.parts = [p.to(device) for p in self.parts]
        return self

    def matmul(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = torch.cat([p.matmul(x, None) for p in self.parts], dim=1)
        return y if b is None else y + b

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.cat([p.dequant(dtype) for p in self.parts])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def interleave(rows: torch.Tensor, k_chunks: int) -> torch.Tensor:
    """[G * 8, nb * 32] per-row bytes -> [G, nb, t, r, j]: chunk t of block nb holds, at (r, j), row r's byte
    for input t * (32 / k_chunks) + j (the kernels' X8Args; int4 then packs chunks t and t + 4 together)."""
    g8, k = rows.shape
    return rows.reshape(g8 // 8, 8, k // QK, k_chunks, QK // k_chunks).permute(0, 2, 3, 1, 4)  # [G, nb, t, r, j]


def pad_rows(t: torch.Tensor, groups: int) -> torch.Tensor:
    pad = groups * 8 - t.shape[0]
    return torch.cat((t, t.new_zeros(pad, *t.shape[1:]))) if pad else t


def block_scales(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Per row and block [N, nb] -> the kernels' [G, nb, 8] (one vector of 8 rows per group and block); float
    scales as fp32, factored codes and super-block scales as they are."""
    t = t if t.dtype in (torch.int8, torch.float16) else t.float()
    return pad_rows(t, groups).reshape(groups, 8, -1).transpose(1, 2).contiguous()


def check_factors(d: torch.Tensor, m: torch.Tensor | None, factors: tuple | None) -> tuple | None:
    """A K-quant's (d codes, d super, m codes or None, m super or None), per row, as int8 codes and float16 supers,
    once checked to give d and m exactly (codes times their 256-input super-block's scale); ValueError otherwise."""
    if factors is None:
        return None
    dq, dsup, mq, msup = factors
    out = []
    for codes, sup, want in ((dq, dsup, d), (mq, msup, m)):
        if codes is None:
            if want is not None:
                raise ValueError("factored scales: m without its factors")
            out += [None, None]
            continue
        codes, sup = codes.float(), sup.float()
        if codes.min() < -128 or codes.max() > 127 or not torch.equal(sup.half().float(), sup):
            raise ValueError("factored scales: codes must fit int8 and super-block scales float16")
        got = codes * sup.repeat_interleave(codes.shape[1] // sup.shape[1], dim=1)
        if want is None or got.shape != want.shape or not torch.equal(got, want.float()):
            raise ValueError("factored scales: codes times super-block scales do not give the scales exactly")
        out += [codes.to(torch.int8), sup.half()]
    return tuple(out)


def row_scales(t: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of _block_scales: [G, nb, 8] -> [N, nb]."""
    return t.transpose(1, 2).reshape(-1, t.shape[1])[:n]


def torch_linear(x, w, b):
    return linear(x, w, b)
