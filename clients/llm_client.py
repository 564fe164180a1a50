#!/usr/bin/env python3
"""Generate text with the served LLM over HTTP or gRPC, streaming or not, and print a timing summary.

    python clients/llm_client.py "Once upon a time" --max-tokens 32 --stream
    python clients/llm_client.py "Hello" --protocol http --url localhost:8000 --model tensorrt_llm_bls \
        --temperature 0.8 --top-p 0.9 --seed 7 --stop "." --return-log-probs
    python clients/llm_client.py "What is Triton?" --chat --system "Be brief."   # chat template, client-side

The text goes to stdout as it arrives; the summary (TTFT, tokens/s, total time, token counts) to stderr,
or as one JSON line with ``--json``. Exit status 1 when the server reports an error (its message is printed).

``--chat`` renders the chat template of ``--tokenizer-dir`` (transformers' apply_chat_template, local files
only, no repository code executed) and sends the rendered text; without a template the prompt is sent as is.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `clients` importable
    sys.path.insert(0, str(ROOT))

from clients.triton_llm import (TEXT_MODELS, GenerationParams, Timing, TritonError,  # noqa: E402
                                default_tokenizer_dir, generate)

DEFAULT_URLS = {"grpc": "localhost:8001", "http": "localhost:8000"}


def render_chat(prompt: str, tokenizer_dir: str, system: str | None) -> str:
    """The prompt as one user turn (after an optional system turn) of the tokenizer's chat template."""
    from tritonllm.model_files import load_hf_tokenizer  # a tokenizer folder or a GGUF file

    tok = load_hf_tokenizer(tokenizer_dir)
    if not getattr(tok, "chat_template", None):
        print(f"[llm_client] no chat template in {tokenizer_dir}: sending the prompt as is", file=sys.stderr)
        return prompt
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", help="prompt text (read from stdin when omitted)")
    p.add_argument("--url", help="host:port (default localhost:8001 for grpc, localhost:8000 for http)")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--model", choices=TEXT_MODELS, default="ensemble")
    p.add_argument("--stream", action="store_true", help="stream the text as it is generated")
    s = p.add_argument_group("sampling (unset = the server's default)")
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--temperature", type=float)
    s.add_argument("--top-k", type=int)
    s.add_argument("--top-p", type=float)
    s.add_argument("--seed", type=int)
    s.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    s.add_argument("--bad-word", action="append", default=[], metavar="TEXT", help="banned word (repeatable)")
    s.add_argument("--repetition-penalty", type=float)
    s.add_argument("--presence-penalty", type=float)
    s.add_argument("--frequency-penalty", type=float)
    s.add_argument("--min-tokens", type=int)
    s.add_argument("--end-id", type=int, help="end-of-sequence token id (default: the tokenizer's)")
    s.add_argument("--return-log-probs", action="store_true", help="print the generated tokens' log probs")
    s.add_argument("--lora-task-id", type=int, help="a LoRA adapter of tensorrt_llm (deployment.yaml lora_adapters)")
    c = p.add_argument_group("chat")
    c.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template client-side")
    c.add_argument("--system", help="system message (with --chat)")
    c.add_argument("--tokenizer-dir", default=str(default_tokenizer_dir()),
                   help="default: $TOKENIZER_DIR, else deployment.yaml's llm.tokenizer_dir")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line on stdout")
    return p.parse_args(argv)


def params_from(args: argparse.Namespace) -> GenerationParams:
    return GenerationParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, min_tokens=args.min_tokens, end_id=args.end_id,
        return_log_probs=True if args.return_log_probs else None,
        stop_words=list(args.stop), bad_words=list(args.bad_word), lora_task_id=args.lora_task_id)


def reachable(url: str, timeout_s: float = 2.0) -> bool:
    """Whether anything accepts a TCP connection at host:port (the client libraries' errors do not say)."""
    host, _, port = url.rpartition(":")
    try:
        socket.create_connection((host or "localhost", int(port)), timeout=timeout_s).close()
        return True
    except (OSError, ValueError):
        return False


def main(argv=None) -> int:
    args = parse_args(argv)
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if args.chat:
        prompt = render_chat(prompt, args.tokenizer_dir, args.system)
    url = args.url or DEFAULT_URLS[args.protocol]
    params = params_from(args)
    timing = Timing()
    text, log_probs = [], []
    try:
        for chunk in generate(args.protocol, url, args.model, prompt, params, stream=args.stream):
            timing.observe(chunk)
            text.append(chunk.text)
            log_probs.extend(chunk.log_probs or [])
            if not args.json:
                print(chunk.text, end="", flush=True)
    except Exception as e:  # the server's error, or the transport's own (a gRPC stream, a refused connection)
        if not reachable(url):
            print(f"\nerror: cannot connect to {url} ({args.protocol}): no server listens there. Start one with "
                  f"`make serve` (HTTP 8000, gRPC 8001) or pass --url host:port", file=sys.stderr)
            return 1
        if isinstance(e, TritonError):
            print(f"\nerror: {e.message}", file=sys.stderr)
            return 1
        raise
    summary = timing.finish().summary()
    if args.json:
        print(json.dumps({"text": "".join(text), **summary, **({"log_probs": log_probs} if log_probs else {})}))
        return 0
    print()
    if log_probs:
        print(f"log probs: {[round(x, 4) for x in log_probs]}", file=sys.stderr)
    ttft = f"{summary['ttft_s'] * 1000:.1f} ms" if summary["ttft_s"] is not None else "n/a"
    decode = summary["decode_tokens_per_s"]
    print(f"--- {args.model} over {args.protocol}{' (stream)' if args.stream else ''}: "
          f"prompt {summary['input_tokens']} tokens, generated {summary['output_tokens']} tokens | "
          f"TTFT {ttft} | total {summary['total_s']:.3f} s | {summary['tokens_per_s'] or 0:.1f} tokens/s"
          + (f" (decode {decode:.1f} tokens/s)" if decode else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
