#!/usr/bin/env python3
"""Send N generation requests at once (asyncio over Triton's async gRPC client) and summarize them.

    python clients/concurrent_example.py -n 8 --max-tokens 32
    python clients/concurrent_example.py -n 16 --model ensemble --url localhost:8001 --temperature 0.8 --seed 1

Each request streams (one gRPC bidirectional stream per request, all sharing one channel); the summary
gives wall time, requests/s, generated tokens/s over the wall time, and TTFT / total latency
p50 / p95 / max. With inflight batching the engine decodes the N sequences together, so tokens/s should
grow with N until the CPU (or the token budget) saturates.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from clients.openai_server.protocol import ApiError  # noqa: E402
from clients.openai_server.triton import TritonText  # noqa: E402
from clients.triton_llm import TEXT_MODELS, GenerationParams  # noqa: E402

PROMPTS = ["Once upon a time", "The ship sailed", "In the morning the village", "She opened the letter",
           "The old lighthouse", "Rain fell over the city", "He counted the steps", "A fox crossed the road"]


async def one(triton: TritonText, i: int, prompt: str, params: GenerationParams, model: str) -> dict:
    start = time.perf_counter()
    first, tokens, text = None, 0, []
    try:
        async for chunk in triton.generate(prompt, params, stream=True, model=model):
            if chunk.text and first is None:
                first = time.perf_counter() - start
            tokens += chunk.num_output_tokens or 0  # each response counts its own tokens
            text.append(chunk.text)
    except ApiError as e:
        return {"i": i, "error": f"{e.status}: {e.message}"}
    return {"i": i, "ttft": first, "latency": time.perf_counter() - start, "tokens": tokens, "text": "".join(text)}


async def run(args) -> int:
    triton = TritonText(args.url, args.model, fallback=None)
    params = GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature,
                              top_p=1.0 if args.temperature else None, seed=args.seed)
    try:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(triton, i, PROMPTS[i % len(PROMPTS)], params, args.model)
                                         for i in range(args.n)))
        wall = time.perf_counter() - start
    finally:
        await triton.close()
    ok = [r for r in results if "error" not in r]
    for r in results:
        line = r.get("error") or f"{r['tokens']:>4} tokens {r['latency']:6.2f} s | {r['text'][:60]!r}"
        print(f"[{r['i']:>3}] {line}")
    if not ok:
        return 1
    tokens = sum(r["tokens"] for r in ok)
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    lat = [r["latency"] for r in ok]

    def pct(xs, q):
        return float(np.percentile(xs, q)) * 1000 if xs else float("nan")

    print(f"--- {len(ok)}/{args.n} ok on {args.model} in {wall:.2f} s: {len(ok) / wall:.2f} req/s, "
          f"{tokens / wall:.1f} generated tokens/s")
    print(f"    TTFT ms  p50 {pct(ttft, 50):.1f}  p95 {pct(ttft, 95):.1f}  max {max(ttft) * 1000 if ttft else 0:.1f}")
    print(f"    latency ms  p50 {pct(lat, 50):.1f}  p95 {pct(lat, 95):.1f}  max {max(lat) * 1000:.1f}")
    return 0 if len(ok) == args.n else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=8, help="concurrent requests")
    p.add_argument("--url", default="localhost:8001", help="Triton gRPC host:port")
    p.add_argument("--model", choices=TEXT_MODELS, default="tensorrt_llm_bls")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int)
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
