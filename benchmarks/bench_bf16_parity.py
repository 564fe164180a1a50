"""Greedy agreement of our engine with HF transformers in bf16 (and fp32 as the control), one process.

bf16 rounds differently in every implementation (op order, fused kernels), so bf16 greedy outputs drift
apart after some tokens; this reports how far they agree: sequences equal over all `--new` tokens, and
the mean length of the common prefix. fp32 must agree fully (the engine's parity tests assert it).

    python benchmarks/bench_bf16_parity.py [--model build/models/demo] [--prompts 16] [--new 32]
"""
from __future__ import annotations

import argparse
import os
import random

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from tritonllm.engine.config import EngineConfig  # noqa: E402
from tritonllm.engine.engine import LLMEngine  # noqa: E402
from tritonllm.engine.hf_config import load_spec  # noqa: E402
from tritonllm.engine.request import SamplingParams  # noqa: E402


def ours(model: str, dtype: str, prompts: list[list[int]], new: int) -> list[list[int]]:
    engine = LLMEngine(model, EngineConfig(max_kv_tokens=len(prompts) * 256, dtype=dtype, device="cpu"))
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, SamplingParams(max_tokens=new, end_id=-1))
    out: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_work():
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    return [out[str(i)] for i in range(len(prompts))]


def hf(model: str, dtype: str, prompts: list[list[int]], new: int) -> list[list[int]]:
    import transformers as tf

    m = tf.AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
    res = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            g = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, eos_token_id=None, pad_token_id=0)
            res.append(g[0, len(p):].tolist())
    return res


def prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "models", "demo"))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args()
    vocab = load_spec(args.model).vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(8, 48))] for _ in range(args.prompts)]
    print(f"{args.model}: {args.prompts} random prompts, {args.new} greedy tokens, EOS ignored")
    for dtype in ("float32", "bfloat16"):
        a, b = ours(args.model, dtype, prompts, args.new), hf(args.model, dtype, prompts, args.new)
        same = sum(x == y for x, y in zip(a, b))
        mean = sum(prefix(x, y) for x, y in zip(a, b)) / len(a)
        print(f"{dtype:9} sequences equal {same}/{len(a)}, mean common prefix {mean:.1f} of {args.new} tokens")


if __name__ == "__main__":
    main()
