"""Few-row fp32 matmuls on x86 CPUs: our AVX2 kernel (csrc/gemm_avx2.cpp), compiled on first use.

Decoding multiplies 1..max_num_seqs activation rows by every weight; there oneDNN and MKL run at
60-75% of the memory bandwidth (M = 1) and use a fraction of the FMA units (M = 2..96). The kernel was
measured 1.35x (M = 1) to 1.5-2.8x (M = 2..16) faster than oneDNN on the model of `make bench`
(benchmarks/bench_cpu_gemm.py). Above MAX_ROWS rows (prefill) oneDNN's blocked GEMM is faster and is used.

The extension is built with torch.utils.cpp_extension (gcc + ninja) into a folder of torch's extension
cache (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions) named by the hash of the source and flags,
so checkouts with different sources never rebuild each other's; `make build` compiles it once (~40 s)
so that model loads only find it. If it cannot be built, `auto` falls back to oneDNN and says
so in the log.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
from pathlib import Path
from typing import Callable

import torch

from .fp8 import linear as onednn_linear

log = logging.getLogger(__name__)

MODES = ("auto", "avx2", "onednn")
MAX_ROWS = 96      # above this, oneDNN wins (bench_cpu_gemm: 0.9x at M = 128)
SOURCE = Path(__file__).parent / "csrc" / "gemm_avx2.cpp"
CFLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp"]


def cpu_supported() -> bool:
    return (platform.machine().lower() in ("x86_64", "amd64")
            and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))


@functools.lru_cache(maxsize=1)
def load():
    """The compiled extension, or None (logged) when this machine cannot build or run it."""
    if not cpu_supported():
        log.info("AVX2 GEMM kernel not used: CPU %s / %s", platform.machine(),
                 torch.backends.cpu.get_cpu_capability())
        return None
    try:
        from torch.utils.cpp_extension import load as build
        if shutil.which("ninja") is None:  # the `ninja` wheel's binary, when the venv's bin is not on PATH
            import ninja
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        return build("tritonllm_gemm_avx2", [str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
                     build_directory=str(_build_dir()))
    except Exception as e:  # no compiler, no ninja, no headers: serve with oneDNN instead
        log.warning("AVX2 GEMM kernel could not be built (%s); using oneDNN", e)
        return None


def _build_dir() -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode() + torch.__version__.encode())
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    path = Path(base) / f"tritonllm_gemm_avx2-{key.hexdigest()[:16]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def make_linear(mode: str, device: torch.device, dtype: torch.dtype) -> Callable:
    """linear(x, w, b) for this model: the AVX2 kernel for few-row fp32 CPU matmuls, oneDNN otherwise.

    `auto` uses the kernel where it applies and builds; `avx2` insists (ValueError if it cannot);
    `onednn` never uses it.
    """
    if mode not in MODES:
        raise ValueError(f"cpu_linear must be one of {', '.join(MODES)}, got {mode!r}")
    applies = device.type == "cpu" and dtype == torch.float32
    if mode == "onednn" or (mode == "auto" and not applies):
        return onednn_linear
    ext = load()
    if ext is None or not applies:
        if mode == "avx2":
            raise ValueError("cpu_linear avx2 needs float32 on an x86 CPU with AVX2 and a C++ toolchain"
                             f" (device {device}, dtype {dtype}, kernel built: {ext is not None})")
        return onednn_linear

    def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(w, torch.Tensor) and x.dim() == 2 and x.shape[0] <= MAX_ROWS:
            return ext.linear(x.contiguous(), w, b)
        return onednn_linear(x, w, b)

    return linear


if __name__ == "__main__":  # `make build`: compile once so that model loads find it in the cache
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ext = load()
    print(f"AVX2 GEMM kernel: {ext.__file__ if ext else 'not available; the engine uses oneDNN'}")
