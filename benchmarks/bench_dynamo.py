"""Dynamo over our engine: KV-aware routing vs round robin, and 1 vs 2 workers, in one invocation.

    make bench-dynamo            # or: python benchmarks/bench_dynamo.py [--prefixes 16 --questions 12]

Workload (prefix-heavy, as issue 16 asks): ``--prefixes`` long shared "system prompts" (random token ids,
``--prefix-tokens`` each), ``--questions`` different short questions per prefix, shuffled, sent at
``--concurrency`` through Dynamo's frontend (/v1/completions with token-id prompts, greedy). Each worker's
KV cache is capped (``--kv-tokens``) so that round robin, which spreads every prefix over both workers,
has to evict what KV routing keeps. Per run: the prefix-cache hit rate our engines measured (prompt
tokens served from cache / prompt tokens, from ``usage.prompt_tokens_details.cached_tokens``), the
router's predicted hit (``nvext.timing.kv_hit_rate``, KV mode only), TTFT p50 / p95 (the frontend's
``ttft_ms``), output tokens/s (wall clock). Runs:
kv x 2 workers, round-robin x 2 workers, kv x 1 worker (both threads), and disaggregated: 1 prefill + 1
decode worker (KV through NIXL; the hit rate is then the prefill worker's); ratios printed against kv x 2.

Then the servers side by side (``--servers``, phase ``servers``): the same OpenAI streaming load
(``benchmarks/openai_load.py``: same text prompts, ``--load-max-tokens`` generated, concurrency ``--levels``)
against Dynamo (KV router, 2 workers, one thread each), our single-node ``make serve`` + ``make openai`` and
``vllm serve`` (vLLM CPU from build/peers; ``make bench-peers`` builds it), each on the demo model, one after
the other in this invocation: output tokens/s, TTFT and ITL p50 / p99, ratios against Dynamo.
Progress goes to stderr; results to build/bench/dynamo/{results.json,dynamo.png,servers.png}.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
from tritonllm.serving.discovery import find_free_ports  # noqa: E402

import openai_load  # noqa: E402  (benchmarks/ is this script's folder)
from plotting import pyplot  # noqa: E402


def start(router: str, replicas: int, threads: int, deployment: Path, prefill: int = 0,
          served_name: str | None = None) -> tuple[subprocess.Popen, int]:
    (port,) = find_free_ports(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tritonllm.dynamo.launch", "--replicas", str(replicas), "--port", str(port),
         "--router", router, "--threads", str(threads), "--deployment", str(deployment),
         "--prefill-workers", str(prefill), *(["--served-model-name", served_name] if served_name else [])],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "backends")}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    for line in proc.stdout:
        if "dynamo READY" in line:
            return proc, port
    raise RuntimeError(f"dynamo launch ({router}, {replicas}) did not get READY")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def request(port: int, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "nvext": {"extra_fields": ["timing", "worker_id"]}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.loads(r.read())
    t, usage = out["nvext"]["timing"], out["usage"]
    return {"ttft_ms": t["ttft_ms"], "router_hit": t.get("kv_hit_rate") or 0.0, "tokens": usage["completion_tokens"],
            "prompt": usage["prompt_tokens"], "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            "worker": out["nvext"]["worker_id"].get("decode_worker_id")}


def workload(args) -> list[list[int]]:
    rng = random.Random(args.seed)
    prefixes = [[rng.randrange(10, 900) for _ in range(args.prefix_tokens)] for _ in range(args.prefixes)]
    prompts = [p + [rng.randrange(10, 900) for _ in range(8)] for p in prefixes for _ in range(args.questions)]
    rng.shuffle(prompts)
    return prompts


def run(name: str, port: int, prompts: list[list[int]], args) -> dict:
    t0 = time.perf_counter()
    results = []
    with cf.ThreadPoolExecutor(args.concurrency) as pool:
        futures = [pool.submit(request, port, p, args.max_tokens) for p in prompts]
        for i, f in enumerate(cf.as_completed(futures), 1):
            results.append(f.result())
            if i % 32 == 0 or i == len(futures):
                print(f"  {name}: {i}/{len(futures)} requests", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    ttft = sorted(r["ttft_ms"] for r in results)
    return {"run": name, "requests": len(results),
            "hit_rate": sum(r["cached"] for r in results) / sum(r["prompt"] for r in results),
            "router_predicted_hit": sum(r["router_hit"] for r in results) / len(results),
            "ttft_p50_ms": ttft[len(ttft) // 2], "ttft_p95_ms": ttft[int(len(ttft) * 0.95) - 1],
            "output_tok_s": sum(r["tokens"] for r in results) / wall, "seconds": wall,
            "workers_used": len({r["worker"] for r in results})}


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    names = [r["run"] for r in rows]
    for ax, key, label in zip(axes, ("hit_rate", "ttft_p50_ms", "output_tok_s"),
                              ("prefix hit rate", "TTFT p50 (ms)", "output tokens/s")):
        ax.bar(names, [r[key] for r in rows])
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def routing_phase(args, out: Path) -> list[dict]:
    dep = yaml.safe_load((ROOT / "deployment.yaml").read_text())
    dep["models"]["tensorrt_llm"]["parameters"]["max_tokens_in_paged_kv_cache"] = args.kv_tokens
    dep["llm"]["gpt_model_path"] = str(ROOT / dep["llm"]["gpt_model_path"])
    deployment = Path(tempfile.mkdtemp()) / "deployment.yaml"
    deployment.write_text(yaml.safe_dump(dep))
    prompts = workload(args)
    cores = os.cpu_count() or 2
    rows = []
    runs = (("kv x2", "kv", 2, 0), ("round-robin x2", "round-robin", 2, 0), ("kv x1", "kv", 1, 0),
            ("disagg 1P+1D", "kv", 1, 1))
    for name, router, replicas, prefill in runs:
        print(f"{name}: starting", file=sys.stderr, flush=True)
        proc, port = start(router, replicas, max(1, cores // (replicas + prefill)), deployment, prefill)
        try:
            request(port, prompts[0][:20], 2)  # warm-up outside the measurement
            rows.append(run(name, port, prompts, args))
        finally:
            stop(proc)
    base = rows[0]
    print(f"\n{len(prompts)} requests: {args.prefixes} prefixes x {args.prefix_tokens} tokens, {args.questions} "
          f"questions each, concurrency {args.concurrency}, {args.max_tokens} output tokens, KV {args.kv_tokens} "
          "tokens per worker")
    print(f"{'run':<16}{'hit rate':>9}{'router':>8}{'TTFT p50':>10}{'TTFT p95':>10}{'tok/s':>8}"
          "  ratios vs kv x2 (hit rate, TTFT p50, TTFT p95, tok/s)")
    for r in rows:
        print(f"{r['run']:<16}{r['hit_rate']:>9.3f}{r['router_predicted_hit']:>8.3f}{r['ttft_p50_ms']:>8.1f}ms"
              f"{r['ttft_p95_ms']:>8.1f}ms{r['output_tok_s']:>8.1f}  {r['hit_rate'] / base['hit_rate']:.2f}x, "
              f"{r['ttft_p50_ms'] / base['ttft_p50_ms']:.2f}x, {r['ttft_p95_ms'] / base['ttft_p95_ms']:.2f}x, "
              f"{r['output_tok_s'] / base['output_tok_s']:.2f}x")
    plot(rows, out / "dynamo.png")
    return rows


def start_server(name: str, args, log_dir: Path):
    """(port, stop) of one compared server, on the demo model under the OpenAI name "demo"."""
    if name == "dynamo":
        proc, port = start("kv", 2, max(1, (os.cpu_count() or 2) // 2), ROOT / "deployment.yaml")
        return port, lambda: stop(proc)
    if name == "ours":
        return openai_load.start_ours("demo", log_dir)
    if name == "vllm":
        return openai_load.start_vllm("demo", ROOT / "build" / "models" / "demo", os.cpu_count() or 2, log_dir,
                                      max_num_seqs=max(args.levels))
    raise SystemExit(f"unknown server {name!r} (dynamo, ours, vllm)")


def servers_phase(args, out: Path) -> list[dict]:
    dep = yaml.safe_load((ROOT / "deployment.yaml").read_text())
    prompts = openai_load.text_prompts(ROOT / dep["llm"]["tokenizer_dir"], args.load_requests * len(args.levels),
                                       args.load_prompt_tokens, args.seed)
    rows = []
    for name in args.servers.split(","):
        print(f"{name}: starting", file=sys.stderr, flush=True)
        try:
            port, stop_fn = start_server(name, args, out)
        except Exception as e:  # a peer that cannot run here is reported, not fatal
            print(f"{name}: cannot start: {e}", file=sys.stderr)
            rows.append({"server": name, "error": str(e)})
            continue
        try:
            openai_load.stream_one(port, "demo", prompts[0], 4)  # warm-up outside the measurement
            for i, c in enumerate(args.levels):
                chunk = prompts[i * args.load_requests:(i + 1) * args.load_requests]
                row = {"server": name, **openai_load.run_level(port, "demo", chunk, args.load_max_tokens, c)}
                print(f"  {name} c={c}: {row['output_tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
                rows.append(row)
        finally:
            stop_fn()
    print(f"\n{args.load_requests} streamed requests per level, ~{args.load_prompt_tokens}-token text prompts, "
          f"{args.load_max_tokens} generated, greedy; ratios against dynamo at the same concurrency")
    print(f"{'server':<8}{'conc':>5}{'tok/s':>8}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}"
          f"{'chunk/tok':>10}  tok/s ratio")
    base = {r["concurrency"]: r for r in rows if r["server"] == "dynamo" and "error" not in r}
    for r in rows:
        if "error" in r:
            print(f"{r['server']:<8} not run: {r['error'][:100]}")
            continue
        b = base.get(r["concurrency"])
        ratio = f"{r['output_tok_s'] / b['output_tok_s']:.2f}x" if b else "-"
        print(f"{r['server']:<8}{r['concurrency']:>5}{r['output_tok_s']:>8.1f}{r['ttft_p50_ms']:>8.1f}ms"
              f"{r['ttft_p99_ms']:>8.1f}ms{r['itl_p50_ms']:>7.1f}ms{r['itl_p99_ms']:>7.1f}ms"
              f"{r['chunks_per_token']:>10.2f}  {ratio}")
    openai_load.plot_levels([r for r in rows if "error" not in r], out / "servers.png")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", default="routing,servers", help="routing, servers, or both (comma-separated)")
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--kv-tokens", type=int, default=6144, help="KV cache per worker (tokens)")
    ap.add_argument("--servers", default="dynamo,ours,vllm", help="servers phase: which servers, in order")
    ap.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
    ap.add_argument("--load-requests", type=int, default=32, help="servers phase: requests per level")
    ap.add_argument("--load-prompt-tokens", type=int, default=128)
    ap.add_argument("--load-max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "dynamo"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    phases = args.phases.split(",")
    results = {"args": vars(args)}
    if "routing" in phases:
        results["runs"] = routing_phase(args, out)
    if "servers" in phases:
        results["servers"] = servers_phase(args, out)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
