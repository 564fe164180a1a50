"""Where a decode step's time goes: the engine's steps on the bench model, each native kernel call timed.

    python benchmarks/profile_step.py [--model PATH] [--quantization int4] [--activation-quantization none]
                                      [--batch 16] [--prompt-len 128] [--new 64]

--model: an HF folder or a GGUF file (default: the bench model; ``default`` = the default model's GGUF, whose
blocks need no --quantization).

Runs --batch requests of --prompt-len tokens to --new tokens (after a short warm-up), with every call into the
native extension (matmuls, attention, norms) wrapped in a timer, and prints the prefill step, the median
decode step and each kernel's share per decode step; the rest is torch ops and Python. The timers add a
little overhead of their own: compare the total with benchmarks/bench_quant.py's rates, not to the
microsecond.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "backends"), os.path.join(ROOT, "benchmarks")]

from bench_model import build_bench_model  # noqa: E402
from tritonllm.engine.config import EngineConfig  # noqa: E402
from tritonllm.engine.engine import LLMEngine  # noqa: E402
from tritonllm.engine.request import SamplingParams  # noqa: E402


class Timed:
    """Stands in for the extension module: every function call is timed into ``totals`` / ``calls``."""

    def __init__(self, ext) -> None:
        self.ext, self.totals, self.calls = ext, collections.defaultdict(float), collections.Counter()

    def __getattr__(self, name):
        fn = getattr(self.ext, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[name] += time.perf_counter() - start
                self.calls[name] += 1
        return timed


def attach(model, timed: Timed) -> None:
    model.native = timed
    model.decode_stack = None  # the per-layer path, so that each kernel is timed (the fused step calls them in C++)
    for layer in model.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            weight = getattr(layer, name)
            if getattr(weight, "native", None) is not None:
                weight.use_kernels(timed, weight.int8_activations)
    if getattr(model.lm_head, "native", None) is not None:
        model.lm_head.use_kernels(timed, model.lm_head.int8_activations)


def run(engine, batch: int, prompt_len: int, new: int) -> list[float]:
    for i in range(batch):
        vocab = engine.spec.vocab_size
        engine.add_request(f"{time.monotonic()}-{i}", [(7 * i + j) % (vocab - 10) + 5 for j in range(prompt_len)],
                           SamplingParams(max_tokens=new, end_id=-1))
    steps = []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    return steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="HF folder or GGUF file; 'default': deployment.yaml's model")
    ap.add_argument("--quantization", default=None, help="weights quantized at load (default: int4 on the bench "
                    "model, none on a GGUF, whose blocks are used as stored)")
    ap.add_argument("--activation-quantization", default="auto", choices=("auto", "none", "int8"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.model == "default":
        sys.path.insert(0, os.path.join(ROOT, "build_scripts"))
        import default_model

        a.model = str(default_model.ensure())
    model_dir = a.model or build_bench_model(os.path.join(ROOT, "build", "models", "bench"))
    if a.quantization is None:
        a.quantization = "none" if a.model else "int4"
    engine = LLMEngine(model_dir, EngineConfig(quantization=a.quantization, max_num_seqs=a.batch, max_num_tokens=2048,
                                               max_kv_tokens=a.batch * (a.prompt_len + a.new + 16),
                                               num_threads=a.threads,
                                               activation_quantization=a.activation_quantization))
    if engine.model.native is None:
        sys.exit("native CPU kernels are not in use (cpu_kernels torch, or not built): nothing to time")
    run(engine, a.batch, a.prompt_len, 4)
    timed = Timed(engine.model.native)
    attach(engine.model, timed)
    steps = run(engine, a.batch, a.prompt_len, a.new)
    prefill = [s for s in steps[: len(steps) - a.new + 1]]
    decode = sorted(steps[len(prefill):])
    median = decode[len(decode) // 2]
    print(f"{os.path.basename(model_dir)}, {a.quantization}, activations {a.activation_quantization}, batch {a.batch}, {a.prompt_len}-token prompts, {a.new} new, {a.threads} threads")
    print(f"prefill: {sum(prefill) * 1e3:.0f} ms in {len(prefill)} step(s); decode: median {median * 1e3:.2f} ms a step, "
          f"{len(decode)} steps, {sum(decode) * 1e3:.0f} ms")
    print(f"{'kernel':<18}{'ms total':>10}{'calls':>8}   (prefill included)")
    for name in sorted(timed.totals, key=timed.totals.get, reverse=True):
        print(f"{name:<18}{timed.totals[name] * 1e3:10.1f}{timed.calls[name]:8d}")
    print(f"{'other':<18}{(sum(steps) - sum(timed.totals.values())) * 1e3:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
