"""FP8 figures on the trained demo model, side by side with full precision in one process:
weight bytes and KV bytes per token vs bf16, concurrent sequences at the same KV budget, greedy token
agreement over 1,000 generated tokens, and mean absolute logit difference (teacher-forced on the
full-precision sequence).

    python benchmarks/bench_fp8.py [--model build/models/demo] [--tokens 1000]
"""
from __future__ import annotations

import argparse
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from tritonllm.engine.config import EngineConfig  # noqa: E402
from tritonllm.engine.engine import LLMEngine  # noqa: E402
from tritonllm.engine.fp8 import FP8Weight  # noqa: E402
from tritonllm.engine.model import AttentionMeta  # noqa: E402
from tritonllm.engine.request import SamplingParams  # noqa: E402


def greedy(engine: LLMEngine, prompt: list[int], n: int) -> list[int]:
    engine.add_request("g", prompt, SamplingParams(max_tokens=n, end_id=-1))
    out: list[int] = []
    while engine.has_work():
        for o in engine.step():
            out += o.new_token_ids
    return out


def score(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """Logits at every position of `ids` in one causal prefill (teacher forcing), through a private cache."""
    m, T = engine.model, len(ids)
    kv_dtype = engine.kv.k[0].dtype
    shape = (T, m.spec.num_kv_heads, m.spec.head_dim)
    ks = [torch.zeros(shape, dtype=kv_dtype) for _ in m.layers]
    vs = [torch.zeros(shape, dtype=kv_dtype) for _ in m.layers]
    pos = torch.arange(T)
    meta = AttentionMeta(pos, None, None, None, [(0, T, pos, pos[None, :] <= pos[:, None])])
    return m.forward(torch.tensor(ids), pos, meta, ks, vs, pos)[0]


def layer_bytes(engine: LLMEngine) -> int:
    total = 0
    for layer in engine.model.layers:
        for t in vars(layer).values():
            if isinstance(t, FP8Weight):
                total += t.nbytes
            elif isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "models", "demo"))
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--kv-budget-mb", type=int, default=256)
    args = ap.parse_args()
    cfg = dict(max_kv_tokens=args.tokens + 64, dtype="float32")
    full = LLMEngine(args.model, EngineConfig(**cfg))
    fp8 = LLMEngine(args.model, EngineConfig(quantization="fp8", kv_cache_dtype="fp8", **cfg))
    bf16_layer_bytes = layer_bytes(full) // 2          # fp32 checkpoint: bf16 is half of it
    spec = full.spec
    bf16_kv = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
    print(f"transformer-layer weights: bf16 {bf16_layer_bytes / 1e6:.2f} MB, fp8 {layer_bytes(fp8) / 1e6:.2f} MB "
          f"({bf16_layer_bytes / layer_bytes(fp8):.2f}x smaller; embeddings and lm_head stay full precision)")
    print(f"KV bytes per token: bf16 {bf16_kv}, fp8 {fp8.kv_bytes_per_token} ({bf16_kv / fp8.kv_bytes_per_token:.2f}x)")
    budget, seq = args.kv_budget_mb << 20, 2048
    print(f"concurrent {seq}-token sequences in {args.kv_budget_mb} MB of KV: bf16 {budget // (bf16_kv * seq)}, "
          f"fp8 {budget // (fp8.kv_bytes_per_token * seq)} "
          f"({(budget // (fp8.kv_bytes_per_token * seq)) / max(budget // (bf16_kv * seq), 1):.2f}x)")
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(args.model).encode("The Python language reference describes")
    ref = greedy(full, prompt, args.tokens)
    got = greedy(fp8, prompt, args.tokens)
    same = sum(a == b for a, b in zip(ref, got))
    first_diff = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), len(ref))
    seq_ids = prompt + ref
    lf, lq = score(full, seq_ids), score(fp8, seq_ids)
    tf_agree = (lf.argmax(-1) == lq.argmax(-1)).float().mean().item()
    print(f"greedy agreement over {args.tokens} tokens: {100 * same / len(ref):.1f}% position-wise "
          f"(identical for the first {first_diff}); teacher-forced argmax agreement {100 * tf_agree:.1f}%; "
          f"mean |logit difference| {(lf - lq).abs().mean().item():.4f} (logit std {lf.std().item():.2f})")


if __name__ == "__main__":
    main()
