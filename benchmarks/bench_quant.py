"""Quantized weights against fp32 on our engine, in one invocation (issue 17).

    python benchmarks/bench_quant.py [--modes none,fp8,int8,int4,int4_sym] [--new 64] [--threads 2]

Speed, on the benchmark checkpoint of issue #9 (124.7M parameters, build/models/bench): weight bytes,
batch-1 decode tokens/s (as bench_engine.py: (new - 1) tokens over the time beyond a 1-token run, best of
3) and batch-16 end-to-end tokens/s (prefill included), each with its ratio to fp32 and the bandwidth bound
(read bandwidth / weight bytes per token). The native kernels are used where they apply (cpu_kernels auto).

Quality, on the trained demo model (build/models/demo): perplexity on held-out text of the corpus's kind
(docstrings of jinja2, urllib3, requests and packaging from the serving venv, read and cleaned as
build_scripts/demo_corpus.py reads the standard library's, which is what the demo learned from; windows of
128 tokens, the training length), computed
by transformers with every projection and the LM head replaced by the mode's dequantized weights: the
effect of the weight format itself. The native int8 dot products add the activations' rounding on top
(bounded and measured in tests/unit/test_quant.py).

Peers (``--llamacpp auto``: when `make bench-peers` has built build/peers/llamacpp; ``require`` builds it):
llama.cpp from the same vendored build, the same checkpoint as GGUF F32 and ``llama-quantize`` Q8_0, Q4_0,
Q4_K_M, measured by benchmarks/peers/llamacpp_runner.py exactly as bench_peers.py measures it (batch-1
decode as ours; batch 16 by llama-batched-bench, prefill included) on the same prompts, in this invocation.
Their size column is the GGUF file (the token embedding included, which a decode step only gathers from).

Results: build/bench/quant/results.json, plot build/bench/quant/quant.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
from bench_engine import decode_rate, engine_run, log, machine_bounds, prompts, rate  # noqa: E402
from bench_model import build_bench_model  # noqa: E402
from plotting import pyplot  # noqa: E402
from tritonllm.engine.config import EngineConfig  # noqa: E402
from tritonllm.engine.engine import LLMEngine  # noqa: E402
from tritonllm.engine.fp8 import FP8Weight  # noqa: E402
from tritonllm.engine.quant import Int8Weight, quantize  # noqa: E402


def weight_bytes(model) -> int:
    """Bytes a decode step reads: every layer matrix and the LM head (the embedding is a row lookup)."""
    def size(w):
        return w.nbytes if hasattr(w, "nbytes") and not isinstance(w, torch.Tensor) else w.numel() * w.element_size()
    total = sum(size(getattr(layer, n)) for layer in model.layers for n in ("qkv", "o", "gate_up", "down"))
    return total + size(model.lm_head)


def speed(mode: str, model_dir: str, args) -> dict:
    engine = LLMEngine(model_dir, EngineConfig(quantization=mode, max_kv_tokens=16 * (args.prompt_len + args.new + 16),
                                               max_num_seqs=16, max_num_tokens=2048, num_threads=args.threads))
    work = prompts(16, args.prompt_len, engine.spec.vocab_size)
    run = lambda batch, n: engine_run(engine, batch, n)  # noqa: E731
    run(work[:1], 4)  # warm-up
    row = {"mode": mode, "weight_MB": weight_bytes(engine.model) / 1e6,
           "b1_decode": decode_rate(run, work[:1], args.new), "e2e_b16": rate(run(work, args.new))}
    log(f"{mode}: {row['weight_MB']:.0f} MB, batch-1 decode {row['b1_decode']:.1f} tok/s, "
        f"batch-16 {row['e2e_b16']:.1f} tok/s")
    return row


LLAMACPP_KINDS = ("F32", "Q8_0", "Q4_0", "Q4_K_M")


def llamacpp_rows(args, bench_dir: str, vocab: int) -> list[dict]:
    from peers import setup_envs

    if args.llamacpp == "auto" and not (os.path.exists(setup_envs.QUANTIZE) and os.path.exists(setup_envs.BATCHED_BENCH)):
        log("llama.cpp skipped: build/peers/llamacpp lacks llama-quantize (make bench-peers, or --llamacpp require)")
        return []
    py = setup_envs.llamacpp_env()
    f32 = setup_envs.gguf_f32(py, setup_envs.model_with_tokenizer(bench_dir))
    work = prompts(16, args.prompt_len, vocab)
    rows = []
    for kind in LLAMACPP_KINDS:
        gguf = f32 if kind == "F32" else setup_envs.gguf_quantized(f32, kind)
        spec = {"gguf": gguf, "prompts": work, "new": args.new, "threads": args.threads, "batches": [16],
                "check_prompts": 0, "check_n": 1, "batched_bench": setup_envs.BATCHED_BENCH, "repeat": 2}
        p = subprocess.run([py, str(ROOT / "benchmarks" / "peers" / "llamacpp_runner.py")], input=json.dumps(spec),
                           capture_output=True, text=True, env=setup_envs.llamacpp_runtime_env(), timeout=1800)
        if p.returncode != 0:
            log(f"llama.cpp {kind} failed: {p.stderr[-500:]}")
            continue
        res = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append({"mode": f"llama.cpp {kind}", "weight_MB": os.path.getsize(gguf) / 1e6, "file_size": True,
                     "b1_decode": res["b1_decode"], "e2e_b16": res["e2e_b16"]})
        log(f"llama.cpp {kind}: {rows[-1]['weight_MB']:.0f} MB file, batch-1 decode {res['b1_decode']:.1f} tok/s, "
            f"batch-16 {res['e2e_b16']:.1f} tok/s")
    return rows


def dequantized(w: torch.Tensor, mode: str, group: int) -> torch.Tensor:
    if mode == "fp8":
        return FP8Weight(w).dequant(torch.float32)
    return quantize(w, mode[:4], group, mode.endswith("_sym")).dequant()


def perplexity(mode: str, model_dir: Path, ids: list[int], args, replace: dict | None = None) -> float:
    """``replace``: parameters to load as they are (a quantized checkpoint's dequantized projections and
    scaled norms); the LM head then goes to int8 as the engine's does."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    if mode != "none" or replace:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if replace and name in replace:
                    p.copy_(replace[name])
                if name.endswith("_proj.weight") and mode != "none":
                    p.copy_(dequantized(p, mode, args.group))
                elif name == "lm_head.weight" and mode != "fp8":  # int modes: the engine's LM head is int8
                    p.copy_(Int8Weight(p).dequant())
    nll, count, w = 0.0, 0, args.window
    with torch.no_grad():
        for start in range(0, min(len(ids) - 1, args.windows * w), w):
            chunk = torch.tensor([ids[start:start + w + 1]])
            lp = torch.log_softmax(model(chunk[:, :-1]).logits[0].float(), dim=-1)
            tgt = chunk[0, 1:]
            nll -= float(lp[torch.arange(len(tgt)), tgt].sum())
            count += len(tgt)
    return math.exp(nll / count)


def checkpoint_perplexity(qdir: Path, base: Path, ids: list[int], args) -> float:
    """Perplexity of a quantized checkpoint: transformers on the weights our reader dequantizes from it."""
    from tritonllm.engine.loader import checkpoint_quantization, load_weights
    from tritonllm.engine.quant_formats import load_prequantized

    weights = load_prequantized(load_weights(str(qdir)), checkpoint_quantization(str(qdir)))
    tensors = {k: v.dequant() if hasattr(v, "dequant") else v for k, v in weights.items()}
    return perplexity("none", base, ids, args, replace=tensors)


def quantize_script_rows(demo: Path, ids: list[int], args) -> list[dict]:
    """build_scripts/quantize.py on the demo model, RTN against AWQ at the same format (calibrated on the
    demo corpus, which the held-out text is not part of): groups of 64 and one scale per channel."""
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for group in (64, -1):
            for method in ("rtn", "awq"):
                out = Path(tmp) / f"{method}{group}"
                subprocess.run([sys.executable, str(ROOT / "build_scripts" / "quantize.py"), "--model", str(demo),
                                "--out", str(out), "--method", method, "--group-size", str(group),
                                "--calib-samples", "32", "--calib-len", "128"], check=True, stdout=subprocess.DEVNULL)
                name = f"int4 {'ch' if group == -1 else f'g{group}'} {method} (quantize.py)"
                rows.append({"mode": name, "perplexity": checkpoint_perplexity(out, demo, ids, args)})
                log(f"{name}: perplexity {rows[-1]['perplexity']:.2f}")
    return rows


HELD_OUT_PACKAGES = ("jinja2", "urllib3", "requests", "packaging")


def held_out_ids(model_dir: Path) -> list[int]:
    import site

    from tokenizers import Tokenizer

    sys.path.insert(0, str(ROOT / "build_scripts"))
    import demo_corpus

    root = Path(site.getsitepackages()[0])
    docs = [d for pkg in HELD_OUT_PACKAGES if (root / pkg).is_dir() for d in demo_corpus._stdlib_docstrings(root / pkg)]
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return tok.encode("\n\n".join(docs)).ids


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    names = [r["mode"] for r in rows]
    for ax, key, title in zip(axes, ("b1_decode", "e2e_b16", "perplexity"),
                              ("batch-1 decode tok/s", "batch-16 tok/s", "demo perplexity (held out)")):
        ax.bar(names, [r.get(key, 0) for r in rows])
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="none,fp8,int8,int4,int4_sym")
    ap.add_argument("--group", type=int, default=32, help="quant_group_size for int4")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-quantize-script", action="store_true", help="no RTN / AWQ rows of build_scripts/quantize.py")
    ap.add_argument("--llamacpp", choices=("auto", "skip", "require"), default="auto")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "quant"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    modes = args.modes.split(",")
    bounds = machine_bounds()
    demo = ROOT / "build" / "models" / "demo"
    ids = held_out_ids(demo)
    rows = []
    bench_dir = None if args.skip_speed else build_bench_model(str(ROOT / "build" / "models" / "bench"))
    for i, mode in enumerate(modes, 1):
        log(f"[{i}/{len(modes)}] {mode}")
        row = speed(mode, bench_dir, args) if bench_dir else {"mode": mode}
        row["perplexity"] = perplexity(mode, demo, ids, args)
        rows.append(row)
    if not args.skip_quantize_script:
        rows += quantize_script_rows(demo, ids, args)
    if bench_dir and args.llamacpp != "skip":
        rows += llamacpp_rows(args, bench_dir, 32000)
    base = rows[0]
    print(f"\nmachine: read {bounds['read_GBps']:.1f} GB/s; bench model 124.7M, prompt {args.prompt_len}, "
          f"{args.new} new tokens, {args.threads} threads; demo perplexity on {min(len(ids), args.windows * args.window)}"
          f" held-out tokens")
    print(f"{'mode':<17}{'weights':>10}{'b1 tok/s':>10}{'(bound)':>9}{'b16 tok/s':>11}{'ppl':>8}  ratios vs {base['mode']}"
          "  (* GGUF file size)")
    for r in rows:
        if "weight_MB" in r:
            bound = bounds["read_GBps"] * 1e3 / r["weight_MB"]
            ppl = f"{r['perplexity']:>8.2f}" if "perplexity" in r else f"{'-':>8}"
            size = f"{r['weight_MB']:>7.0f}{'MB*' if r.get('file_size') else 'MB '}"
            print(f"{r['mode']:<17}{size}{r['b1_decode']:>10.1f}{bound:>9.0f}"
                  f"{r['e2e_b16']:>11.1f}{ppl}  b1 {r['b1_decode'] / base['b1_decode']:.2f}x, "
                  f"b16 {r['e2e_b16'] / base['e2e_b16']:.2f}x")
        elif "perplexity" in r:
            print(f"{r['mode']:<17}{'':>40}{r['perplexity']:>8.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "machine": bounds, "rows": rows}, indent=2))
    plot(rows, out / "quant.png")
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
