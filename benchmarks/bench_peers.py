"""Our engine vs HF transformers vs the peers (vLLM CPU, llama.cpp) on the bench workload (issue #9).

Workload of benchmarks/bench_engine.py: the random 124.7M Llama, 16 prompts of 128 token ids, 128 greedy new
tokens, EOS ignored, 2 threads, fp32. Reports batch-1 decode tok/s and batch-16 e2e tok/s (output tokens /
wall time, prefill included). Ours and vLLM run with the same per-step token budget (--max-num-tokens,
default 512 = deployment.yaml's). Each peer lives in its own virtualenv under build/peers (benchmarks/peers/
setup_envs.py; first run ~6 GB and 15-25 minutes on 2 cores) and runs in a subprocess; ours and HF run in
this process. Each figure is the best of --repeat runs; the 1-minute load average is recorded per engine.
A peer's first greedy ids are checked against ours (fp32); one that disagrees is flagged in the table.
Writes build/bench/peers.json and peers.png. A peer that cannot run here is reported, not fatal.

    python benchmarks/bench_peers.py [--peers vllm,llamacpp] [--skip-hf] [--threads 2] [--quiet-wait 300]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "backends"), os.path.join(ROOT, "benchmarks")]

from bench_engine import decode_rate, engine_run, hf_run, log, machine_bounds, prompts, rate  # noqa: E402
from bench_model import build_bench_model  # noqa: E402
from peers import report, setup_envs  # noqa: E402
from tritonllm.engine.config import EngineConfig  # noqa: E402
from tritonllm.engine.engine import LLMEngine  # noqa: E402
from tritonllm.engine.request import SamplingParams  # noqa: E402

PEERS_DIR = os.path.join(ROOT, "benchmarks", "peers")


def engine_greedy(engine: LLMEngine, batch: list[list[int]], new: int) -> list[list[int]]:
    ids: dict[str, list[int]] = {f"g{i}": [] for i in range(len(batch))}
    for i, p in enumerate(batch):
        engine.add_request(f"g{i}", p, SamplingParams(max_tokens=new, end_id=-1))
    while engine.has_work():
        for o in engine.step():
            ids[o.request_id].extend(o.new_token_ids)
    return list(ids.values())


def best(args, measure) -> float:
    """The best of --repeat measurements (the least disturbed by other work on a shared machine)."""
    return max(measure() for _ in range(args.repeat))


def measure_ours(model_dir: str, work: list[list[int]], args) -> dict:
    engine = LLMEngine(model_dir, EngineConfig(max_kv_tokens=args.batch * (args.prompt_len + args.new) + 256,
                                               max_num_tokens=args.max_num_tokens, max_num_seqs=args.batch, dtype="float32"))
    row = {"status": "ok", "ids": engine_greedy(engine, work[:args.check_prompts], args.check_n)}
    log("ours: batch-1 decode")
    row["b1_decode"] = best(args, lambda: decode_rate(lambda b, n: engine_run(engine, b, n), work[:1], args.new,
                                                      repeat=1))  # best of pairs, as the peer runners do
    log(f"ours: batch {args.batch}")
    row[f"e2e_b{args.batch}"] = best(args, lambda: rate(engine_run(engine, work[:args.batch], args.new)))
    return row


def measure_hf(model_dir: str, work: list[list[int]], args) -> dict:
    import transformers as tf

    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor(work[:args.check_prompts])
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.check_n,
                          min_new_tokens=args.check_n, do_sample=False, pad_token_id=0)
    row = {"status": "ok", "ids": out[:, ids.shape[1]:].tolist()}
    log("HF: batch-1 decode")
    row["b1_decode"] = best(args, lambda: decode_rate(lambda b, n: hf_run(hf, b, n), work[:1], args.new, repeat=1))
    log(f"HF: batch {args.batch}")
    row[f"e2e_b{args.batch}"] = best(args, lambda: rate(hf_run(hf, work[:args.batch], args.new)))
    return row


def wait_quiet(max_s: float, below: float = 1.0) -> None:
    """Wait (at most max_s) for the 1-minute load average to drop below `below`: on a shared 2-core machine,
    spin-waiting thread pools (ggml, OpenMP) lose several-fold when other work holds the cores."""
    t = time.time()
    while max_s > 0 and os.getloadavg()[0] >= below and time.time() - t < max_s:
        log(f"waiting for a quiet machine: load {os.getloadavg()[0]:.1f} (< {below} wanted, "
            f"{max_s - (time.time() - t):.0f} s left)")
        time.sleep(15)


def failure_reason(text: str) -> str:
    """The most telling line of a failed run: the last exception / error line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"(Error|Exception|error:|Illegal instruction|not supported|unsupported)", line):
            return line[:240]
    return lines[-1][:240] if lines else "no output"


def setup_peer(name: str, setup) -> tuple | dict:
    """(python, extra spec) of a ready peer, or its failure row."""
    try:
        return setup()
    except Exception as e:  # noqa: BLE001 - reported in the table
        log(f"{name}: setup failed: {e}")
        return {"status": "failed", "reason": f"setup: {failure_reason(str(e))}"}


def run_peer(name: str, ready: tuple | dict, runner: str, spec: dict, env_fn=None, timeout: int = 1800) -> dict:
    """Run a ready peer's runner with the spec on stdin; a failure becomes a row, never an exception."""
    if isinstance(ready, dict):
        return ready
    py, extra = ready
    spec = dict(spec, **extra)
    log(f"{name}: running {os.path.basename(runner)} ({spec['threads']} threads)")
    errlog = os.path.join(setup_envs.PEERS, f"{name.split()[0].lower()}-run.log")
    try:
        p = subprocess.run([py, runner], input=json.dumps(spec), capture_output=True, text=True, timeout=timeout,
                           env=env_fn() if env_fn else None)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout} s"}
    with open(errlog, "w") as f:
        f.write(p.stderr + "\n--- stdout ---\n" + p.stdout)
    last = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not last:
        reason = failure_reason(p.stderr + "\n" + p.stdout)
        status = "unavailable" if re.search(r"instruction|AVX|ISA|not supported|unsupported", reason, re.I) \
            else "failed"
        if p.returncode < 0:
            reason = f"killed by signal {-p.returncode}; {reason}"
        log(f"{name}: {status} (exit {p.returncode}): {reason} (log: {os.path.relpath(errlog, ROOT)})")
        return {"status": status, "reason": reason, "exit": p.returncode}
    row = json.loads(last[-1])
    row["status"] = "ok"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default="vllm,llamacpp")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-num-tokens", type=int, default=512,
                    help="per-step token budget of ours and vLLM (chunked prefill); 512 = deployment.yaml's")
    ap.add_argument("--check-n", type=int, default=12, help="leading greedy ids compared with ours")
    ap.add_argument("--check-prompts", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2, help="each figure is the best of this many runs")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--quiet-wait", type=float, default=0.0,
                    help="before each engine, wait up to this many seconds for the load average to drop below 1")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = build_bench_model(os.path.join(ROOT, "build", "models", "bench"))
    peers_model = setup_envs.model_with_tokenizer(model_dir)
    work = prompts(args.batch, args.prompt_len, 32000)
    results = {"threads": args.threads, "prompt_len": args.prompt_len, "new": args.new, "batch": args.batch,
               "check_n": args.check_n, "repeat": args.repeat, "dtype": "float32", "bounds": machine_bounds(),
               "rows": {}, "loadavg_1m_start": os.getloadavg()[0]}
    log(f"machine: {results['bounds']}")
    rows = results["rows"]

    def measured(fn, *a, **kw) -> dict:
        wait_quiet(args.quiet_wait)
        load = os.getloadavg()[0]
        row = fn(*a, **kw)
        row["loadavg_1m"] = [load, os.getloadavg()[0]]  # before, after
        return row

    wanted = args.peers.split(",") if args.peers else []

    def llamacpp_setup():
        py = setup_envs.llamacpp_env()
        return py, {"gguf": setup_envs.gguf_f32(py, peers_model), "batched_bench": setup_envs.BATCHED_BENCH}

    ready = {}  # installs and builds first, measurements after
    if "vllm" in wanted:
        ready["vLLM CPU"] = setup_peer("vLLM CPU", lambda: (setup_envs.vllm_env(), {"model": peers_model}))
    if "llamacpp" in wanted:
        ready["llama.cpp"] = setup_peer("llama.cpp", llamacpp_setup)
    rows["ours"] = measured(measure_ours, model_dir, work, args)
    if not args.skip_hf:
        rows["HF transformers"] = measured(measure_hf, model_dir, work, args)
    spec = {"prompts": work, "new": args.new, "threads": args.threads, "batches": [args.batch],
            "max_num_tokens": args.max_num_tokens,
            "check_prompts": args.check_prompts, "check_n": args.check_n, "dtype": "float32",
            "repeat": args.repeat}
    if "vLLM CPU" in ready:
        rows["vLLM CPU"] = measured(run_peer, "vLLM CPU", ready["vLLM CPU"], os.path.join(PEERS_DIR, "vllm_runner.py"),
                                    spec, env_fn=setup_envs.vllm_runtime_env)
    if "llama.cpp" in ready:
        rows["llama.cpp"] = measured(run_peer, "llama.cpp", ready["llama.cpp"],
                                     os.path.join(PEERS_DIR, "llamacpp_runner.py"), spec,
                                     env_fn=setup_envs.llamacpp_runtime_env)
    for name, row in rows.items():
        if name != "ours" and row.get("status") == "ok":
            row["agreement"] = report.agreement(rows["ours"]["ids"], row.get("ids", []), args.check_n)
    results["loadavg_1m_end"] = os.getloadavg()[0]
    print("\n" + report.table(results, args.batch))
    for path in report.write(results, args.out, args.batch):
        log(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    main()
