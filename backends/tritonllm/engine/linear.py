"""y = x W^T + b for every weight kind: a float tensor through oneDNN (CPU fp32) or torch, any quantized weight
(FP8Weight, Int8Weight, Int4Weight, ...) through its own ``matmul``. Imports nothing of the engine, so every
weight module and the native kernels may import it."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _onednn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


_ONEDNN = _onednn_linear_available()


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T + b. On CPU, oneDNN's linear: measured 1.7-2.5x faster than F.linear (MKL sgemm) at
    M = 1..64 rows on an AVX2 AMD EPYC, where MKL takes slow paths."""
    if not isinstance(w, torch.Tensor):
        return w.matmul(x, b)
    if _ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return F.linear(x, w, b)
