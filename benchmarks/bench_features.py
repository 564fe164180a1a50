"""Engine feature figures, each measured side by side in one process on the benchmark model:
- prefix caching: time to first token of a request sharing a 1,024-token prefix, cold vs warm, hit rate;
- speculative decoding, batch-1 decode tokens/s with and without drafts, acceptance rate: prompt lookup on
  an extractive prompt; a draft model (the target's first layers: a layer-skip drafter) on the same
  prompt and on a non-extractive one;
- token budget sweep: TTFT and time per output token vs max_num_tokens under a mixed load (plot).

    python benchmarks/bench_features.py [--prefix-len 1024] [--budgets 64,128,256,512,1024]
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
from tritonllm.engine.request import SamplingParams  # noqa: E402


def ttft(engine: LLMEngine, rid: str, prompt: list[int]) -> float:
    t = time.perf_counter()
    engine.add_request(rid, prompt, SamplingParams(max_tokens=1, end_id=-1))
    while engine.has_work():
        engine.step()
    return time.perf_counter() - t


def prefix_figure(model_dir: str, prefix_len: int) -> dict:
    rng = random.Random(0)
    prefix = [rng.randrange(3, 32000) for _ in range(prefix_len)]
    tails = [[rng.randrange(3, 32000) for _ in range(16)] for _ in range(3)]
    engine = LLMEngine(model_dir, EngineConfig(max_kv_tokens=8192, max_num_tokens=2048,
                                               enable_prefix_caching=True))
    cold = ttft(engine, "cold", prefix + tails[0])
    warm = min(ttft(engine, f"warm{i}", prefix + t) for i, t in enumerate(tails[1:]))
    s = engine.stats
    return {"prefix_len": prefix_len, "ttft_cold_s": cold, "ttft_warm_s": warm, "speedup": cold / warm,
            "hit_rate": s.prefix_hit_tokens / s.prefix_query_tokens}


def layer_skip_drafter(model_dir: str, layers: int) -> str:
    """A checkpoint of the target's first `layers` layers (same embeddings, norm and head): a cheap drafter
    that shares the tokenizer. How often it agrees with the target depends on the weights (random here)."""
    from safetensors.torch import load_file, save_file

    out = os.path.join(os.path.dirname(model_dir), f"{os.path.basename(model_dir)}-draft{layers}")
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        return out
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = layers
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    keep = {k: v for k, v in weights.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    save_file(keep, os.path.join(out, "model.safetensors"))
    return out


def decode_rate(engine: LLMEngine, prompt: list[int], new: int) -> float:
    """Batch-1 decode tokens/s after the prefill (a warm-up request first)."""
    engine.add_request("w", prompt, SamplingParams(max_tokens=2, end_id=-1))
    while engine.has_work():
        engine.step()
    engine.add_request("x", prompt, SamplingParams(max_tokens=new, end_id=-1))
    engine.step()                                   # prefill + first token
    t, n = time.perf_counter(), 0
    while engine.has_work():
        n += sum(len(o.new_token_ids) for o in engine.step())
    return n / (time.perf_counter() - t)


def speculative_figure(model_dir: str, new: int = 128, k: int = 4, draft_layers: int = 2) -> dict:
    """Extractive workload: the prompt repeats a passage, so a faithful continuation copies it; the
    non-extractive prompt is random ids (n-gram lookup finds nothing there)."""
    rng = random.Random(2)
    passage = [rng.randrange(3, 32000) for _ in range(64)]
    prompts = {"extractive": passage * 4 + passage[:8], "random": [rng.randrange(3, 32000) for _ in range(264)]}
    drafter = layer_skip_drafter(model_dir, draft_layers)
    runs = {"off": {}, "prompt_lookup": {"max_draft_len": k},
            "draft_model": {"max_draft_len": k, "draft_model_path": drafter}}
    out = {"max_draft_len": k, "draft_layers": draft_layers}
    for kind, prompt in prompts.items():
        for name, extra in runs.items():
            if kind == "random" and name == "prompt_lookup":
                continue
            engine = LLMEngine(model_dir, EngineConfig(max_kv_tokens=4096, **extra))
            rate = decode_rate(engine, prompt, new)
            s = engine.stats
            out[f"{kind}/{name}"] = {"decode_tok_s": rate,
                                     "acceptance": s.accepted_draft_tokens / max(s.draft_tokens, 1)}
        base = out[f"{kind}/off"]["decode_tok_s"]
        for name in runs:
            if f"{kind}/{name}" in out:
                out[f"{kind}/{name}"]["speedup"] = out[f"{kind}/{name}"]["decode_tok_s"] / base
    out.update(demo_prompt_lookup(k))
    return out


def demo_prompt_lookup(k: int, new: int = 128) -> dict:
    """Prompt lookup on the trained demo model (build/models/demo, if built) with an English passage
    repeated three times. Neither this 5M model nor the random one copies the passage: the random model
    repeats one token, the demo model loops on its own phrases; drafts predict that self-repetition."""
    demo = os.path.join(ROOT, "build", "models", "demo")
    if not os.path.isfile(os.path.join(demo, "tokenizer.json")):
        return {}
    from transformers import AutoTokenizer

    text = ("The lighthouse keeper climbed the narrow stairs every evening, lit the great lamp, and watched "
            "the ships pass safely along the rocky coast until the morning sun rose over the quiet harbour. ")
    prompt = AutoTokenizer.from_pretrained(demo)(text * 3 + "The lighthouse keeper").input_ids
    base = decode_rate(LLMEngine(demo, EngineConfig(max_kv_tokens=4096)), prompt, new)
    engine = LLMEngine(demo, EngineConfig(max_kv_tokens=4096, max_draft_len=k))
    rate = decode_rate(engine, prompt, new)
    s = engine.stats
    return {"demo-model/off": {"decode_tok_s": base, "acceptance": 0.0, "speedup": 1.0},
            "demo-model/prompt_lookup": {"decode_tok_s": rate, "speedup": rate / base,
                                         "acceptance": s.accepted_draft_tokens / max(s.draft_tokens, 1)}}


def budget_sweep(model_dir: str, budgets: list[int], n_long: int = 2, n_short: int = 8) -> list[dict]:
    """Long prompts (512) arrive while short requests decode: a larger budget prefills faster (TTFT)
    but stalls running decodes longer per step (TPOT)."""
    rng = random.Random(1)
    longs = [[rng.randrange(3, 32000) for _ in range(512)] for _ in range(n_long)]
    shorts = [[rng.randrange(3, 32000) for _ in range(16)] for _ in range(n_short)]
    rows = []
    for budget in budgets:
        engine = LLMEngine(model_dir, EngineConfig(max_kv_tokens=16384, max_num_tokens=budget))
        arrival, first, last, count = {}, {}, {}, {}
        for i, p in enumerate(shorts):
            arrival[f"s{i}"] = time.perf_counter()
            engine.add_request(f"s{i}", p, SamplingParams(max_tokens=32, end_id=-1))
        step = 0
        while engine.has_work() or step < 4:
            if step == 3:
                for i, p in enumerate(longs):
                    arrival[f"l{i}"] = time.perf_counter()
                    engine.add_request(f"l{i}", p, SamplingParams(max_tokens=8, end_id=-1))
            for out in engine.step():
                now = time.perf_counter()
                first.setdefault(out.request_id, now)
                last[out.request_id] = now
                count[out.request_id] = out.num_output_tokens
            step += 1
        ttft_long = sum(first[r] - arrival[r] for r in first if r[0] == "l") / n_long
        tpot_short = sum((last[r] - first[r]) / max(count[r] - 1, 1) for r in first if r[0] == "s") / n_short
        rows.append({"max_num_tokens": budget, "ttft_long_s": ttft_long, "tpot_short_s": tpot_short})
        print(f"  budget {budget:5d}: TTFT(long) {ttft_long:.3f}s  TPOT(short) {1000 * tpot_short:.1f} ms",
              file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--budgets", default="64,128,256,512,1024")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = build_bench_model(os.path.join(ROOT, "build", "models", "bench"))
    pf = prefix_figure(model_dir, args.prefix_len)
    print(f"prefix caching: TTFT cold {pf['ttft_cold_s']:.3f}s, warm {pf['ttft_warm_s']:.3f}s -> "
          f"{pf['speedup']:.1f}x faster; prompt-token hit rate {100 * pf['hit_rate']:.0f}%")
    sp = speculative_figure(model_dir)
    print(f"speculative decoding (k={sp['max_draft_len']}; draft model = the target's first "
          f"{sp['draft_layers']} layers), batch-1 decode:")
    for key, r in sp.items():
        if isinstance(r, dict):
            print(f"  {key:28s} {r['decode_tok_s']:6.1f} tok/s  {r['speedup']:.2f}x  "
                  f"acceptance {100 * r['acceptance']:.0f}%")
    print("token budget sweep (2 prompts of 512 arriving among 8 decoding requests):")
    sweep = budget_sweep(model_dir, [int(b) for b in args.budgets.split(",")])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "features.json"), "w") as f:
        json.dump({"prefix_cache": pf, "speculative": sp, "budget_sweep": sweep}, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax1 = plt.subplots(figsize=(6, 4))
    xs = [r["max_num_tokens"] for r in sweep]
    ax1.plot(xs, [r["ttft_long_s"] for r in sweep], "o-", color="tab:blue", label="TTFT of 512-token prompts")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("max_num_tokens (per-step token budget)")
    ax1.set_ylabel("TTFT (s)", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(xs, [1000 * r["tpot_short_s"] for r in sweep], "s-", color="tab:red", label="TPOT of decodes")
    ax2.set_ylabel("time per output token (ms)", color="tab:red")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "budget_sweep.png"), dpi=120)
    print(f"wrote {args.out}/features.json and budget_sweep.png")


if __name__ == "__main__":
    main()
