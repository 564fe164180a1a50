"""What the Triton side of the ``tensorrt_llm`` model (``llm_model.LLMTritonModel``) needs from a generator.

A *generator backend* turns token ids into token ids: our engine (``engine_backend.EngineBackend``:
LLMEngine + EngineRunner) or TensorRT-LLM's LLM API (``tritonllm.trtllm.llmapi_runner.LLMAPIRunner``).
Everything that talks to Triton -- tensors, Jobs, responses, cancellation, stop requests, metrics, error
codes -- is shared and never sees which one runs.

Invariants every backend keeps (the shared part relies on them):
- ``submit_all`` admits every request of the list or none; it raises ``InvalidRequest`` (a message naming
  the offending SamplingParams field or ``prompt_ids``, which the shared part renames to the contract's
  input, ``llm_io.in_tensor_names``; answered INVALID_ARG) or ``QueueFull`` (answered UNAVAILABLE) in the caller's
  thread, before anything is generated;
- every admitted request gets exactly one final ``RequestOutput`` (``finished=True``) through the
  ``on_output`` callback given to the builder: on its end, on ``abort``, on an error (``error`` set) and on
  ``shutdown``; nothing follows the final output of a request;
- outputs are deltas (``new_token_ids`` / ``new_logprobs``: only what is new), generated tokens only;
  ``num_output_tokens`` counts every visible generated token so far; a matched stop word stays in the
  output, the end token does not (TensorRT-LLM's semantics);
- ``abort`` of an unknown or finished id is a no-op; any thread may call ``abort`` and ``submit_all``;
- ``load`` / ``stats`` / ``iteration_stats`` are cheap and never block on generation (the watcher thread
  calls them).
"""
from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from ..engine.request import RequestOutput, SamplingParams

OnOutput = Callable[[RequestOutput], None]
Submission = tuple[str, list[int], SamplingParams]  # (engine request id, prompt token ids, params)


class Counters(Protocol):
    """Totals since start that ``metrics.LLMMetrics.publish`` reads (``engine.stats.EngineStats`` has them)."""

    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    busy_seconds: float
    prefix_hit_tokens: int
    prefix_query_tokens: int
    draft_tokens: int
    accepted_draft_tokens: int


@runtime_checkable
class GeneratorBackend(Protocol):
    default_exclude_input: bool  # the model's exclude_input_in_output when a request does not say

    def start(self) -> "GeneratorBackend":
        """Starts generating (threads, the engine); called once, after the response path is up."""

    def submit_all(self, requests: list[Submission]) -> None:
        """Admits all or none; raises InvalidRequest / QueueFull (see the module docstring)."""

    def abort(self, request_id: str) -> None:
        """Ends the request (its final output has finish_reason "abort") and frees its KV cache."""

    def shutdown(self, timeout: float = 30.0) -> None:
        """Lets in-flight requests finish (up to ``timeout``), aborts the rest, then stops; every request
        has had its final output when this returns."""

    def load(self) -> tuple[int, int, float]:
        """(running requests, waiting requests, KV cache usage ratio); approximate."""

    @property
    def stats(self) -> Counters:
        """Monotonic totals for ``LLMMetrics``."""

    def iteration_stats(self) -> dict[str, object] | None:
        """The iteration-stats JSON NVIDIA's backend logs and reports (``metrics.iteration_stats`` keys,
        ``metrics.NVIDIA_GAUGES``) for the newest iteration, or None when none ran since the last call."""

    def describe(self) -> list[str]:
        """Facts for the start-up log line, e.g. ["build/models/demo", "device cpu", ...]."""


# A builder makes the (not yet started) backend of one model instance from Triton's initialize() args,
# the config's string parameters and the output callback.
BackendBuilder = Callable[[dict, dict[str, str], OnOutput], GeneratorBackend]
