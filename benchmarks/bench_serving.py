"""The OpenAI serving path against the servers a user would pick instead, side by side in one invocation.

    make bench-serving                  # SERVING_ARGS="--levels 1,4 --servers ours,llama-server"

Every server serves the default model (SmolLM2-135M-Instruct) under the OpenAI name "tritonllm", one after the
other on free loopback ports, and gets the same load (benchmarks/openai_load.py): streamed ``/v1/completions``,
greedy, ``--max-tokens`` generated (``min_tokens`` = ``max_tokens`` and ``ignore_eos``: every server generates the
full count, checked against ``usage``), ``--requests`` requests per concurrency level in ``--levels``. Prompts:
real English prose (the Python language reference of build_scripts/demo_corpus.py) cut to ``--prompt-tokens``
tokens of the model's tokenizer, sent as text: each server tokenizes them itself.

- ours: tritonserver over the rendered repository (what ``make serve`` runs) + the OpenAI server (``make openai``):
  OpenAI -> ``tensorrt_llm_bls`` -> ``tensorrt_llm`` (our engine on the Q4_1 GGUF, deployment.yaml's knobs).
- llama-server: llama.cpp's server from the vendored build (compiled with ``-DLLAMA_BUILD_SERVER=ON`` on first use)
  on the same GGUF, started per level with ``-np`` = concurrency (continuous batching), 2 threads.
- vllm: ``vllm serve`` (vLLM CPU 0.32, build/peers; ``make bench-peers`` builds it) on the same weights dequantized
  to fp32 safetensors (vLLM's GGUF kernels are CUDA-only).
- dynamo: Dynamo's Rust frontend over our engine as Dynamo workers (``make serve-dynamo``), ``--dynamo-replicas``
  workers sharing the cores.

Also measured: our engine in this process on the same file and knobs, built and stepped on one runner thread as the
``tensorrt_llm`` model runs it, one request at a time, before the servers and after them (the machine's speed drifts;
their mean is the reference): its ITL p50 is what a served token at concurrency 1 is compared with (target: within
1.2x). Per server and level: output tokens/s, TTFT and ITL p50 / p99 at the client,
ratios against ours; for ours, the CPU milliseconds each serving process spends per generated token (from /proc:
on 2 cores that time is taken from the engine's two threads). A server that cannot start here is reported and
skipped. Results:
build/bench/serving/{results.json,serving.png}.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build_scripts"))
import openai_load  # noqa: E402  (benchmarks/ is this script's folder)
from bench_engine import log  # noqa: E402
from peers import setup_envs  # noqa: E402

NAME = "tritonllm"
SERVERS = ("ours", "llama-server", "vllm", "dynamo")


def model_path() -> Path:
    dep = yaml.safe_load((ROOT / "deployment.yaml").read_text())
    return ROOT / dep["llm"]["gpt_model_path"]


def prose_prompts(tok, n: int, tokens: int) -> list[str]:
    """n passages of real prose, each cut to `tokens` tokens and decoded back to text."""
    from demo_corpus import load_corpus

    ids = tok.encode(load_corpus(400_000), add_special_tokens=False)
    stride = max(tokens, (len(ids) - tokens) // max(1, n))
    out = [tok.decode(ids[i * stride:i * stride + tokens]) for i in range(n)]
    if len(out[-1]) < tokens:
        raise RuntimeError("the prose corpus is too short for the prompts asked")
    return out


# ---- the engine in process -----------------------------------------------------------------------------------
def engine_itl(gguf: Path, prompts: list[str], tok, max_tokens: int) -> float:
    """ITL p50 (ms) of our engine on deployment.yaml's knobs, on its runner thread, one request at a time."""
    from tritonllm.engine.config import engine_config_from_parameters
    from tritonllm.engine.engine import LLMEngine
    from tritonllm.engine.request import SamplingParams
    from tritonllm.engine.runner import EngineRunner

    params = yaml.safe_load((ROOT / "deployment.yaml").read_text())["models"]["tensorrt_llm"]["parameters"]
    config, _ = engine_config_from_parameters({k: str(v) for k, v in params.items() if not isinstance(v, dict)})
    outputs: queue.SimpleQueue = queue.SimpleQueue()
    runner = EngineRunner.launch(lambda: LLMEngine(str(gguf), config), outputs.put)
    gaps = []
    try:
        for i, prompt in enumerate(prompts):
            runner.submit(f"r{i}", tok.encode(prompt), SamplingParams(max_tokens=max_tokens, end_id=-1))
            stamps = []
            while True:
                out = outputs.get()
                stamps.append(time.perf_counter())
                if out.finished:
                    break
            gaps += [b - a for a, b in zip(stamps[1:], stamps[2:])]  # after the first token, as at the client
    finally:
        runner.shutdown(10)
    return 1e3 * statistics.median(gaps)


# ---- where a token's CPU goes ---------------------------------------------------------------------------------
PROCESSES = (("tensorrt_llm_bls/1/model.py", "BLS stub"), ("tensorrt_llm/1/model.py", "tensorrt_llm stub"),
             ("bin/tritonserver", "tritonserver"), ("clients.openai_server", "OpenAI server"))


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of our serving processes (by role) and of this client process."""
    out = {"client": sum(os.times()[:2])}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = next((name for key, name in PROCESSES if key in cmd), None)
        if role:
            out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


# ---- servers --------------------------------------------------------------------------------------------------
def start_llama_server(gguf: Path, concurrency: int, max_tokens: int, prompt_tokens: int, log_dir: Path):
    server = setup_envs.llamacpp_tool("llama-server")
    from tritonllm.serving.discovery import find_free_ports

    (port,) = find_free_ports(1)
    ctx = concurrency * (prompt_tokens + max_tokens + 64)  # -np splits -c: every slot holds its whole request
    logf = open(log_dir / f"llama-server-c{concurrency}.log", "w")
    proc = subprocess.Popen([server, "-m", str(gguf), "--alias", NAME, "--host", "127.0.0.1", "--port", str(port),
                             "-np", str(concurrency), "-c", str(ctx), "-t", "2", "-tb", "2", "-cb"],
                            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, LD_LIBRARY_PATH=setup_envs.LLAMACPP_LIB))

    def stop() -> None:
        openai_load.stop_group(proc, 20)
        logf.close()

    try:
        openai_load.wait_models(port, 120, proc, f"llama-server (log {logf.name})")
    except Exception:
        stop()
        raise
    return port, stop


def fp32_folder(gguf: Path) -> Path:
    """The GGUF's weights dequantized by transformers into an fp32 safetensors folder (cached), for vLLM."""
    out = ROOT / "build" / "peers" / f"{gguf.stem}-fp32"
    if (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM

    from tritonllm.model_files import load_hf_tokenizer

    log(f"dequantizing {gguf.name} to fp32 safetensors for vLLM -> {out}")
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    config.quantization_config = None  # the GGUF's, which save_pretrained refuses to write: the weights are floats
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    load_hf_tokenizer(gguf).save_pretrained(out)
    return out


def start_dynamo(replicas: int):
    import bench_dynamo

    proc, port = bench_dynamo.start("kv", replicas, max(1, (os.cpu_count() or 2) // replicas),
                                    ROOT / "deployment.yaml", served_name=NAME)
    return port, lambda: bench_dynamo.stop(proc)


def run_server(name: str, args, prompts: list[str], gguf: Path, log_dir: Path) -> list[dict]:
    """Every level of one server; a server started per level where its slots are the concurrency."""
    rows, started = [], None
    try:
        for i, c in enumerate(args.levels):
            if name == "llama-server":
                if started:
                    started[1]()
                started = start_llama_server(gguf, c, args.max_tokens, args.prompt_tokens, log_dir)
            elif started is None:
                started = {"ours": lambda: openai_load.start_ours(NAME, log_dir),
                           "vllm": lambda: openai_load.start_vllm(NAME, fp32_folder(gguf), 2, log_dir,
                                                                  max(args.levels)),
                           "dynamo": lambda: start_dynamo(args.dynamo_replicas)}[name]()
            port = started[0]
            openai_load.stream_one(port, NAME, prompts[0], 4)  # warm-up outside the measurement
            chunk = prompts[i * args.requests:(i + 1) * args.requests]
            before = cpu_seconds()
            row = {"server": name, **openai_load.run_level(port, NAME, chunk, args.max_tokens, c)}
            if name == "ours":  # CPU ms per generated token, by process
                after, tokens = cpu_seconds(), len(chunk) * args.max_tokens
                row["cpu_ms_per_token"] = {k: round(1e3 * (v - before.get(k, 0.0)) / tokens, 3) for k, v in after.items()}
            log(f"  {name} c={c}: {row['output_tok_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_ms']:.0f} ms, "
                f"ITL p50 {row['itl_p50_ms']:.1f} ms")
            rows.append(row)
    finally:
        if started:
            started[1]()
    return rows


def table(rows: list[dict], engine_ms: float | None) -> str:
    base = {r["concurrency"]: r for r in rows if r["server"] == "ours" and "error" not in r}
    lines = ["| server | concurrency | tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | ours / it (tok/s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['server']} | not run: {r['error'][:120]} |||||||")
            continue
        b = base.get(r["concurrency"])
        ratio = f"{b['output_tok_s'] / r['output_tok_s']:.2f}x" if b and r["server"] != "ours" else "-"
        lines.append(f"| {r['server']} | {r['concurrency']} | {r['output_tok_s']:.1f} | {r['ttft_p50_ms']:.0f} ms | "
                     f"{r['ttft_p99_ms']:.0f} ms | {r['itl_p50_ms']:.1f} ms | {r['itl_p99_ms']:.1f} ms | {ratio} |")
    for r in rows:
        if r.get("cpu_ms_per_token"):
            lines.append(f"\nours c={r['concurrency']}: CPU ms per generated token: " + ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(r["cpu_ms_per_token"].items(), key=lambda kv: -kv[1])))
    if engine_ms and 1 in base:
        lines.append(f"\nengine in process (runner thread, one request; mean of the runs before and after): ITL p50 "
                     f"{engine_ms:.2f} ms; ours served at "
                     f"c=1: {base[1]['itl_p50_ms']:.2f} ms = {base[1]['itl_p50_ms'] / engine_ms:.2f}x (target <= 1.2x)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", default=",".join(SERVERS), help=f"in order, from {', '.join(SERVERS)}")
    ap.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 32])
    ap.add_argument("--requests", type=int, default=32, help="requests per level (at least the concurrency)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dynamo-replicas", type=int, default=1, help="Dynamo workers (the cores are shared)")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "serving"))
    ap.add_argument("--engine-only", action="store_true",
                    help="only the in-process engine's ITL p50, as one JSON line (tests compare it with Triton's)")
    args = ap.parse_args(argv)
    from tritonllm.model_files import load_hf_tokenizer

    gguf = model_path()
    tok = load_hf_tokenizer(gguf)
    if args.engine_only:
        itl = engine_itl(gguf, prose_prompts(tok, 3, args.prompt_tokens), tok, args.max_tokens)
        print(json.dumps({"engine_itl_p50_ms": itl}))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = prose_prompts(tok, args.requests * len(args.levels), args.prompt_tokens)
    log(f"{len(prompts)} prose prompts of {args.prompt_tokens} tokens, {args.max_tokens} generated, levels {args.levels}")
    engine_ms = engine_itl(gguf, prompts[:3], tok, args.max_tokens)
    log(f"engine in process: ITL p50 {engine_ms:.2f} ms")
    rows = []
    for name in args.servers.split(","):
        log(f"{name}: starting")
        try:
            rows += run_server(name, args, prompts, gguf, out)
        except Exception as e:  # a peer that cannot run here is reported, not fatal
            log(f"{name}: not run: {e}")
            rows.append({"server": name, "error": str(e).splitlines()[0] if str(e) else type(e).__name__})
    if "ours" in args.servers.split(","):  # the machine's speed drifts: the reference is taken on both sides
        engine_end = engine_itl(gguf, prompts[:3], tok, args.max_tokens)
        log(f"engine in process, again: ITL p50 {engine_end:.2f} ms")
        engine_ms = (engine_ms + engine_end) / 2
    text = table(rows, engine_ms)
    print(f"\n{args.requests} streamed requests per level, {args.prompt_tokens}-token prose prompts, "
          f"{args.max_tokens} generated, greedy\n{text}")
    (out / "results.json").write_text(json.dumps({"args": vars(args), "engine_itl_p50_ms": engine_ms, "rows": rows},
                                                 indent=2))
    openai_load.plot_levels([r for r in rows if "error" not in r], out / "serving.png")
    print(f"results: {out / 'results.json'}, plot: {out / 'serving.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
