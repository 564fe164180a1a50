"""FP8 (float8_e4m3fn) weights and KV cache.

Weights: per-output-channel scales (scale = amax of the row / 448), stored as FP8. Three matmuls:
- native (fp32 CPU with the native kernels, few rows): ``csrc/qgemm_cpu.cpp`` reads the FP8 bytes and
  converts them in registers (a 256-entry table), fp32 multiply-adds: the dequant matmul's result without
  expanding the weight (dequantizing every weight at every decode step made FP8 18x slower than fp32);
- ``dequant``: the weight is expanded to the compute dtype inside the matmul (a memory saving, not a
  speed-up; GPUs without FP8 tensor cores, prefill-sized inputs on CPU);
- ``scaled``: activations are quantized per token (row) to FP8 on the fly and ``torch._scaled_mm`` multiplies
  FP8 x FP8 with row-wise scales (FP8 tensor cores on Hopper / Ada, SM >= 8.9: the default there). It runs
  on CPU too (torch has a reference kernel), which is how its numerics are tested here. If the kernel
  refuses a shape at run time, that weight falls back to ``dequant`` (once, logged).
The FP8 (and INT8) KV cache's store and load live in ``kv_quant.py``; the generic ``linear`` in ``linear.py``.
"""
from __future__ import annotations

import functools
import logging

import torch

from .cpu_kernels import native_rows
from .knobs import BY_PARAM
from .linear import linear

log = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


@functools.lru_cache(maxsize=1)
def fp8_table() -> torch.Tensor:
    """The 256 float8_e4m3fn codes as fp32, for the native kernel's in-register conversion."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float().contiguous()


class FP8Weight:
    """A [out, in] weight as FP8 codes plus one fp32 scale per output row."""

    def __init__(self, w: torch.Tensor, scaled_mm: bool = False, native=None) -> None:
        w = w.float()
        self.native = native
        self.scale = (w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX).contiguous()
        self.q = (w / self.scale[:, None]).to(FP8)
        self.shape = tuple(w.shape)
        self.scaled_mm = scaled_mm
        self._scale_b = self.scale[None, :]      # [1, out]: row-wise scale of W^T's columns

    def matmul(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.native is not None and native_rows(x):
            return self.native.linear_f8(x.contiguous(), self.q.view(torch.uint8), self.scale, fp8_table(), b)
        if self.scaled_mm and x.dim() == 2:
            try:
                return scaled_linear(x, self, b)
            except RuntimeError as e:
                log.warning("FP8 scaled matmul refused %s x %s (%s): dequantizing this weight instead",
                            tuple(x.shape), self.shape, e)
                self.scaled_mm = False
        return linear(x, self.dequant(x.dtype), b)

    def dequant(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.q.to(torch.float32) * self.scale[:, None]).to(dtype)

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scale.numel() * 4


def wants_scaled_mm(mode: str, device: torch.device) -> bool:
    """fp8_matmul `auto` -> scaled on CUDA devices with FP8 tensor cores (SM >= 8.9), else dequant."""
    BY_PARAM["fp8_matmul"].check(mode)  # auto | scaled | dequant (engine/knobs.py)
    if mode != "auto":
        return mode == "scaled"
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def scaled_linear(x: torch.Tensor, w: FP8Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T + b with x quantized per row to FP8 (scale = row amax / 448) and W's per-channel scales."""
    xf = x.float()
    sx = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX          # [M, 1]
    xq = (xf / sx).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    y = torch._scaled_mm(xq, w.q.t(), scale_a=sx, scale_b=w._scale_b, out_dtype=x.dtype)
    return y if b is None else y + b
