"""The int8 dot products' two instruction sets side by side (csrc/int8_tiles.h): AVX2 (maddubs + madd) against
AVX-512 VNNI (vpdpbusd), on the same weights in one process, rounds alternating; both give bit for bit the same
products (tests/unit/test_cpu_isa.py), so this measures time alone. Each shape is held as --copies distinct weights
(more bytes than the L3 cache), called in turn, as a decode step reads them. Prints the best ms per call of each and
the ratio. Needs a CPU with AVX-512 VNNI + VL (Zen 4; Intel Ice Lake, Cascade Lake and later).

    .venv/bin/python benchmarks/bench_isa.py [--rows 1,16,512] [--threads 2] [--rounds 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "backends")]

from tritonllm.engine import cpu_kernels  # noqa: E402
from tritonllm.engine.quant import Int4Weight, Int8Weight  # noqa: E402
from tritonllm.engine.quant_nbit import IntNWeight  # noqa: E402

# (rows, inputs, copies): Qwen2.5-1.5B's MLP up and down shapes
SHAPES = ((8960, 1536, 8), (1536, 8960, 8))


def _scales(n: int, per: int, g: torch.Generator) -> torch.Tensor:
    return (torch.rand(n, per, generator=g) * 0.01 + 1e-3).half().float()


def make(fmt: str, n: int, k: int, ext, g: torch.Generator):
    """A weight of GGUF format ``fmt`` as the loader holds it (random codes: speed does not depend on them)."""
    codes = lambda bits: torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.uint8)  # noqa: E731
    if fmt == "Q8_0":
        q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
        return Int8Weight.from_blocks(q, _scales(n, k // 32, g), None, native=ext)
    if fmt == "Q4_0":
        d = _scales(n, k // 32, g)
        return Int4Weight.from_blocks(codes(4), d, -8 * d, native=ext)
    if fmt == "Q4_K":  # 6-bit scale codes times a float16 per 256 inputs, kept factored
        dq, mq = (torch.randint(0, 64, (n, k // 32), generator=g).float() for _ in range(2))
        dsup, msup = _scales(n, k // 256, g), -_scales(n, k // 256, g)
        d, m = dq * dsup.repeat_interleave(8, 1), mq * msup.repeat_interleave(8, 1)
        return Int4Weight.from_blocks(codes(4), d, m, native=ext, factors=(dq, dsup, mq, msup))
    if fmt == "Q6_K":  # signed 8-bit scale codes per 16 inputs times a float16 per 256
        dq = torch.randint(-128, 128, (n, k // 16), generator=g).float()
        dsup = _scales(n, k // 256, g)
        return IntNWeight.from_blocks(codes(6), dq * dsup.repeat_interleave(16, 1), None, 6, 32, native=ext,
                                      factors=(dq, dsup, None, None))
    raise ValueError(fmt)


def best_ms(ext, isa: str, weights: list, x: torch.Tensor) -> float:
    ext.cpu_isa(isa)
    for w in weights:
        w.matmul(x, None)
    t = time.perf_counter()
    for w in weights:
        w.matmul(x, None)
    return (time.perf_counter() - t) / len(weights) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,16,512")
    ap.add_argument("--formats", default="Q4_K,Q6_K,Q8_0,Q4_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    ext = cpu_kernels.load()
    if ext is None:
        print("native CPU kernels unavailable here (not x86 AVX2)", file=sys.stderr)
        return 1
    start = ext.cpu_isa()
    try:
        ext.cpu_isa("avx512_vnni")
    except RuntimeError as e:
        print(f"{e}: nothing to compare on this CPU", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print("| shape | format | rows | AVX2 ms | VNNI ms | VNNI speedup |\n|---|---|---|---|---|---|")
    try:
        for n, k, copies in SHAPES:
            for fmt in args.formats.split(","):
                weights = [make(fmt, n, k, ext, g) for _ in range(copies)]
                for w in weights:
                    w.use_kernels(ext, int8_activations=True)
                for rows in (int(r) for r in args.rows.split(",")):
                    x = torch.randn(rows, k)
                    best = {"avx2": float("inf"), "avx512_vnni": float("inf")}
                    for _ in range(args.rounds):
                        for isa in best:
                            best[isa] = min(best[isa], best_ms(ext, isa, weights, x))
                    print(f"| {n} x {k} | {fmt} | {rows} | {best['avx2']:.3f} | {best['avx512_vnni']:.3f} | "
                          f"{best['avx2'] / best['avx512_vnni']:.2f}x |", flush=True)
    finally:
        ext.cpu_isa(start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
