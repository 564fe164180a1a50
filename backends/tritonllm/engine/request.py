"""A request's parameters and evolving state, and what the engine reports back after each step."""
from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a tensor is made or checked: the text steps (the BLS, preprocessing)
    import torch  # build SamplingParams without it, and torch costs each such stub ~1 s and ~300 MB


MAX_TOP_LOGPROBS = 20
POOLING = (None, "last", "mean")  # SamplingParams.pooling
MAX_BIAS = 1e6  # |embedding_bias| bound: biased, temperature-scaled logits must stay finite


from ..errors import InvalidInput as InvalidRequest  # noqa: E402  (the engine's name for bad input)
from ..errors import QueueFull  # noqa: E402,F401  (re-exported)


@dataclass
class SamplingParams:
    """Per-request decoding controls with TensorRT-LLM semantics.

    Greedy when temperature == 0, top_k == 1, or neither top_k nor top_p is set (top_k == 0 and
    top_p in (0, 1] unset) -- TensorRT-LLM's default. ``end_id`` None means the checkpoint's EOS ids;
    -1 means never stop on EOS. Word lists are lists of token-id sequences.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    seed: int | None = None
    end_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    return_log_probs: bool = False
    guide: tuple[str, str] | None = None  # (guided_decoding_guide_type, guided_decoding_guide)
    lora_task_id: int | None = None       # a loaded LoRA adapter; None = the base model
    # where to load the lora_task_id adapter from when not loaded (engine/lora_loader.LoraSource): a path under
    # lora_root or NVIDIA's in-request tensors
    lora_source: object | None = field(default=None, compare=False)
    # Added to the raw logits first each step; shorter than the vocabulary = zero-padded (TensorRT-LLM's
    # embeddingBias). -inf bans a token.
    embedding_bias: torch.Tensor | None = field(default=None, compare=False)  # tensors have no plain ==
    top_logprobs: int = 0                 # most likely ids + log probs per generated token (0..20)
    priority: float = 0.5                 # TensorRT-LLM executor: [0, 1], higher is admitted first
    allotted_time_ms: int | None = None   # deadline from arrival; then finish_reason "timeout"
    # Engine id of a sibling with the same prompt (n > 1): with prefix caching on, this request is not
    # admitted until that sibling has computed its prompt, so the prompt's full blocks are shared.
    prefill_after: str | None = None
    # Not generation: the prompt's final hidden states (after the model's last norm) pooled into one vector,
    # "last" (the last token's) or "mean" (over the prompt), vLLM's pooling types for embeddings. Prefill only:
    # the request ends when its prompt is computed, its KV blocks freed; max_tokens and sampling do not apply.
    pooling: str | None = None
    # vLLM's prompt_logprobs, without top alternatives: the log prob of every prompt token after the first, given the
    # tokens before it, on the request's first output. Every prompt row is computed (no prefix-cache blocks), as for
    # "mean" pooling: ``make eval``'s perplexity reads it.
    prompt_logprobs: bool = False

    def verify(self) -> None:
        """Refuse values no engine can serve (InvalidRequest naming the field), as vLLM's
        ``SamplingParams._verify_args``; limits that depend on the model (vocabulary, lengths) are the
        engine's to check. The tensor contract renames fields to its inputs (``llm_io.in_tensor_names``)."""
        if self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.pooling not in POOLING:
            raise InvalidRequest(f"pooling must be one of {', '.join(p for p in POOLING if p)}, got {self.pooling!r}")
        if self.prompt_logprobs and self.pooling:
            raise InvalidRequest("prompt_logprobs and pooling do not go together: a pooled request has no tokens")
        for name, value in (("temperature", self.temperature), ("top_p", self.top_p),
                            ("repetition_penalty", self.repetition_penalty),
                            ("presence_penalty", self.presence_penalty),
                            ("frequency_penalty", self.frequency_penalty)):
            if not math.isfinite(value):
                raise InvalidRequest(f"{name} must be finite, got {value}")
        if self.temperature < 0:
            raise InvalidRequest(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 <= self.top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in [0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise InvalidRequest(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.min_tokens < 0:
            raise InvalidRequest(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.end_id is not None and self.end_id < -1:
            raise InvalidRequest(f"end_id {self.end_id} is outside the vocabulary")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        if not (math.isfinite(self.priority) and 0.0 <= self.priority <= 1.0):
            raise InvalidRequest(f"priority must be in [0, 1], got {self.priority}")
        if self.allotted_time_ms is not None and self.allotted_time_ms < 1:
            raise InvalidRequest(f"allotted_time_ms must be >= 1, got {self.allotted_time_ms}")
        b = self.embedding_bias
        if b is not None:
            import torch

            if not isinstance(b, torch.Tensor) or b.dim() != 1 or b.numel() < 1 or not b.is_floating_point():
                raise InvalidRequest("embedding_bias must be a non-empty 1-D floating-point tensor")
            # numpy, not torch: this runs on the caller's thread, where a torch op over a vocabulary would start a
            # second OpenMP team and slow every engine step after it (runner.py)
            a = b.detach().cpu().numpy()
            finite = np.isfinite(a)
            if not (finite | np.isneginf(a)).all():
                raise InvalidRequest("embedding_bias holds NaN or +inf (-inf is allowed: it bans a token)")
            if (np.abs(a[finite]) > MAX_BIAS).any():  # beyond it logits overflow to inf / NaN
                raise InvalidRequest(f"embedding_bias values must be within +-{MAX_BIAS:g} (or -inf)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1 or (self.top_k == 0 and self.top_p <= 0.0)

    @property
    def needs_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


@dataclass
class RequestMetrics:
    """TensorRT-LLM's per-request perf metrics (``return_perf_metrics``). Times are ``time.monotonic_ns()``,
    as TensorRT-LLM's are steady-clock nanoseconds; 0 = not yet. Block counts cover the context (the
    prompt, and after a preemption everything recomputed), as TensorRT-LLM counts them when a sequence
    is added to its KV cache: ``kv_alloc_total_blocks`` blocks were taken from the free list, of which
    ``kv_alloc_new_blocks`` held no cached prefix; ``kv_reused_blocks`` came from the prefix cache."""

    arrival_ns: int = field(default_factory=time.monotonic_ns)
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    kv_alloc_total_blocks: int = 0
    kv_alloc_new_blocks: int = 0
    kv_reused_blocks: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    """Engine-side state. ``token_ids`` = prompt + generated; tokens [0, num_computed) have KV in the cache."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_time: float
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full computed blocks
    status: Status = Status.WAITING
    num_emitted: int = 0                 # generated tokens already reported
    logprobs: list[float] = field(default_factory=list)
    cum_logprob: float = 0.0
    finish_reason: str | None = None
    num_preemptions: int = 0
    first_token_time: float | None = None
    generator: torch.Generator | None = None
    draft: list[int] = field(default_factory=list)  # speculative tokens scored this step (not yet accepted)
    matcher: object | None = None        # grammar state when the request is guided
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    # params.top_logprobs > 0 only: one list per generated token, parallel to ``logprobs``
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    embedding_bias: torch.Tensor | None = None  # params.embedding_bias, fp32, vocab-wide, on the model's device
    pool_sum: torch.Tensor | None = None  # params.pooling: the pooled hidden states of the prompt computed so far
    pool_count: int = 0
    prompt_lp: list[float] = field(default_factory=list)  # params.prompt_logprobs: prompt tokens 1.. scored so far
    lora_root: int | None = None  # the KV hash root of the request's LoRA adapter (LoraAdapter.root); None = base

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt:]

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt

    @property
    def deadline(self) -> float | None:
        """When the request times out, on the clock of ``arrival_time``; None = never."""
        ms = self.params.allotted_time_ms
        return None if ms is None else self.arrival_time + ms / 1000.0


@dataclass
class RequestOutput:
    """What one step produced for one request: newly visible tokens (a delta) and, when finished, why."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float]
    finished: bool
    finish_reason: str | None = None     # "stop" (EOS or stop word), "length", "abort", "timeout"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0           # total visible generated tokens so far
    cum_logprob: float = 0.0
    error: str | None = None
    error_code: str | None = None        # with error: INVALID_ARG (the client's to fix) or INTERNAL (ours)
    metrics: RequestMetrics | None = None  # a copy taken when this output was made
    # per new token (aligned with new_token_ids): the params.top_logprobs most likely (id, log prob),
    # descending, ties by id; empty when top_logprobs == 0
    new_top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    embedding: list[float] | None = None  # params.pooling: the pooled vector, on the final output
    # params.prompt_logprobs, on the request's first output: log P(prompt[i] | prompt[:i]) for i = 1 .. n - 1
    prompt_logprobs: list[float] | None = None


def admit(unfinished: set[str], request_ids: list[str], capacity: int, max_queue_size: int, running: int) -> None:
    """Admission of a client's batch, all or none (call under the caller's lock, then add the ids):
    a duplicate id is INVALID_ARG; past ``capacity`` unfinished requests, QueueFull with both of NVIDIA's
    texts (TensorRT-LLM's executor says the first, Triton's scheduler the second, and NVIDIA's clients
    look for either: tools/inflight_batcher_llm/test_max_queue_size.py)."""
    for rid in request_ids:
        if rid in unfinished:
            raise InvalidRequest(f"request id {rid!r} is already in flight")
    if len(unfinished) + len(request_ids) > capacity:
        raise QueueFull(f"Maximum queue size of {max_queue_size} has been reached, please try again later "
                        f"(Exceeds maximum queue size: {len(unfinished)} requests in flight, {running} running at most)")
