"""OpenAI response bodies (completions, chat completions, their stream chunks, usage, logprobs) and the
text-side helpers they need (chat template, token counting).

Invariants:
- ``usage`` counts are the engine's (``num_input_tokens`` / ``num_output_tokens`` from Triton) when the
  model returns them; otherwise the tokenizer's count of the prompt / generated text.
- ``finish_reason`` is the engine's (passed on by the BLS): "stop" (end id or stop string), "length" (max_tokens,
  and a request cut by its deadline, as vLLM reports a cut); through the ensemble (no reason sent) "length" when
  the model generated ``max_tokens`` tokens, else "stop".
- Logprobs: one per generated token, the engine's, each named by the id of the token it scores (the BLS's
  and the direct path's ``output_token_ids``, decoded one by one), also the tokens past a stop string's cut,
  whose log probs the engine computed. Only through the ensemble, which has no such output, do token strings
  come from re-tokenizing the text; where that gives another count (a BPE merge differs, a stop string cut
  the text) they are "" rather than guessed. ``top_logprobs`` are the engine's alternatives (ids decoded one
  by one), empty lists when none were asked for.
- With ``n`` > 1 each sequence is one ``Outcome``; usage counts the prompt once and every sequence's
  completion tokens (OpenAI's accounting).
- The chat template is rendered client-side (transformers' ``apply_chat_template``, local files, no
  repository code). Triton's preprocessing adds special tokens again, so a BOS the template already wrote
  is removed from the rendered text: the model sees exactly one.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class TextTools:
    """Tokenizer-backed helpers; ``tokenizer`` may be None (no chat template, counts from Triton only)."""

    def __init__(self, tokenizer: Any | None):
        self.tokenizer = tokenizer
        self._adds_bos = False
        if tokenizer is not None and tokenizer.bos_token_id is not None:
            ids = tokenizer("x").input_ids
            self._adds_bos = bool(ids) and ids[0] == tokenizer.bos_token_id

    @classmethod
    def from_dir(cls, directory: str | None) -> "TextTools":
        if not directory:
            return cls(None)
        from tritonllm.model_files import load_hf_tokenizer  # a tokenizer folder or a GGUF file

        return cls(load_hf_tokenizer(directory))

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        from clients.openai_server.protocol import ApiError

        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(400, "this server has no chat template (start it with --tokenizer-dir)", param="messages")
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                      add_generation_prompt=True)
        except Exception as e:  # a template may raise on roles it does not know (jinja2 exceptions)
            raise ApiError(400, f"chat template: {e}", param="messages") from None
        bos = self.tokenizer.bos_token
        if self._adds_bos and bos and text.startswith(bos):
            text = text[len(bos):]
        return text

    def count(self, text: str, prompt: bool) -> int:
        if self.tokenizer is None:
            return 0
        return len(self.tokenizer(text, add_special_tokens=prompt).input_ids)

    def token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else ""

    def tokens(self, text: str, n: int, ids: list[int] | None = None) -> list[str]:
        """``n`` token strings: of ``ids`` when given (one per log prob), else of ``text`` re-tokenized (see
        the module docstring: "" when that disagrees)."""
        if ids is not None and len(ids) == n:
            return [self.token(i) for i in ids]
        if n == 1:
            return [text]
        if self.tokenizer is not None:
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
            if len(ids) == n:
                return [self.tokenizer.decode([i]) for i in ids]
        return [""] * n


@dataclass
class Outcome:
    """What one generation produced, accumulated over its chunks."""

    text: str = ""
    log_probs: list[float] = field(default_factory=list)
    token_ids: list[int] | None = field(default_factory=list)  # of log_probs; None once a chunk came without
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    engine_reason: str | None = None  # the BLS's finish_reason (the engine's, or "stop" for a stop string)

    def add(self, chunk) -> None:
        if chunk.finish_reason:
            self.engine_reason = chunk.finish_reason
        self.text += chunk.text
        self.log_probs.extend(chunk.log_probs or [])
        if chunk.log_probs:
            if chunk.token_ids is None or self.token_ids is None:
                self.token_ids = None
            else:
                self.token_ids.extend(chunk.token_ids)
        self.top.extend(chunk.top_log_probs or [])
        if chunk.num_input_tokens is not None:
            self.prompt_tokens = chunk.num_input_tokens
        if chunk.num_output_tokens is not None:
            self.completion_tokens = (self.completion_tokens or 0) + chunk.num_output_tokens  # per response

    def usage(self, tools: TextTools, prompt: str) -> dict[str, int]:
        p = self.prompt_tokens if self.prompt_tokens is not None else tools.count(prompt, prompt=True)
        c = self.completion_count(tools)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def completion_count(self, tools: TextTools) -> int:
        return self.completion_tokens if self.completion_tokens is not None else tools.count(self.text, prompt=False)

    def finish_reason(self, max_tokens: int) -> str:
        """OpenAI's: the engine's reason when the model sent one ("timeout", a request cut by allotted_time_ms, is
        "length", as vLLM reports a cut, so a client can tell it from a natural stop), else from the counts."""
        if self.engine_reason:
            return {"timeout": "length", "abort": "stop"}.get(self.engine_reason, self.engine_reason)
        return "length" if (self.completion_tokens or 0) >= max_tokens else "stop"


def _tops(top: list[list[tuple[int, float]]] | None, n: int) -> list[list[tuple[int, float]]]:
    top = list(top or [])
    return top[:n] + [[] for _ in range(n - len(top))]


def completion_logprobs(tools: TextTools, text: str, log_probs: list[float], offset: int = 0,
                        top: list[list[tuple[int, float]]] | None = None,
                        ids: list[int] | None = None) -> dict[str, Any]:
    tokens = tools.tokens(text, len(log_probs), ids)
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    alternatives = [{tools.token(i): lp for i, lp in alts} for alts in _tops(top, len(tokens))]
    return {"tokens": tokens, "token_logprobs": log_probs, "top_logprobs": alternatives, "text_offset": offsets}


def chat_logprobs(tools: TextTools, text: str, log_probs: list[float],
                  top: list[list[tuple[int, float]]] | None = None, ids: list[int] | None = None) -> dict[str, Any]:
    tokens = tools.tokens(text, len(log_probs), ids)

    def entry(token: str, lp: float) -> dict:
        return {"token": token, "logprob": lp, "bytes": list(token.encode("utf-8"))}

    return {"content": [{**entry(t, lp), "top_logprobs": [entry(tools.token(i), v) for i, v in alts]}
                        for t, lp, alts in zip(tokens, log_probs, _tops(top, len(tokens)))]}


def completion_body(rid: str, model: str, choices: list[dict], usage: dict | None) -> dict[str, Any]:
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body


def chat_body(rid: str, model: str, choices: list[dict], usage: dict | None, chunk: bool = False) -> dict:
    body = {"id": rid, "object": "chat.completion.chunk" if chunk else "chat.completion",
            "created": int(time.time()), "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return body


def choices_usage(tools: TextTools, prompt: str, outcomes: list[Outcome]) -> dict[str, int]:
    """One prompt's usage over its ``n`` sequences: the prompt once, every completion."""
    p = outcomes[0].usage(tools, prompt)["prompt_tokens"]  # counted once, not per sequence
    c = sum(o.completion_count(tools) for o in outcomes)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def sum_usage(usages: list[dict[str, int]]) -> dict[str, int]:
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    return {k: sum(u[k] for u in usages) for k in keys}
