"""Packed 5- / 6-bit codes (engine/quant_nbit.py) against the same weights as int8 codes (what held GGUF's Q5_x / Q6_K
before), read from memory as a decode step reads them: each shape as --copies distinct weights (more bytes than the
L3 cache), called in turn, so no call finds its weight cached. Both layouts give bit for bit the same products
(tests/unit/test_quant.py); this measures their time. Prints ms per call, GB/s of the bytes held, and the ratio.

    .venv/bin/python benchmarks/bench_nbit.py [--rows 1,4,16] [--threads 2]
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
from tritonllm.engine.quant import Int8Weight  # noqa: E402
from tritonllm.engine.quant_nbit import IntNWeight  # noqa: E402

# (rows, inputs, copies): Qwen2.5-1.5B's and 0.5B's MLP up / down shapes
SHAPES = ((8960, 1536, 24), (1536, 8960, 24), (4864, 896, 40))
FORMATS = {"Q5_0": (5, 16), "Q6_K": (6, 32)}


def timed(weights: list, rows: int, rounds: int) -> tuple[float, float]:
    """(ms per call, GB/s of the bytes held) over ``rounds`` passes through every weight."""
    x = torch.randn(rows, weights[0].shape[1])
    for w in weights:
        w.matmul(x, None)
    t = time.perf_counter()
    for _ in range(rounds):
        for w in weights:
            w.matmul(x, None)
    per_call = (time.perf_counter() - t) / rounds / len(weights)
    return per_call * 1e3, weights[0].nbytes / per_call / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,4,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    ext = cpu_kernels.load()
    if ext is None:
        print("native CPU kernels unavailable here (not x86 AVX2)", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("| shape | format | rows | packed ms (GB/s) | int8 codes ms (GB/s) | packed speedup |\n|---|---|---|---|---|---|")
    for n, k, copies in SHAPES:
        for name, (bits, zero) in FORMATS.items():
            q = torch.randint(0, 1 << bits, (n, k), dtype=torch.uint8)
            d = (torch.rand(n, k // (16 if bits == 6 else 32)) * 0.01 + 1e-3).half().float()
            packed = [IntNWeight.from_blocks(q, d, None, bits, zero, native=ext) for _ in range(copies)]
            int8 = [Int8Weight.from_blocks((q.to(torch.int16) - zero).to(torch.int8), d, None, native=ext)
                    for _ in range(copies)]
            for rows in (int(r) for r in args.rows.split(",")):
                (tp, gp), (t8, g8) = timed(packed, rows, args.rounds), timed(int8, rows, args.rounds)
                print(f"| {n} x {k} | {name} | {rows} | {tp:.3f} ({gp:.1f}) | {t8:.3f} ({g8:.1f}) | {t8 / tp:.2f}x |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
