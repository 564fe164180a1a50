"""``python -m clients.openai_server``: serve the OpenAI-compatible API with uvicorn.

Defaults come from the environment so ``make openai OPENAI_PORT=9000 GRPC_PORT=8001`` works:
OPENAI_PORT (9000), GRPC_PORT (8001; the Triton gRPC endpoint is localhost:GRPC_PORT unless
--triton-url is given), OPENAI_TRITON_MODEL (tensorrt_llm), TOKENIZER_DIR (deployment.yaml's llm.tokenizer_dir),
TRITONLLM_API_KEY (--api-key: better than the flag, which other users of the machine can read in ps),
OPENAI_TOOL_CALL_PARSER (--tool-call-parser), OPENAI_REASONING_PARSER (--reasoning-parser).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from clients.openai_server.reasoning import PARSERS as REASONING_PARSERS
    from clients.openai_server.tool_calls import PARSERS as TOOL_PARSERS
    from clients.triton_llm import default_tokenizer_dir

    p = argparse.ArgumentParser(prog="python -m clients.openai_server", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default=os.environ.get("OPENAI_HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(os.environ.get("OPENAI_PORT") or 9000))
    p.add_argument("--triton-url", default=f"localhost:{os.environ.get('GRPC_PORT') or 8001}",
                   help="Triton gRPC endpoint host:port")
    p.add_argument("--model", default=os.environ.get("OPENAI_TRITON_MODEL", "tensorrt_llm"),
                   help="Triton model to serve: tensorrt_llm (the BLS's text steps run in this server, with the "
                        "tokenizer of --tokenizer-dir: one process hop less a token), tensorrt_llm_bls or ensemble")
    p.add_argument("--fallback", default="tensorrt_llm_bls", help="used when --model is not ready ('' = none)")
    p.add_argument("--tokenizer-dir", default=str(default_tokenizer_dir()),
                   help="HF tokenizer folder for the chat template and token counts ('' = none)")
    p.add_argument("--served-model-name", default="tritonllm", help="the model name clients ask for")
    p.add_argument("--default-max-tokens", type=int, default=256, help="chat requests without max_tokens")
    p.add_argument("--lora-modules", nargs="*", metavar="NAME=TASK_ID",
                   default=(os.environ.get("OPENAI_LORA_MODULES") or "").split(),
                   help="serve LoRA adapters of tensorrt_llm (its lora_adapters parameter) as model names, "
                        "e.g. python=1")
    p.add_argument("--enable-lora-loading", action="store_true",
                   default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
                   help="serve /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's; paths are folders under "
                        "tensorrt_llm's lora_root parameter)")
    p.add_argument("--api-key", default=os.environ.get("TRITONLLM_API_KEY") or None,
                   help="require 'Authorization: Bearer <key>' on /v1 routes (env TRITONLLM_API_KEY)")
    p.add_argument("--tool-call-parser", choices=sorted(TOOL_PARSERS),
                   default=os.environ.get("OPENAI_TOOL_CALL_PARSER") or None, help="reads tool calls out of the model's text for tool_choice auto (the chat template's family)")
    p.add_argument("--reasoning-parser", choices=REASONING_PARSERS,
                   default=os.environ.get("OPENAI_REASONING_PARSER") or None, help="splits <think>...</think> into reasoning_content")
    p.add_argument("--max-request-bytes", type=int, default=16 * 1024 * 1024,
                   help="larger request bodies are refused with 413 (default 16 MiB)")
    p.add_argument("--request-body-timeout-s", type=float, default=30.0,
                   help="a body that stops arriving for this long is refused with 408 (default 30 s)")
    p.add_argument("--responses-store-size", type=int, default=1000,
                   help="/v1/responses kept for retrieval and previous_response_id (oldest dropped; 0: none)")
    p.add_argument("--responses-ttl-s", type=float, default=3600.0,
                   help="how long a stored response can be retrieved or continued (default 1 h)")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    try:
        lora_modules = {name: int(tid) for name, _, tid in (m.partition("=") for m in args.lora_modules)}
    except ValueError:
        p.error(f"--lora-modules expects NAME=TASK_ID pairs, got {args.lora_modules}")

    import uvicorn

    from clients.openai_server.app import Settings, create_app

    tokenizer_dir = args.tokenizer_dir or None
    if tokenizer_dir and not Path(tokenizer_dir).exists():
        print(f"[openai_server] tokenizer {tokenizer_dir} not found: no chat template, counts from Triton",
              file=sys.stderr)
        tokenizer_dir = None
    app = create_app(Settings(triton_url=args.triton_url, model=args.model, fallback=args.fallback or None,
                              tokenizer_dir=tokenizer_dir, served_model_name=args.served_model_name,
                              default_max_tokens=args.default_max_tokens, lora_modules=lora_modules,
                              enable_lora_loading=args.enable_lora_loading,
                              api_key=args.api_key, tool_call_parser=args.tool_call_parser,
                              reasoning_parser=args.reasoning_parser, max_request_bytes=args.max_request_bytes,
                              request_body_timeout_s=args.request_body_timeout_s,
                              responses_store_size=args.responses_store_size, responses_ttl_s=args.responses_ttl_s))
    from clients.llm_client import reachable
    from clients.openai_server.triton import unreachable_message

    if not reachable(args.triton_url):  # Triton may come up later: say so now, serve 503 with the same words
        print(f"[openai_server] warning: {unreachable_message(args.triton_url)}; requests answer 503 until it is "
              f"up", file=sys.stderr, flush=True)
    auth = "API key required" if args.api_key else "no API key (open)"
    print(f"[openai_server] http://{args.host}:{args.port}/v1 -> Triton {args.triton_url} ({args.model}); {auth}",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
