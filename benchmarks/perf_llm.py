#!/usr/bin/env python3
"""LLM serving benchmark: perf_analyzer (gRPC streaming) against `ensemble`, `tensorrt_llm_bls` and `tensorrt_llm`,
the same prompts through the OpenAI front (clients/openai_server, /v1/completions streamed), then genai-perf
``profile --backend tensorrtllm`` against `ensemble`; CSV/JSON + a plot under build/perf/.

    python benchmarks/perf_llm.py                       # starts its own tritonserver on free ports
    python benchmarks/perf_llm.py --url localhost:8001  # an already running server (gRPC endpoint)
    python benchmarks/perf_llm.py --gpt-model-path my-hf-folder   # another checkpoint (HF folder or GGUF file)
    python benchmarks/perf_llm.py --concurrency 1,2,4,8 --max-tokens 32 --prompt-tokens 64 --genai-perf skip

What it measures (see perf_report.py): per concurrency, output tokens/s, requests/s, TTFT and inter-token
latency p50/p95/p99. Every request generates exactly ``--max-tokens`` tokens (end_id = -1 disables EOS), so
token counts are exact and the models are compared on the same work. Prompts are about
``--prompt-tokens`` tokens of a fixed text, each request's its own (a numbered head: no prefix-cache hits
between requests, see ``Prompts``); `ensemble`, the BLS and the OpenAI front get the text, `tensorrt_llm` the
ids preprocessing makes of it. The tokenizer is read as the server reads it (``model_files``: a folder or a GGUF
file); genai-perf, which reads folders only, gets a GGUF's converted tokenizer folder from the server's cache.
``--rounds`` interleaves the models (ensemble, tensorrt_llm_bls, tensorrt_llm, openai, ensemble, ...) and each
one's ratio to `tensorrt_llm` is printed: compare models within one invocation, not absolute figures across
machines or runs.

Needs: perf_analyzer from the tritonclient wheel. It links libcudart and libb64 even on CPU: the CUDA
runtime comes from the ``nvidia-cuda-runtime-cu12`` wheel (the ``bench`` extra), libb64 from the system or,
when missing, from Debian's ``libb64-0d`` package downloaded and unpacked under build/perf/lib (no root
needed); both go on LD_LIBRARY_PATH. genai-perf lives in its own virtualenv (``--genai-venv``, made by
``make perf``): its dependencies (pandas 3, numpy 2 by default) must not leak into the serving venv.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]

from tritonllm.model_files import hf_folder, is_gguf

from clients.triton_llm import default_tokenizer_dir
from openai_load import start_openai_front
from perf_report import experiment_metrics, genai_perf_row, perf_analyzer_experiments, plot, ratios, write_summary

TEXT = ("The lighthouse keeper climbed the stairs every evening, counting the steps as his father had taught "
        "him. Outside, the sea rolled grey and patient against the rocks, and the gulls argued over scraps "
        "left by the fishing boats. He lit the lamp, wound the clockwork, and wrote the weather in the log: "
        "wind from the west, rain later, ships passing north. Years went by like this, one light after "
        "another, until the day a letter arrived from the city asking whether he would teach others the "
        "craft. ")


def _missing_libs(exe: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run(["ldd", exe], env=env, capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if "not found" in line]


def unpacked_debian_lib(package: str, dest: Path) -> Path:
    """The library folder of Debian ``package`` unpacked (not installed) under ``dest``: ``apt-get
    download`` + ``dpkg-deb -x``, which need no root once apt's package lists exist (``apt-get update``
    is run when they do not and we are root). Cached: a second call reuses the folder."""
    root = dest / package
    found = sorted(root.glob("usr/lib/*/")) if root.is_dir() else []
    if found:
        return found[0]
    debs = dest / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    def download() -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "download", package], cwd=debs, capture_output=True, text=True)
    got = download()
    if got.returncode != 0 and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True)
        got = download()
    archives = sorted(debs.glob(f"{package}_*.deb"))
    if got.returncode != 0 or not archives:
        raise SystemExit(f"cannot fetch Debian's {package} (apt-get download: {(got.stderr or got.stdout).strip()}); "
                         f"install it: apt-get install -y {package}")
    subprocess.run(["dpkg-deb", "-x", str(archives[-1]), str(root)], check=True)
    return sorted(root.glob("usr/lib/*/"))[0]


def perf_analyzer_env(lib_dir: Path = ROOT / "build" / "perf" / "lib") -> dict[str, str]:
    """Environment in which perf_analyzer starts. It links libcudart (the CUDA runtime wheel, a `bench`
    extra) and libb64 even on CPU: a missing libb64 is fetched from Debian and unpacked under ``lib_dir``,
    so `make perf` needs no manual step. Raises SystemExit with the fix when it still cannot start."""
    exe = shutil.which("perf_analyzer", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                               os.environ.get("PATH", "")]))
    if exe is None:
        raise SystemExit("perf_analyzer not found: pip install 'tritonclient[all]==2.49.0'")
    env = dict(os.environ)
    libs = [p for sp in sys.path for p in glob.glob(os.path.join(sp, "nvidia", "cuda_runtime", "lib"))]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*dict.fromkeys(libs), env.get("LD_LIBRARY_PATH", "")])
    env["PATH"] = os.pathsep.join([str(Path(exe).parent), env.get("PATH", "")])
    if any(lib.startswith("libb64") for lib in _missing_libs(exe, env)):
        b64 = unpacked_debian_lib("libb64-0d", lib_dir)
        print(f"==> libb64 from Debian's libb64-0d, unpacked in {b64}", flush=True)
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(b64), env["LD_LIBRARY_PATH"]])
    missing = _missing_libs(exe, env)
    if missing:
        fixes = {"libcudart": "pip install nvidia-cuda-runtime-cu12 (`make perf` installs it: the bench extra)",
                 "libb64": "apt-get install -y libb64-0d"}
        how = sorted({fix for lib in missing for prefix, fix in fixes.items() if lib.startswith(prefix)})
        raise SystemExit(f"perf_analyzer cannot start, missing {missing}: {'; '.join(how) or 'see ldd'}")
    return env


class Prompts:
    """Distinct prompts for every perf_analyzer run, as both models receive them.

    Each prompt starts with its own number ("Request 17:"), so no two requests of a whole invocation share
    a KV block and the prefix cache never serves one from another (the ensemble's run and then the
    tensorrt_llm run on the same prompts would otherwise compare a cold prefill with a cached one). The
    token ids sent to `tensorrt_llm` are the ids preprocessing makes of the text sent to `ensemble`
    (specials included), so both models do the same work."""

    def __init__(self, tokenizer_dir: Path, prompt_tokens: int, max_tokens: int, out_dir: Path):
        from tritonllm.model_files import load_hf_tokenizer  # what the server reads: a folder or a GGUF file

        self.tok = load_hf_tokenizer(tokenizer_dir)
        self.base = self.tok(TEXT * 8, add_special_tokens=False).input_ids
        self.prompt_tokens, self.max_tokens, self.out_dir = prompt_tokens, max_tokens, out_dir
        self.used = 0
        out_dir.mkdir(parents=True, exist_ok=True)

    def _text(self, i: int) -> str:
        head = self.tok(f"Request {i}:", add_special_tokens=False).input_ids
        offset = (7 * i) % max(1, len(self.base) - self.prompt_tokens)
        return self.tok.decode(head + self.base[offset:offset + max(1, self.prompt_tokens - len(head))])

    def take(self, n: int) -> list[str]:
        """``n`` prompts never used before in this invocation."""
        texts = [self._text(self.used + i) for i in range(n)]
        self.used += n
        return texts

    def file(self, model: str, name: str, n: int) -> Path:
        """A --input-data file of ``n`` prompts never used before in this invocation: text for the models that
        take NVIDIA's text inputs (``ensemble``, ``tensorrt_llm_bls``), token ids for ``tensorrt_llm``."""
        texts = self.take(n)
        if model in TEXT_MODELS:
            data = [{"text_input": [t], "max_tokens": [self.max_tokens], "stream": [True], "end_id": [-1]}
                    for t in texts]
        else:
            ids = [self.tok(t).input_ids for t in texts]
            data = [{"input_ids": {"content": i, "shape": [len(i)]}, "input_lengths": [len(i)],
                     "request_output_len": [self.max_tokens], "streaming": [True], "end_id": [-1]} for i in ids]
        path = self.out_dir / f"input_{name}.json"
        path.write_text(json.dumps({"data": data}))
        return path


ATTEMPTS = 3
TEXT_MODELS = ("ensemble", "tensorrt_llm_bls")
OPENAI = "openai"  # the OpenAI front (clients/openai_server over the same server's gRPC port), /v1/completions


def _perf_analyzer_once(env, url: str, model: str, inputs: Callable[[], Path], c: int, n: int, export: Path,
                        log: Path, timeout_s: int) -> list[dict] | None:
    """One perf_analyzer run (one model, one level, ``n`` requests) -> its export's experiments, or None
    (said, with the log's path). perf_analyzer 2.49 sometimes leaves an empty export after a full run, or stops writing one
    part way (both seen, exit code 0): such a run is made again, up to ATTEMPTS times; the last attempt's
    export cut short gives its complete requests' latencies (not a throughput: perf_report). Each attempt
    gets fresh prompts from ``inputs()``: a failed run did generate, and its prompts are in the prefix cache."""
    cmd = ["perf_analyzer", "-m", model, "-u", url, "-i", "grpc", "--async", "--streaming",
           "--concurrency-range", f"{c}:{c}",
           # A fixed number of requests, no stabilization windows: LLM requests on a shared CPU vary
           # too much window to window for perf_analyzer's stability check to converge (seen).
           "--request-count", str(n),
           # No -f: with it, perf_analyzer 2.49 leaves the profile export empty (seen).
           "--profile-export-file", str(export)]
    for attempt in range(1, ATTEMPTS + 1):
        last = attempt == ATTEMPTS
        export.unlink(missing_ok=True)  # perf_analyzer refuses an export path that exists
        proc = subprocess.run(cmd + ["--input-data", str(inputs())], env=env, capture_output=True, text=True, timeout=timeout_s)
        log.write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"perf_analyzer failed ({proc.returncode}), log {log}:\n"
                               f"{(proc.stdout + proc.stderr)[-3000:]}")
        try:
            experiments = perf_analyzer_experiments(export)
            kept = len(experiments[0].get("requests", [])) if experiments else 0
            if not last and experiments and experiments[0].get("truncated"):
                raise ValueError(f"cut short after {kept} complete requests")
            if kept < c:
                raise ValueError(f"{kept} complete requests in it")
            if experiments[0].get("truncated"):
                print(f"    export {export} cut short again: its {kept} complete requests count for the "
                      "latencies, not the throughput", flush=True)
            return experiments
        except (OSError, ValueError, KeyError, IndexError) as e:
            print(f"    export {export} unreadable ({type(e).__name__}: {e}); "
                  f"{'giving this round up, log ' + str(log) if last else 'running again'}", flush=True)
    return None


def run_perf_analyzer(env, url: str, models: list[str], prompts: Prompts, concurrency: list[int],
                      requests: int, rounds: int, out_dir: Path, timeout_s: int,
                      openai: tuple[int, str] | None = None) -> list[dict]:
    """Per level, ``rounds`` rounds of every model in turn (ensemble, tensorrt_llm_bls, tensorrt_llm, openai,
    ensemble, ...), each round its own perf_analyzer run and export (small exports are cut short less often), or
    for ``openai`` the same prompts streamed through the front at ``openai`` (port, model name); a model's rounds
    merge into one row. Interleaving puts the models side by side in time, so drift of a shared machine falls
    on all."""
    rows = []
    for c in concurrency:
        experiments: dict[str, list[dict]] = {m: [] for m in models}
        for i in range(rounds):
            for model in models:
                print(f"==> perf_analyzer {model} concurrency {c} round {i + 1}/{rounds}", flush=True)
                name = f"{model}_c{c}" + (f"_r{i + 1}" if rounds > 1 else "")
                n = max(requests, 2 * c)
                t0 = time.monotonic()
                if model == OPENAI:
                    got = openai_experiment(openai, prompts.take(n), prompts.max_tokens, c)
                else:
                    got = _perf_analyzer_once(env, url, model, lambda: prompts.file(model, name, n), c, n,
                                              out_dir / f"pa_{name}.json", out_dir / f"pa_{name}.log", timeout_s)
                if got is None:  # the other rounds still measure this level
                    continue
                experiments[model] += got
                r = experiment_metrics(got, prompts.max_tokens)
                print(f"    {r['requests']} requests in {time.monotonic() - t0:.0f} s: "
                      f"{r['output_tokens_per_s'] or 0:.1f} tok/s, TTFT p50 {r['ttft_p50_ms'] or 0:.1f} ms, "
                      f"ITL p50 {r['itl_p50_ms'] or 0:.2f} ms", flush=True)
        for model in models:
            if not experiments[model]:
                raise SystemExit(f"perf_analyzer left no readable export for {model} at concurrency {c} in "
                                 f"{rounds} round(s) of {ATTEMPTS} attempts; logs: {out_dir}/pa_{model}_c{c}*.log")
            rows.append({"source": "openai client" if model == OPENAI else "perf_analyzer", "model": model,
                         **experiment_metrics(experiments[model], prompts.max_tokens)})
    return rows


def openai_experiment(front: tuple[int, str], texts: list[str], max_tokens: int, c: int) -> list[dict]:
    """The prompts streamed through the OpenAI front (/v1/completions, greedy, ``ignore_eos`` with ``min_tokens =
    max_tokens``: the same work as end_id = -1), ``c`` at a time, as one experiment in perf_analyzer's export shape
    (send and response stamps in ns; one stamp per chunk with text), so perf_report measures it the same way."""
    import concurrent.futures as cf

    from openai_load import stream_one

    port, model = front
    with cf.ThreadPoolExecutor(c) as pool:
        done = list(pool.map(lambda t: stream_one(port, model, t, max_tokens), texts))
    short = sorted({r["tokens"] for r in done if r["tokens"] != max_tokens})
    if short:
        raise RuntimeError(f"the OpenAI front generated {short} tokens, not {max_tokens}: the comparison needs equal work")
    return [{"experiment": {"mode": "concurrency", "value": c},
             "requests": [{"timestamp": int(r["sent"] * 1e9), "response_timestamps": [int(t * 1e9) for t in r["stamps"]]}
                          for r in done]}]


def run_genai_perf(genai_bin: Path, pa_env: dict, url: str, tokenizer_dir: Path, concurrency: list[int],
                   prompt_tokens: int, max_tokens: int, requests: int, out_dir: Path, timeout_s: int) -> list[dict]:
    """genai-perf profile --backend tensorrtllm against `ensemble`, one run per concurrency level."""
    env = dict(pa_env, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    rows = []
    for c in concurrency:
        artifacts = out_dir / "genai" / f"c{c}"
        cmd = [str(genai_bin), "profile", "-m", "ensemble", "--endpoint-type", "kserve", "--backend", "tensorrtllm",
               "--streaming", "-u", url, "--tokenizer", str(tokenizer_dir),
               "--synthetic-input-tokens-mean", str(prompt_tokens), "--synthetic-input-tokens-stddev", "0",
               "--output-tokens-mean", str(max_tokens), "--concurrency", str(c),
               "--request-count", str(max(requests, 2 * c)), "--artifact-dir", str(artifacts),
               "--profile-export-file", "profile_export.json"]
        print(f"==> genai-perf ensemble concurrency {c}", flush=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=out_dir)
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "genai_perf.log").write_text(proc.stdout + proc.stderr)
        found = sorted(artifacts.rglob("*_genai_perf.json"))
        if proc.returncode != 0 or not found:
            raise RuntimeError(f"genai-perf failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
        row = genai_perf_row(found[0], "ensemble", c)
        print(f"    {row['output_tokens_per_s'] or 0:.1f} tok/s, TTFT p50 {row['ttft_p50_ms'] or 0:.1f} ms, "
              f"ITL p50 {row['itl_p50_ms'] or 0:.2f} ms", flush=True)
        rows.append(row)
    return rows


def parse_levels(text: str) -> list[int]:
    if ":" in text:  # start:end[:step], like perf_analyzer's --concurrency-range
        parts = [int(x) for x in text.split(":")]
        return list(range(parts[0], parts[1] + 1, parts[2] if len(parts) > 2 else 1))
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="gRPC host:port of a running server (default: start one on free ports)")
    p.add_argument("--models", default=f"ensemble,tensorrt_llm_bls,tensorrt_llm,{OPENAI}",
                   help=f"comma list: Triton models for perf_analyzer, and {OPENAI} (the OpenAI front, started here "
                        "over the same server)")
    p.add_argument("--concurrency", default="1,8,16", help="levels: 1,8,16 or start:end[:step]")
    p.add_argument("--requests", type=int, default=32, help="requests per level and round (>= 2 x concurrency)")
    p.add_argument("--rounds", type=int, default=4,
                   help="rounds per level, the models interleaved (each round its own perf_analyzer run)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--tokenizer-dir", type=Path,
                   help="a tokenizer folder or GGUF file (default: the checkpoint's when --gpt-model-path is given, "
                        "else deployment.yaml's llm.tokenizer_dir, what the server reads)")
    p.add_argument("--gpt-model-path", type=Path,
                   help="serve this checkpoint instead of deployment.yaml's: an HF folder, a GGUF file, or "
                        "build/models/bench (the 124.7M Llama of bench_model.py: a folder without tokenizer.json gets "
                        "the made-up BPE tokenizer of benchmarks/peers over its vocabulary)")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "perf")
    p.add_argument("--genai-perf", choices=("auto", "skip", "require"), default="auto",
                   help="auto: run it when --genai-venv has it")
    p.add_argument("--genai-venv", type=Path, default=ROOT / "build" / "perf" / "genai-venv")
    p.add_argument("--genai-concurrency", default="1,8")
    p.add_argument("--timeout", type=int, default=900, help="seconds per perf_analyzer / genai-perf run")
    args = p.parse_args(argv)

    env = perf_analyzer_env()
    levels = parse_levels(args.concurrency)
    models = [m for m in args.models.split(",") if m]
    # Absolute: genai-perf runs with the output folder as its working directory.
    out, args.genai_venv = args.out.resolve(), args.genai_venv.resolve()
    if args.gpt_model_path is not None:
        args.gpt_model_path = args.gpt_model_path.resolve()
        if not is_gguf(args.gpt_model_path) and not (args.gpt_model_path / "tokenizer.json").exists():
            from peers.setup_envs import model_with_tokenizer  # the bench model: a made-up BPE over its ids

            args.gpt_model_path = args.tokenizer_dir = Path(model_with_tokenizer(str(args.gpt_model_path)))
    tokenizer = (args.tokenizer_dir or args.gpt_model_path or default_tokenizer_dir()).resolve()
    prompts = Prompts(tokenizer, args.prompt_tokens, args.max_tokens, out)
    genai_bin = args.genai_venv / "bin" / "genai-perf"
    if args.genai_perf == "require" and not genai_bin.exists():
        raise SystemExit(f"{genai_bin} not found: make perf creates it (or --genai-perf skip)")

    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(_own_server(args, tokenizer, max(levels)))
        openai = None
        if OPENAI in models:
            port, stop = start_openai_front(OPENAI, url, out / "openai_server.log")
            stack.callback(stop)
            openai = (port, OPENAI)
        rows = run_perf_analyzer(env, url, models, prompts, levels, args.requests, args.rounds, out, args.timeout,
                                 openai)
        if args.genai_perf != "skip" and genai_bin.exists():
            # genai-perf reads tokenizer folders only: a GGUF's is the HF view the server already caches.
            rows += run_genai_perf(genai_bin, env, url, hf_folder(tokenizer), parse_levels(args.genai_concurrency),
                                   args.prompt_tokens, args.max_tokens, args.requests, out, args.timeout)
        elif args.genai_perf == "auto":
            print(f"==> genai-perf skipped: {genai_bin} not found (make perf creates it)", flush=True)
    csv_path, json_path = write_summary(rows, out)
    png = plot(rows, out / "perf.png", f"prompt {args.prompt_tokens} tokens, {args.max_tokens} generated, CPU")
    for model in (m for m in models if m != "tensorrt_llm"):
        for r in ratios(rows, model, "tensorrt_llm"):
            ttft = f"{r['ttft_p50_ratio']:.2f}x" if r["ttft_p50_ratio"] else "n/a"
            print(f"==> {model} / tensorrt_llm at concurrency {r['concurrency']}: output tok/s "
                  f"{r['tok_s_ratio']:.2f}x, TTFT p50 {ttft}", flush=True)
    print(f"==> {csv_path}\n==> {json_path}\n==> {png}")
    return 0


@contextlib.contextmanager
def _own_server(args, tokenizer: Path, batch: int):
    """A tritonserver on free ports over the rendered repository (or, with --gpt-model-path, a throwaway one serving
    that checkpoint); yields its gRPC url and stops it afterwards."""
    from tritonllm.serving.launcher import TritonServer, find_free_ports

    repos = []
    if args.gpt_model_path is not None:
        from triton_bench import _repository

        repos = [_repository(str(args.gpt_model_path), "auto", batch, args.prompt_tokens + args.max_tokens + 64,
                             text=True, tokenizer_dir=str(tokenizer))]
    server = TritonServer(*find_free_ports(3), **({"repositories": repos} if repos else {}),
                          log_path=ROOT / "build" / "logs" / "perf-tritonserver.log")
    print(f"==> starting tritonserver (log {server.log_path})", flush=True)
    try:
        server.start(timeout=300)
        yield server.grpc_url
    finally:
        server.stop()
        for repo in repos:
            shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
