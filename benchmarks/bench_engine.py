"""Engine throughput vs HF transformers, measured side by side in one process (issue #3 / #9 workload).

Workload: the random 124.7M Llama of benchmarks/bench_model.py, N prompts of 128 token ids, 128 greedy new
tokens, EOS ignored. Prints machine bounds measured on the spot (read and copy bandwidth, matmul GFLOP/s;
the batch-1 bound is read bandwidth / weight bytes a decode step streams), a table of
tokens/s with ratios to HF in the same dtype, and writes build/bench/engine.{json,png}.

    python benchmarks/bench_engine.py [--batches 1,16,64] [--dtypes float32,bfloat16] [--triton]

--triton adds `tensorrt_llm` (token ids, one response per request) and `ensemble` (text, streamed token by
token) through a real tritonserver, each with its ratio to the engine in-process on the same token ids.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "backends"), os.path.join(ROOT, "benchmarks")]

from bench_model import build_bench_model  # noqa: E402
from tritonllm.engine.config import EngineConfig  # noqa: E402
from tritonllm.engine.engine import LLMEngine  # noqa: E402
from tritonllm.engine.loader import cpu_has_fast_bf16  # noqa: E402
from tritonllm.engine.request import SamplingParams  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine_bounds() -> dict:
    a = torch.rand(64 << 20, dtype=torch.float32)  # 256 MiB, touched: untouched pages all read one zero page
    b = torch.empty_like(a)
    b.copy_(a)
    t = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    copy_gbs = 5 * 2 * a.numel() * 4 / (time.perf_counter() - t) / 1e9  # read + write traffic
    reads = []
    for _ in range(5):  # read-only traffic, what a decode step does to the weights
        t = time.perf_counter()
        a.sum()
        reads.append(time.perf_counter() - t)
    out = {"copy_GBps": copy_gbs, "read_GBps": a.numel() * 4 / min(reads) / 1e9}
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(1024, 1024).to(dt)
        x @ x
        t = time.perf_counter()
        for _ in range(10):
            x @ x
        out[f"matmul_GFLOPs_{str(dt).split('.')[-1]}"] = 10 * 2 * 1024 ** 3 / (time.perf_counter() - t) / 1e9
    return out


def prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def hf_run(model, batch: list[list[int]], new: int) -> tuple[int, float]:
    """HF generate on one static batch: (output tokens, seconds), prefill included."""
    ids = torch.tensor(batch)
    with torch.inference_mode():
        t = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=0)
        return len(batch) * new, time.perf_counter() - t


def engine_run(engine: LLMEngine, batch: list[list[int]], new: int) -> tuple[int, float]:
    for i, p in enumerate(batch):
        engine.add_request(f"b{i}", p, SamplingParams(max_tokens=new, end_id=-1))
    n = 0
    t = time.perf_counter()
    while engine.has_work():
        n += sum(len(o.new_token_ids) for o in engine.step())
    return n, time.perf_counter() - t


def rate(result: tuple[int, float]) -> float:
    return result[0] / result[1]


def decode_rate(run, batch1: list[list[int]], new: int, repeat: int = 3) -> float:
    """Batch-1 decode tokens/s: (new - 1) tokens over the time beyond a 1-token run (prefill removed).

    Each of the two times is the best of `repeat` runs: a single slow 1-token run would otherwise inflate
    the rate (seen here: 76 and 50 tok/s from back-to-back single runs).
    """
    t1 = min(run(batch1, 1)[1] for _ in range(repeat))
    tn = min(run(batch1, new)[1] for _ in range(repeat))
    return (new - 1) / max(tn - t1, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--dtypes", default="float32,bfloat16" if cpu_has_fast_bf16() else "float32",
                    help="default: bfloat16 too where the CPU has bf16 instructions")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--triton", action="store_true", help="also measure through tritonserver (tensorrt_llm)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    model_dir = build_bench_model(os.path.join(ROOT, "build", "models", "bench"))
    bounds = machine_bounds()
    log(f"machine: {bounds}")
    work = prompts(max(batches), args.prompt_len, 32000)
    results: dict = {"bounds": bounds, "threads": args.threads, "rows": []}
    for dtype in args.dtypes.split(","):
        engine = LLMEngine(model_dir, EngineConfig(max_kv_tokens=max(batches) * (args.prompt_len + args.new) + 256,
                                                   max_num_tokens=2048, max_num_seqs=max(batches), dtype=dtype))
        weight_bytes = sum(t.numel() * t.element_size() for t in _weights(engine))
        streamed = sum(t.numel() * t.element_size() for t in _weights(engine, streamed_only=True))
        bound = bounds["read_GBps"] * 1e9 / streamed  # a decode step reads these weights once
        row = {"dtype": dtype, "weight_MB": weight_bytes / 1e6, "streamed_MB": streamed / 1e6,
               "bw_bound_tok_s": bound,
               "kv_bytes_per_token": engine.kv_bytes_per_token}
        log(f"{dtype}: engine batch-1 decode")
        row["ours_b1"] = decode_rate(lambda b, n: engine_run(engine, b, n), work[:1], args.new)
        for b in batches:
            log(f"{dtype}: engine batch {b}")
            row[f"ours_e2e_b{b}"] = rate(engine_run(engine, work[:b], args.new))
        if not args.skip_hf:
            import transformers as tf

            hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
            log(f"{dtype}: HF batch-1 decode")
            row["hf_b1"] = decode_rate(lambda b, n: hf_run(hf, b, n), work[:1], args.new)
            for b in batches:
                log(f"{dtype}: HF batch {b}")
                row[f"hf_e2e_b{b}"] = rate(hf_run(hf, work[:b], args.new))
            del hf
        if args.triton:
            from triton_bench import triton_e2e

            for b in batches:
                log(f"{dtype}: through Triton, concurrency {b}")
                row[f"triton_e2e_b{b}"] = triton_e2e(model_dir, dtype, work[:b], args.new)
            text_rows(row, engine, model_dir, dtype, work, batches, args.new)
        results["rows"].append(row)
        del engine
    report(results, batches, args.out)


def text_rows(row: dict, engine: LLMEngine, model_dir: str, dtype: str, work, batches, new: int) -> None:
    """`ensemble` streaming (text in, token-by-token text out) vs the engine in-process on the very ids
    preprocessing makes of the same texts (the bench model gets a made-up BPE tokenizer covering its ids)."""
    from peers.setup_envs import model_with_tokenizer
    from transformers import AutoTokenizer
    from triton_bench import ensemble_e2e

    tok_dir = model_with_tokenizer(model_dir)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    texts = [tok.decode(p) for p in work]
    ids = [tok(t).input_ids for t in texts]
    for b in batches:
        log(f"{dtype}: engine on the ensemble's token ids, batch {b}")
        row[f"ours-text_e2e_b{b}"] = rate(engine_run(engine, ids[:b], new))
        log(f"{dtype}: through the ensemble (streaming), concurrency {b}")
        row[f"ensemble_e2e_b{b}"] = ensemble_e2e(tok_dir, dtype, texts[:b], new, stream=True)


def _weights(engine, streamed_only: bool = False):
    """All weight tensors; streamed_only leaves out the embedding table, of which a step reads B rows."""
    m = engine.model
    if not streamed_only or m.lm_head is m.embed:
        yield m.embed
    if m.lm_head is not m.embed:
        yield m.lm_head
    yield m.norm
    for layer in m.layers:
        yield from (t for t in vars(layer).values() if isinstance(t, torch.Tensor))


def report(results: dict, batches: list[int], out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    b = results["bounds"]
    print(f"\nmachine: read {b['read_GBps']:.1f} GB/s, copy {b['copy_GBps']:.1f} GB/s (read+write), matmul fp32 {b['matmul_GFLOPs_float32']:.0f} "
          f"GFLOP/s, bf16 {b['matmul_GFLOPs_bfloat16']:.0f} GFLOP/s, {results['threads']} threads")
    head = f"{'dtype':9} {'what':18} {'batch-1 decode':>15}" + "".join(f" {'e2e b' + str(x):>12}" for x in batches)
    print(head)
    for r in results["rows"]:
        for who in ("ours", "hf", "triton", "ours-text", "ensemble"):
            if not any(k.startswith(who + "_") for k in r):
                continue
            line = f"{r['dtype']:9} {who:18} {r.get(who + '_b1', float('nan')):15.1f}"
            line += "".join(f" {r.get(f'{who}_e2e_b{x}', float('nan')):12.1f}" for x in batches)
            print(line)
        if "hf_b1" in r:
            line = f"{r['dtype']:9} {'ratio ours/HF':18} {r['ours_b1'] / r['hf_b1']:14.2f}x"
            line += "".join(f" {r[f'ours_e2e_b{x}'] / r[f'hf_e2e_b{x}']:11.2f}x" for x in batches)
            print(line)
        if any(k.startswith("triton") for k in r):
            print(f"{r['dtype']:9} {'ratio Triton/ours':18} {'':15}"
                  + "".join(f" {r[f'triton_e2e_b{x}'] / r[f'ours_e2e_b{x}']:11.2f}x" for x in batches))
        if any(k.startswith("ensemble") for k in r):
            print(f"{r['dtype']:9} {'ratio ensemble/ours':18} {'':15}"
                  + "".join(f" {r[f'ensemble_e2e_b{x}'] / r[f'ours-text_e2e_b{x}']:11.2f}x" for x in batches))
        print(f"{r['dtype']:9} {'bandwidth bound':18} {r['bw_bound_tok_s']:15.1f}   (ours at "
              f"{100 * r['ours_b1'] / r['bw_bound_tok_s']:.0f}% of it: {r['streamed_MB']:.0f} MB of weights read per "
              f"token of {r['weight_MB']:.0f} MB)")
        s = r["kv_bytes_per_token"]
        print(f"{r['dtype']:9} KV bytes/token {s} (= 2 x layers x kv_heads x head_dim x dtype bytes)")
    import resource

    results["peak_rss_MB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {results['peak_rss_MB']:.0f} MB (HF and our engine both loaded in turn)")
    with open(os.path.join(out_dir, "engine.json"), "w") as f:
        json.dump(results, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results["rows"]:
        for who in ("ours", "hf", "triton", "ensemble"):
            ys = [r.get(f"{who}_e2e_b{x}") for x in batches]
            if all(y is not None for y in ys):
                ax.plot(batches, ys, marker="o", label=f"{who} {r['dtype']}")
    ax.set_xlabel("batch (concurrent requests)")
    ax.set_ylabel("output tokens/s (e2e)")
    ax.set_xscale("log", base=2)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "engine.png"), dpi=120)
    log(f"wrote {out_dir}/engine.json and engine.png")


if __name__ == "__main__":
    main()
