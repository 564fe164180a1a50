"""Perplexity of our engine against llama.cpp's `llama-perplexity`, on the same GGUF file and the same tokens
(`make eval`).

    python benchmarks/eval_ppl.py [--model build/models/SmolLM2-135M-Instruct.Q4_1.gguf] [--ctx 512] [--chunks 16]
                                  [--activations none,int8] [--skip-llamacpp]

The text is local and fixed: the first ``--chars`` characters of the demo corpus (build_scripts/demo_corpus.py:
Python's docstrings and language reference, the system's license texts; byte-identical on a given image), written
to build/eval/text.txt. It is tokenized once, by llama.cpp (llama-cpp-python over the same vendored build, the file's
own vocabulary, special tokens added as the vocabulary says), and our engine scores exactly those ids, so a
difference is the engines' arithmetic, never their tokenizers.

The measure is llama-perplexity's own (tools/perplexity/perplexity.cpp, its default mode): the tokens cut into
chunks of ``--ctx``; each chunk's first token replaced by BOS when the vocabulary adds one; the negative log-likelihood
of each chunk's second half (every token after position ctx / 2, given all before it in the chunk); PPL = exp(mean).
Ours reads the log probs from the engine's ``prompt_logprobs`` (every prompt row through the model's LM head, the
serving code path, chunked prefill included), once per ``activation_quantization`` mode. llama.cpp runs with 2
threads, ``-c ctx -b ctx``.

Results: build/eval/results.json; a table with each mode's PPL and its ratio to llama.cpp's.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build_scripts"))
DEFAULT_MODEL = ROOT / "build" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = ROOT / "build" / "eval"

_TOKENIZE = """
import json, sys
import llama_cpp
from llama_cpp import Llama
m = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
text = open(sys.argv[2], "rb").read()
vocab = m._model.vocab
print(json.dumps({"ids": m.tokenize(text, add_bos=True, special=False),
                  "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)), "bos": llama_cpp.llama_vocab_bos(vocab)}))
"""


def log(msg: str) -> None:
    print(f"[eval] {msg}", flush=True)


def text_file(chars: int) -> Path:
    import demo_corpus

    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "text.txt"
    text = demo_corpus.load_corpus(max_chars=chars)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def llamacpp_tokens(model: Path, text: Path) -> dict:
    """llama.cpp's tokenization of the text (ids, whether the vocabulary adds BOS, the BOS id)."""
    from peers import setup_envs

    py = setup_envs.llamacpp_env()
    got = subprocess.run([py, "-c", _TOKENIZE, str(model), str(text)], capture_output=True, text=True, check=True,
                         env=setup_envs.llamacpp_runtime_env())
    return json.loads(got.stdout.strip().splitlines()[-1])


def chunks(ids: list[int], ctx: int, count: int, add_bos: bool, bos: int) -> list[list[int]]:
    """llama-perplexity's chunks: ``ctx`` tokens each, the first one BOS when the vocabulary adds it."""
    out = []
    for i in range(min(count, len(ids) // ctx)):
        chunk = ids[i * ctx:(i + 1) * ctx]
        if add_bos:
            chunk = [bos] + chunk[1:]
        out.append(chunk)
    return out


def ours(model: Path, parts: list[list[int]], activations: str, threads: int) -> dict:
    """exp(mean NLL) of each chunk's second half, from the engine's prompt_logprobs."""
    import torch

    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.engine import LLMEngine
    from tritonllm.engine.request import SamplingParams

    torch.set_num_threads(threads)
    ctx = len(parts[0])
    engine = LLMEngine(str(model), EngineConfig(max_kv_tokens=2 * ctx + 64, max_num_seqs=1,
                                                activation_quantization=activations))
    first, nll, count, start = ctx // 2, 0.0, 0, time.monotonic()
    for i, chunk in enumerate(parts):
        engine.add_request(str(i), chunk, SamplingParams(max_tokens=1, prompt_logprobs=True))
        scored = None
        while engine.has_work():
            for out in engine.step():
                scored = out.prompt_logprobs if out.prompt_logprobs is not None else scored
        # scored[j - 1] = log P(chunk[j] | chunk[:j]); llama.cpp scores j = first + 1 .. ctx - 1
        half = scored[first:ctx - 1]
        nll -= sum(half)
        count += len(half)
    return {"ppl": math.exp(nll / count), "tokens_scored": count, "seconds": round(time.monotonic() - start, 1)}


def llamacpp(model: Path, text: Path, ctx: int, count: int, threads: int) -> dict:
    from peers import setup_envs

    exe = setup_envs.llamacpp_tool("llama-perplexity")
    start = time.monotonic()
    run = subprocess.run([exe, "-m", str(model), "-f", str(text), "-c", str(ctx), "-b", str(ctx), "-t", str(threads),
                          "--chunks", str(count)], capture_output=True, text=True, env=setup_envs.llamacpp_runtime_env())
    found = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", run.stdout + run.stderr)
    if run.returncode != 0 or not found:
        raise RuntimeError(f"llama-perplexity failed ({run.returncode}):\n{(run.stdout + run.stderr)[-3000:]}")
    return {"ppl": float(found.group(1)), "ppl_stderr": float(found.group(2)),
            "seconds": round(time.monotonic() - start, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a GGUF file")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--chars", type=int, default=120_000, help="characters of the demo corpus to read")
    p.add_argument("--activations", default="none,int8", help="our activation_quantization modes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-llamacpp", action="store_true", help="ours only, tokenized by our own tokenizer")
    args = p.parse_args(argv)

    model, text = args.model.resolve(), text_file(args.chars)
    if args.skip_llamacpp:
        from tritonllm.model_files import load_hf_tokenizer

        tok = load_hf_tokenizer(model)
        ids, add_bos, bos = tok(text.read_text(encoding="utf-8")).input_ids, False, None
    else:
        got = llamacpp_tokens(model, text)
        ids, add_bos, bos = got["ids"], got["add_bos"], got["bos"]
    parts = chunks(ids, args.ctx, args.chunks, add_bos, bos)
    if len(parts) < args.chunks:
        raise SystemExit(f"{text} makes {len(ids)} tokens: {len(parts)} chunks of {args.ctx}, not {args.chunks} "
                         f"(raise --chars)")
    log(f"{model.name}: {len(ids)} tokens, {len(parts)} chunks of {args.ctx} (BOS first: {add_bos}), "
        f"{len(parts) * (args.ctx - args.ctx // 2 - 1)} tokens scored")
    rows = {}
    if not args.skip_llamacpp:
        rows["llama.cpp"] = llamacpp(model, text, args.ctx, len(parts), args.threads)
        log(f"llama.cpp: PPL {rows['llama.cpp']['ppl']:.4f} +/- {rows['llama.cpp']['ppl_stderr']:.4f} "
            f"({rows['llama.cpp']['seconds']} s)")
    for mode in [m for m in args.activations.split(",") if m]:
        rows[f"ours, activations {mode}"] = r = ours(model, parts, mode, args.threads)
        ratio = f", {r['ppl'] / rows['llama.cpp']['ppl']:.4f}x llama.cpp's" if "llama.cpp" in rows else ""
        log(f"ours, activations {mode}: PPL {r['ppl']:.4f}{ratio} ({r['seconds']} s)")
    result = {"model": str(model), "ctx": args.ctx, "chunks": len(parts), "text": str(text), "chars": args.chars,
              "tokens": len(ids), "rows": rows}
    (OUT / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    log(f"-> {OUT / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
