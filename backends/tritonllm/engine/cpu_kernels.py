"""Native fp32 kernels for the CPU engine (csrc/*.cpp, AVX2 + FMA; the int8 dot products also AVX-512 VNNI, chosen at
run time: csrc/int8_tiles.h), compiled on first use.

- ``linear``: few-row matmuls (decoding multiplies 1..max_num_seqs rows by every weight). There oneDNN and
  MKL stream weights at 60-75% of the memory bandwidth (M = 1) and leave most FMA units idle (M = 2..96);
  the kernel was measured 1.35x (M = 1) to 1.5-2.8x (M = 2..16) faster than oneDNN on the model of
  `make bench` (benchmarks/bench_cpu_kernels.py). Above MAX_ROWS rows (prefill) oneDNN is faster and is used.
- ``rope_store`` and ``decode_attention``: RoPE in place plus the KV-cache write, and one-token attention
  read straight from the paged cache, replacing ~25 small torch ops per layer (gathers, masks, SDPA).

Built with torch.utils.cpp_extension (gcc + ninja) into a folder of torch's extension cache
(TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions) named by the hash of the sources, flags, torch
version and checkout path, so two checkouts never rebuild each other's; `make build` compiles it once (~75 s on 2 cores) so
that model loads only find it. If it cannot be built, `auto` falls back to torch and says so in the log.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from .linear import linear as torch_linear
from .knobs import BY_PARAM

log = logging.getLogger(__name__)

MODES = BY_PARAM["cpu_kernels"].allowed  # auto | native | torch (engine/knobs.py)
STALE_LOCK_S = 600  # a build takes ~75 s; a lock this old belongs to a killed build
MAX_ROWS = 96      # above this, oneDNN wins (bench_cpu_kernels: 0.9x at M = 128)
# int8 / int4 weights with fp32 activations: up to this many rows the dequantized-tile kernel (qgemm_f32_cpu.cpp)
# beats dequantizing the whole weight for oneDNN (SmolLM2's layer shapes, 2 threads: 2.0x at 128 rows, 1.15x at
# 256, 0.92x at 512)
TILE_MAX_ROWS = 256
# KV caches rope_store / decode_attention read and write (engine/kv_cache.kv_layout: fp32, fp16, int8 rows + scale)
KV_DTYPES = (torch.float32, torch.float16, torch.int8)
CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / name for name in ("bindings.cpp", "gemm_cpu.cpp", "attention_cpu.cpp", "elementwise_cpu.cpp", "qgemm_cpu.cpp",
                                            "qgemm_f32_cpu.cpp", "qgemm_nbit_cpu.cpp", "qgemm_vnni_cpu.cpp", "fp8_cpu.cpp",
                                            "decode_cpu.cpp")]
CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off"]


def cpu_supported() -> bool:
    """x86 with AVX2 + FMA (torch's capability) and F16C (fp16 scales; every AVX2 CPU has it, checked anyway)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or \
            torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return " f16c" in f.read()
    except OSError:  # no /proc (not Linux): AVX2 implies F16C on every shipped CPU
        return True


@functools.lru_cache(maxsize=1)
def load():
    """The compiled extension, or None (logged) when this machine cannot build or run it."""
    if not cpu_supported():
        log.info("native CPU kernels not used: CPU %s / %s", platform.machine(),
                 torch.backends.cpu.get_cpu_capability())
        return None
    try:
        from torch.utils.cpp_extension import load as build

        path = os.environ.get("PATH", "")
        os.environ["PATH"] = _ninja_dir() + os.pathsep + path
        try:
            return build("tritonllm_cpu_kernels", [str(s) for s in SOURCES], extra_cflags=CFLAGS,
                         extra_ldflags=["-fopenmp"], build_directory=str(_build_dir()))
        finally:
            os.environ["PATH"] = path
    except Exception as e:  # no compiler, no ninja, no headers: serve with torch's kernels instead
        log.warning("native CPU kernels could not be built (%s); using torch's", e)
        return None


def _ninja_dir() -> str:
    """The folder of the `ninja` wheel's binary, put first on PATH while building. Every process must run
    the same ninja on the shared build folder: ninja 1.11 (Debian's) and 1.13 (the wheel's) hash command
    lines differently, so each finds the other's objects dirty and rebuilds everything (seen: Dynamo
    workers, whose venv reaches the wheel through a .pth line and whose PATH lacks the venv's bin, recompiled
    the kernels each time a tritonserver stub had loaded them). The wheel's `BIN_DIR` is empty in such a
    layered venv, so the binary is also looked up beside the site-packages the module came from."""
    try:
        import ninja
    except ImportError:
        ninja = None
    if ninja is not None:
        prefix_bin = Path(ninja.__file__).resolve().parents[4] / "bin"  # <prefix>/lib/pythonX.Y/site-packages/ninja
        for folder in (ninja.BIN_DIR, str(prefix_bin)):
            if folder and os.access(os.path.join(folder, "ninja"), os.X_OK):
                return folder
    found = shutil.which("ninja")
    if found is None:
        raise RuntimeError("no ninja: install the `ninja` wheel")
    return os.path.dirname(found)


def _build_dir() -> Path:
    key = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(CSRC.glob("*.[ch]*"))))
    key.update(" ".join(CFLAGS).encode() + torch.__version__.encode())
    key.update(str(CSRC).encode())  # ninja rebuilds when source paths change: one folder per checkout
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    path = Path(base) / f"tritonllm_cpu_kernels-{key.hexdigest()[:16]}"
    path.mkdir(parents=True, exist_ok=True)
    lock = path / "lock"  # torch's build baton; a build killed midway leaves it and every later load waits
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            log.warning("removing stale build lock %s", lock)
            lock.unlink()
    except FileNotFoundError:
        pass
    return path


def select(mode: str, device: torch.device, dtype: torch.dtype):
    """The extension when this model should use it, else None.

    `auto` uses it for fp32 on CPU where it builds; `native` insists (ValueError if it cannot);
    `torch` never uses it.
    """
    if mode not in MODES:
        raise ValueError(f"cpu_kernels must be one of {', '.join(MODES)}, got {mode!r}")
    applies = device.type == "cpu" and dtype == torch.float32
    if mode == "torch" or (mode == "auto" and not applies):
        return None
    ext = load()
    if ext is None or not applies:
        if mode == "native":
            raise ValueError("cpu_kernels native needs float32 on an x86 CPU with AVX2 and a C++ toolchain"
                             f" (device {device}, dtype {dtype}, kernels built: {ext is not None})")
        return None
    return ext


def native_rows(x: torch.Tensor) -> bool:
    """x is what the native few-row kernels take (fp32 on CPU, 2-D, at most MAX_ROWS rows)."""
    return x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[0] <= MAX_ROWS


def make_linear(ext) -> Callable:
    """linear(x, w, b): the native kernel for few-row fp32 matmuls when `ext` is given, else torch's."""
    if ext is None:
        return torch_linear

    def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(w, torch.Tensor) and native_rows(x):
            return ext.linear(x.contiguous(), w, b)
        return torch_linear(x, w, b)

    return linear


if __name__ == "__main__":  # `make build`: compile once so that model loads find it in the cache
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ext = load()
    print(f"native CPU kernels: {ext.__file__} (int8 dot products: {ext.cpu_isa()})" if ext else
          "native CPU kernels: not available; the engine uses torch")
