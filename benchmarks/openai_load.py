"""One OpenAI streaming load for any ``/v1/completions`` server, and starters for the servers it is compared on.

Used by ``bench_dynamo.py`` to put Dynamo over our engine, our single-node ``make serve`` + ``make openai`` and
``vllm serve`` (vLLM CPU from build/peers) side by side on the same prompts. The load: text prompts made by
decoding seeded random token ids with the served model's tokenizer (every server tokenizes the same text
itself), streamed completions, greedy, ``min_tokens = max_tokens`` and ``ignore_eos`` (vLLM's extras; llama-server
reads the second) so every server generates the same count (the count is checked against ``usage``). Per concurrency level: output tokens/s (wall clock of the level),
TTFT (request sent -> first chunk with text) and ITL (gap between consecutive chunks with text; the servers
here send one chunk per token, ``chunks_per_token`` shows where that is not so) at p50 / p99, measured at the
client.
"""
from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from plotting import pyplot

ROOT = Path(__file__).resolve().parents[1]


def text_prompts(tokenizer_dir: str | Path, n: int, tokens: int, seed: int = 0) -> list[str]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    rng = random.Random(seed)
    vocab = tok.get_vocab_size()
    return [tok.decode([rng.randrange(16, vocab) for _ in range(tokens)]) for _ in range(n)]


def percentile(xs: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q% of the values at or below it."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def stream_one(port: int, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status} from :{port}: {resp.read()[:300]!r}")
    stamps, usage = [], None
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("error"):
            raise RuntimeError(f"server on :{port} failed mid-stream: {chunk['error']}")
        if chunk.get("usage"):
            usage = chunk["usage"]
        if any(c.get("text") for c in chunk.get("choices") or []):
            stamps.append(time.perf_counter())
    conn.close()
    if usage is None or not stamps:
        raise RuntimeError(f"server on :{port} sent no usage or no text")
    return {"ttft": stamps[0] - t0, "gaps": [b - a for a, b in zip(stamps, stamps[1:])], "chunks": len(stamps),
            "tokens": usage["completion_tokens"], "prompt_tokens": usage["prompt_tokens"],
            "sent": t0, "stamps": stamps}


def run_level(port: int, model: str, prompts: list[str], max_tokens: int, concurrency: int) -> dict:
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda p: stream_one(port, model, p, max_tokens), prompts))
    wall = time.perf_counter() - t0
    gaps = [g for r in results for g in r["gaps"]]
    short = [r["tokens"] for r in results if r["tokens"] != max_tokens]
    if short:
        print(f"  warning: {len(short)} requests generated {sorted(set(short))} tokens, not {max_tokens}",
              file=sys.stderr)
    return {"concurrency": concurrency, "requests": len(results),
            "output_tok_s": sum(r["tokens"] for r in results) / wall,
            "ttft_p50_ms": 1e3 * percentile([r["ttft"] for r in results], 50),
            "ttft_p99_ms": 1e3 * percentile([r["ttft"] for r in results], 99),
            "itl_p50_ms": 1e3 * percentile(gaps, 50), "itl_p99_ms": 1e3 * percentile(gaps, 99),
            "chunks_per_token": sum(r["chunks"] for r in results) / sum(r["tokens"] for r in results),
            "prompt_tokens_mean": sum(r["prompt_tokens"] for r in results) / len(results)}


def wait_models(port: int, timeout: float, proc: subprocess.Popen | None = None, what: str = "server") -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                if json.loads(r.read()).get("data"):
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{what} on :{port} not serving /v1/models after {timeout:.0f} s")


def stop_group(proc: subprocess.Popen, grace: float = 60) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_openai_front(model: str, triton_grpc_url: str, log_path: Path):
    """Our OpenAI server (what `make openai` runs) on a free loopback port in front of a running tritonserver's
    gRPC endpoint, serving ``model``. Returns (port, stop)."""
    from tritonllm.serving.launcher import find_free_ports

    (port,) = find_free_ports(1)
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "clients.openai_server", "--host", "127.0.0.1", "--port", str(port),
                             "--triton-url", triton_grpc_url, "--served-model-name", model,
                             "--log-level", "warning"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def stop() -> None:
        stop_group(proc, 20)
        log.close()

    try:
        wait_models(port, 120, proc, f"openai_server (log {log_path})")
    except Exception:
        stop()
        raise
    return port, stop


def start_ours(model: str, log_dir: Path):
    """tritonserver over the rendered repositories (what `make serve` runs) + our OpenAI server in front of it.
    Returns (port, stop)."""
    from tritonllm.serving.launcher import TritonServer, find_free_ports

    http_port, grpc_port, metrics_port = find_free_ports(3)
    server = TritonServer(http_port, grpc_port, metrics_port, log_path=log_dir / "tritonserver.log").start(timeout=300)
    try:
        port, stop_front = start_openai_front(model, f"127.0.0.1:{grpc_port}", log_dir / "openai_server.log")
    except Exception:
        server.stop()
        raise

    def stop() -> None:
        stop_front()
        server.stop()

    return port, stop


def start_vllm(model: str, model_dir: Path, threads: int, log_dir: Path, max_num_seqs: int):
    """`vllm serve` from build/peers/vllm (`make bench-peers` builds it), loopback, fp32, 2 GB of KV."""
    from peers import setup_envs

    py = Path(setup_envs.VLLM_VENV) / "bin" / "python"
    if not py.exists():
        raise RuntimeError(f"{py} missing: `make bench-peers` builds vLLM CPU")
    from tritonllm.serving.discovery import find_free_ports

    (port,) = find_free_ports(1)
    env = dict(setup_envs.vllm_runtime_env(), VLLM_CPU_KVCACHE_SPACE="2",
               VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}")
    log = open(log_dir / "vllm.log", "w")
    proc = subprocess.Popen([str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                             "--served-model-name", model, "--host", "127.0.0.1", "--port", str(port),
                             "--dtype", "float32", "--max-num-seqs", str(max_num_seqs), "--seed", "0"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def stop() -> None:
        stop_group(proc, 30)
        log.close()

    try:
        wait_models(port, 600, proc, f"vllm serve (log {log_dir / 'vllm.log'})")
    except Exception:
        stop()
        raise
    return port, stop


def plot_levels(rows: list[dict], path: Path) -> None:
    """Output tokens/s, TTFT p50 and ITL p50 against concurrency, one line per server."""
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for server in dict.fromkeys(r["server"] for r in rows):
        mine = [r for r in rows if r["server"] == server]
        for ax, key in zip(axes, ("output_tok_s", "ttft_p50_ms", "itl_p50_ms")):
            ax.plot([r["concurrency"] for r in mine], [r[key] for r in mine], marker="o", label=server)
    for ax, title in zip(axes, ("output tokens/s", "TTFT p50 (ms)", "ITL p50 (ms)")):
        ax.set_title(title)
        ax.set_xlabel("concurrency")
        ax.set_xscale("log", base=2)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
