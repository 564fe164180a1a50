"""An OpenAI-compatible HTTP API (/v1/models, /v1/completions, /v1/chat/completions) in front of Triton.

Run: ``python -m clients.openai_server --port 9000 --triton-url localhost:8001`` (or ``make openai``).
Modules: ``protocol`` (request schemas -> sampling inputs), ``triton`` (async gRPC to the text model,
error -> HTTP status), ``responses`` (response bodies, usage, logprobs, chat template), ``app`` (routes).
"""
