"""Native CPU kernels (engine/cpu_kernels.py) vs torch's, side by side in one process.

1. linear: the weight shapes of the `make bench` model (12 layers of qkv / o / gate_up / down + lm_head,
   400 MB fp32) multiplied by M activation rows, through MKL (F.linear), oneDNN (the engine's torch path)
   and the native kernel; then the same weights as int8 and int4 (g32) as the engine multiplies them with int8
   activations (the int8-dot kernels at every row count), int4 with fp32 activations
   (activation_quantization none: codes widened in registers, dequantized tiles from 8 rows, native dequant +
   oneDNN past 256) and int4 dequantized in torch per call.
   Best of --repeat runs; GB/s is fp32 weight bytes / time, GFLOP/s is 2 M params / time (native fp32).
2. decode step: the engine with cpu_kernels=torch vs native, steady-state decode steps at batch 1, 16, 64
   (all requests past prefill, ~128-token contexts). The two engines alternate, best of --repeat.

Writes build/bench/cpu_kernels.{json,png}.

    python benchmarks/bench_cpu_kernels.py [--rows 1,2,4,8,16,32,64,96,128,256] [--batches 1,16,64]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "backends"), os.path.join(ROOT, "benchmarks")]

from bench_model import BENCH_CONFIG, build_bench_model  # noqa: E402
from tritonllm.engine import cpu_kernels  # noqa: E402
from tritonllm.engine.config import EngineConfig  # noqa: E402
from tritonllm.engine.engine import LLMEngine  # noqa: E402
from tritonllm.engine.linear import linear as onednn_linear  # noqa: E402
from tritonllm.engine.quant import Int4Weight, Int8Weight  # noqa: E402
from tritonllm.engine.request import SamplingParams  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def linear_sweep(rows: list[int], repeat: int) -> list[dict]:
    c = BENCH_CONFIG
    h, inter = c["hidden_size"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    shapes = [(h + 2 * kv, h), (h, h), (2 * inter, h), (h, inter)] * c["num_hidden_layers"] + [(c["vocab_size"], h)]
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=g) * 0.05 for n, k in shapes]
    params = sum(w.numel() for w in weights)
    ext = cpu_kernels.load()
    int8 = [Int8Weight(w, ext) for w in weights]
    int4 = [Int4Weight(w, 32, False, ext) for w in weights]
    int4_torch = [Int4Weight(w, 32, False) for w in weights]               # dequantized in torch per call
    int4_f32 = [Int4Weight(w, 32, False, ext) for w in weights]             # activation_quantization: none
    for q in int4_f32:
        q.use_kernels(ext, int8_activations=False)
    impls = {"mkl": lambda x, i: F.linear(x, weights[i]), "onednn": lambda x, i: onednn_linear(x, weights[i]),
             "native": lambda x, i: ext.linear(x, weights[i]), "int8": lambda x, i: int8[i].matmul(x, None),
             "int4": lambda x, i: int4[i].matmul(x, None), "int4_f32": lambda x, i: int4_f32[i].matmul(x, None),
             "int4_torch": lambda x, i: int4_torch[i].matmul(x, None)}
    out = []
    for m in rows:
        xs = {k: torch.randn(m, k, generator=g) for k in {s[1] for s in shapes}}
        row = {"M": m}
        for name, fn in impls.items():
            t = best(lambda: [fn(xs[w.shape[1]], i) for i, w in enumerate(weights)], repeat)
            row[name] = {"ms": t * 1e3, "GBps": params * 4 / t / 1e9, "GFLOPs": 2 * m * params / t / 1e9}
        out.append(row)
        log(f"linear M={m}: native/onednn {row['onednn']['ms'] / row['native']['ms']:.2f}x")
    return out


def decode_steps(batches: list[int], repeat: int, steps: int = 20) -> list[dict]:
    model_dir = build_bench_model(os.path.join(ROOT, "build", "models", "bench"))
    cfg = dict(max_kv_tokens=max(batches) * 256 + 256, max_num_seqs=max(batches), dtype="float32")
    engines = {m: LLMEngine(model_dir, EngineConfig(cpu_kernels=m, **cfg)) for m in ("torch", "native")}
    rng = random.Random(0)
    out = []
    for b in batches:
        prompts = [[rng.randrange(3, 32000) for _ in range(128)] for _ in range(b)]
        times: dict[str, list[float]] = {m: [] for m in engines}
        for _ in range(repeat):
            for mode, eng in engines.items():
                for i, p in enumerate(prompts):
                    eng.add_request(f"r{i}", p, SamplingParams(max_tokens=steps + 8, end_id=-1))
                started: set[str] = set()
                while len(started) < b:                    # prefill done: every request has a token
                    started.update(o.request_id for o in eng.step())
                eng.step()
                t = time.perf_counter()
                for _ in range(steps):
                    eng.step()
                times[mode].append((time.perf_counter() - t) / steps)
                while eng.has_work():
                    eng.step()
        row = {"batch": b, **{m: {"step_ms": min(v) * 1e3, "tok_s": b / min(v)} for m, v in times.items()}}
        out.append(row)
        log(f"decode batch {b}: native/torch {row['native']['tok_s'] / row['torch']['tok_s']:.2f}x")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,96,128,256")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    args = ap.parse_args()
    if cpu_kernels.load() is None:
        sys.exit("native CPU kernels are not available on this machine (see the log above)")
    lin = linear_sweep([int(x) for x in args.rows.split(",")], args.repeat + 2)
    dec = decode_steps([int(x) for x in args.batches.split(",")], args.repeat)
    print(f"\nlinear, {torch.get_num_threads()} threads: time of all bench-model weights x M rows (best of runs)")
    print(f"{'M':>4} {'MKL ms':>8} {'oneDNN ms':>10} {'native ms':>10} {'GB/s':>6} {'GFLOP/s':>8} {'vs oneDNN':>10}"
          f" {'int8 ms':>8} {'int4 ms':>8} {'int4 fp32-act ms':>17} {'int4, torch dequant ms':>23}")
    for r in lin:
        n = r["native"]
        print(f"{r['M']:4d} {r['mkl']['ms']:8.1f} {r['onednn']['ms']:10.1f} {n['ms']:10.1f} {n['GBps']:6.1f} "
              f"{n['GFLOPs']:8.0f} {r['onednn']['ms'] / n['ms']:9.2f}x {r['int8']['ms']:8.1f} {r['int4']['ms']:8.1f}"
              f" {r['int4_f32']['ms']:17.1f} {r['int4_torch']['ms']:23.1f}")
    print("\ndecode step (steady state, ~128-token contexts)")
    print(f"{'batch':>5} {'torch ms':>9} {'native ms':>10} {'torch tok/s':>12} {'native tok/s':>13} {'ratio':>7}")
    for r in dec:
        t, n = r["torch"], r["native"]
        print(f"{r['batch']:5d} {t['step_ms']:9.1f} {n['step_ms']:10.1f} {t['tok_s']:12.1f} {n['tok_s']:13.1f} "
              f"{n['tok_s'] / t['tok_s']:6.2f}x")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_kernels.json"), "w") as f:
        json.dump({"linear": lin, "decode": dec, "threads": torch.get_num_threads()}, f, indent=1)
    plot(lin, dec, os.path.join(args.out, "cpu_kernels.png"))


def plot(lin: list[dict], dec: list[dict], path: str) -> None:
    from plotting import pyplot

    plt = pyplot()
    if plt is None:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    ms = [r["M"] for r in lin]
    for name in ("mkl", "onednn", "native", "int8", "int4", "int4_f32"):
        a.plot(ms, [r[name]["GFLOPs"] for r in lin], marker="o", label=name)
    a.set(xscale="log", xlabel="rows M", ylabel="GFLOP/s", title="linear over the bench model's weights")
    bs = [r["batch"] for r in dec]
    for name in ("torch", "native"):
        b.plot(bs, [r[name]["tok_s"] for r in dec], marker="o", label=f"cpu_kernels={name}")
    b.set(xscale="log", xlabel="batch", ylabel="decode tokens/s", title="engine decode step")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"wrote {path} and cpu_kernels.json")


if __name__ == "__main__":
    main()
