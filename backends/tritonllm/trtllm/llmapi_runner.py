"""TensorRT-LLM's LLM API (``tensorrt_llm.LLM``, PyTorch backend) as a generator backend of ``tensorrt_llm``.

Token ids in, token ids out: ``generate_async(prompt_ids, sampling_params=..., lora_request=None,
streaming=True)`` (keyword arguments: positional ``streaming`` would land in ``lora_request``, the bug NVIDIA's
own Triton model once had), each update iterated on one asyncio loop thread and turned into our
``RequestOutput`` deltas (``llmapi_outputs.Stream``). Inflight batching, paged KV (FP8 if configured), KV
reuse and chunked prefill are TensorRT-LLM's.

``tensorrt_llm`` is imported in ``start()`` only (never at module top: the development machines cannot
install it), and every name of it used here is in ``names.TABLE``.

Invariants (those of ``serving.generator.GeneratorBackend``, plus):
- ``submit_all`` validates and builds every ``SamplingParams`` in the caller's thread, then starts the whole
  batch on the loop and waits for it: a request TensorRT-LLM refuses (``ValueError``) fails at once as
  InvalidRequest and the batch's other requests are aborted; more than ``max_batch_size +
  max_queue_size`` unfinished requests -> QueueFull, with EngineRunner's message;
- refused here, naming the input: guided decoding, ``lora_task_id``, multi-token ``bad_words_list`` words
  (the LLM API takes bad words as single token ids or as text); beam_width / num_return_sequences > 1
  are refused by ``llm_io`` before any backend sees them;
- ``abort`` calls ``result.abort()`` (TensorRT-LLM frees the KV blocks) and sends the final output at once
  (finish_reason "abort", the tokens produced so far), as our engine does; later updates of that request
  are dropped; an abort that arrives before the request started is applied when it starts;
- only the loop thread touches ``GenerationResult`` objects; counters and the registry are guarded by
  one lock; iteration stats are polled with ``LLM.get_stats`` on a thread of their own, only once a
  request was submitted (before that TensorRT-LLM only warns).
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading

from ..engine.request import InvalidRequest, QueueFull, SamplingParams, admit
from ..engine.stats import EngineStats
from . import names as N
from .llmapi_outputs import Stream, nvidia_iteration_stats

log = logging.getLogger(__name__)


def sampling_kwargs(p: SamplingParams) -> tuple[dict, list[list[int]]]:
    """Our SamplingParams -> (``tensorrt_llm.SamplingParams`` kwargs, multi-token stop words matched by us).
    Unset values are left out, so TensorRT-LLM's defaults apply (greedy: ``top_k=1``)."""
    kw: dict = {"max_tokens": p.max_tokens, "exclude_input_from_output": True, "detokenize": False,
                "return_perf_metrics": True, "include_stop_str_in_output": True}
    if p.greedy:
        kw["top_k"] = 1
    else:
        kw["temperature"] = p.temperature
        if p.top_k > 0:
            kw["top_k"] = p.top_k
        if 0.0 < p.top_p <= 1.0:
            kw["top_p"] = p.top_p
    if p.repetition_penalty != 1.0:
        kw["repetition_penalty"] = p.repetition_penalty
    if p.presence_penalty != 0.0:
        kw["presence_penalty"] = p.presence_penalty
    if p.frequency_penalty != 0.0:
        kw["frequency_penalty"] = p.frequency_penalty
    if p.min_tokens > 0:
        kw["min_tokens"] = p.min_tokens
    if p.seed is not None:
        kw["seed"] = p.seed
    if p.end_id == -1:
        kw["ignore_eos"] = True
    elif p.end_id is not None:
        kw["end_id"] = p.end_id
    single = [w[0] for w in p.stop_words if len(w) == 1]
    if single:
        kw["stop_token_ids"] = single
    if p.bad_words:
        kw["bad_token_ids"] = [w[0] for w in p.bad_words]
    if p.return_log_probs:
        kw["logprobs"] = 1
    return N.kwargs("SamplingParams", kw), [w for w in p.stop_words if len(w) > 1]


def validate(prompt_ids: list[int], p: SamplingParams, max_seq_len: int | None) -> None:
    """What we refuse before TensorRT-LLM sees it (messages as our engine's, naming the input)."""
    if not prompt_ids:
        raise InvalidRequest("prompt_ids is empty")
    if any(t < 0 for t in prompt_ids):
        raise InvalidRequest(f"prompt_ids holds negative ids: {[t for t in prompt_ids if t < 0][:5]}")
    p.verify()
    if max_seq_len and len(prompt_ids) + p.max_tokens > max_seq_len:
        raise InvalidRequest(f"prompt_ids length {len(prompt_ids)} + max_tokens {p.max_tokens} "
                             f"exceeds max_seq_len {max_seq_len}")
    for name, words in (("stop_words", p.stop_words), ("bad_words", p.bad_words)):
        if any(not w or any(t < 0 for t in w) for w in words):
            raise InvalidRequest(f"{name} holds an empty word or ids outside the vocabulary")
    if any(len(w) > 1 for w in p.bad_words):
        raise InvalidRequest("bad_words: words of more than one token are not supported with TensorRT-LLM's "
                             "LLM API (it takes bad words as single token ids)")
    if p.guide is not None:
        raise InvalidRequest("guide: guided decoding is not supported by the llmapi profile")
    if p.lora_task_id is not None:
        raise InvalidRequest(f"lora_task_id {p.lora_task_id}: LoRA adapters are not supported by the llmapi profile")
    # Our engine's request options, not mapped onto TensorRT-LLM's LLM API here (yet): refused, not ignored.
    for name, given in (("embedding_bias", p.embedding_bias is not None), ("top_logprobs", p.top_logprobs > 0),
                        ("priority", p.priority != 0.5), ("allotted_time_ms", p.allotted_time_ms is not None)):
        if given:
            raise InvalidRequest(f"{name}: not supported by the llmapi profile")


class LLMAPIRunner:
    """One ``tensorrt_llm.LLM`` serving one model instance (see the module docstring)."""

    def __init__(self, llm_args: dict, on_output, *, max_queue_size: int = 1024, default_exclude_input: bool = True,
                 stats_period: float = 0.1) -> None:
        self.llm_args = N.kwargs("LLM", dict(llm_args))
        self.on_output = on_output
        self.default_exclude_input = default_exclude_input
        self.max_queue_size = max_queue_size
        self.max_batch_size = int(llm_args.get("max_batch_size") or 2048)  # TensorRT-LLM's default
        self.capacity = self.max_batch_size + max_queue_size
        self.stats_period = stats_period
        self.llm = None
        self._sampling_params_cls = None
        self._lock = threading.Condition()
        self._unfinished: set[str] = set()
        self._streams: dict[str, Stream] = {}  # loop thread only
        self._early_aborts: set[str] = set()   # loop thread only
        self._closing = False
        self._submitted = False
        self._counters = EngineStats()
        self._latest: dict | None = None
        self._reported_iter: object = None
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="llmapi-loop", daemon=True)
        self._stats_stop = threading.Event()
        self._stats_thread = threading.Thread(target=self._poll_stats, name="llmapi-stats", daemon=True)

    # ---- life cycle ------------------------------------------------------------------------------
    def start(self) -> "LLMAPIRunner":
        llm_cls = N.module("import tensorrt_llm", "LLM")
        self._sampling_params_cls = N.module("import tensorrt_llm", "SamplingParams")
        args = dict(self.llm_args)
        if isinstance(args.get("kv_cache_config"), dict):
            kv_cls = N.module("import tensorrt_llm.llmapi", "KvCacheConfig")
            args["kv_cache_config"] = kv_cls(**N.kwargs("KvCacheConfig", args["kv_cache_config"]))
        self.llm = llm_cls(**args)
        self._loop_thread.start()
        self._stats_thread.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._closing = True
            self._lock.wait_for(lambda: not self._unfinished, timeout)
            left = list(self._unfinished)
        for rid in left:
            self.abort(rid)
        with self._lock:
            self._lock.wait_for(lambda: not self._unfinished, 5.0)
        self._stats_stop.set()
        if self._loop_thread.is_alive():
            try:  # TensorRT-LLM sent no final for these: answer them ourselves
                asyncio.run_coroutine_threadsafe(self._finish_all(), self._loop).result(5.0)
            except Exception:
                log.exception("llmapi: could not finish the remaining requests")
        if self.llm is not None:
            N.attr(self.llm, "LLM method", "shutdown")()
        if self._loop_thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(5.0)
        if self._stats_thread.is_alive():
            self._stats_thread.join(2.0)

    # ---- admission -------------------------------------------------------------------------------
    def submit_all(self, requests: list[tuple[str, list[int], SamplingParams]]) -> None:
        max_seq_len = self.llm_args.get("max_seq_len")
        prepared = []
        for rid, prompt_ids, params in requests:
            validate(prompt_ids, params, max_seq_len)
            kw, multi_stops = sampling_kwargs(params)
            try:
                sp = self._sampling_params_cls(**kw)
            except ValueError as e:  # TensorRT-LLM's own checks (SamplingParams._validate)
                raise InvalidRequest(f"sampling parameters refused by TensorRT-LLM: {e}") from None
            prepared.append((Stream(rid, len(prompt_ids), params, multi_stops=multi_stops), list(prompt_ids), sp))
        with self._lock:
            if self._closing:
                raise QueueFull("the engine is shutting down")
            admit(self._unfinished, [rid for rid, _, _ in requests], self.capacity, self.max_queue_size,
                  self.max_batch_size)
            self._unfinished.update(rid for rid, _, _ in requests)
            self._submitted = True
        try:
            asyncio.run_coroutine_threadsafe(self._start_all(prepared), self._loop).result(60.0)
        except BaseException:
            with self._lock:  # those started are aborted and send their final; the rest never started
                self._unfinished.difference_update(s.rid for s, _, _ in prepared if s.result is None)
                self._lock.notify_all()
            raise
        with self._lock:
            self._counters.prompt_tokens += sum(len(p) for _, p, _ in prepared)

    async def _start_all(self, prepared) -> None:
        generate = N.attr(self.llm, "LLM method", "generate_async")
        started: list[Stream] = []
        for stream, prompt_ids, sp in prepared:
            try:
                stream.result = generate(prompt_ids, **N.kwargs("generate_async", {
                    "sampling_params": sp, "lora_request": None, "streaming": True}))
            except (ValueError, TypeError) as e:
                for s in started:
                    self._abort_stream(s)
                raise InvalidRequest(f"refused by TensorRT-LLM: {e}") from None
            except Exception:
                for s in started:
                    self._abort_stream(s)
                raise
            stream.end_id = N.attr(sp, "SamplingParams", "end_id")  # TensorRT-LLM fills it in (tokenizer EOS)
            self._streams[stream.rid] = stream
            started.append(stream)
            stream.task = self._loop.create_task(self._consume(stream))
        for s in started:
            if s.rid in self._early_aborts:
                self._early_aborts.discard(s.rid)
                self._abort_stream(s)

    # ---- the loop thread -------------------------------------------------------------------------
    async def _consume(self, stream: Stream) -> None:
        try:
            async for update in stream.result:
                outputs = N.attr(update, "RequestOutput", "outputs") or []
                finished = bool(N.attr(update, "RequestOutput", "finished", False))
                out = stream.convert(outputs[0], finished) if outputs else None
                if out is None and finished:
                    out = stream.final("abort" if stream.aborted else "stop")
                if out is not None:
                    self._emit(out)
                if stream.stop_matched:
                    self._abort_stream(stream)
                if stream.done:
                    break
        except asyncio.CancelledError:  # aborted: its final output went out already
            pass
        except Exception as e:
            if not stream.done:
                log.error("llmapi: request %s failed: %s", stream.rid, e)
                self._emit(stream.final("error", f"TensorRT-LLM generation failed: {e}"))
        finally:
            if not stream.done:
                self._emit(stream.final("abort"))
            self._streams.pop(stream.rid, None)

    def _abort_stream(self, stream: Stream) -> None:
        """``result.abort()`` (TensorRT-LLM frees the request's KV blocks) and, as our engine does, the final
        output at once with what was produced: the client never waits for TensorRT-LLM's cancelled reply."""
        if stream.aborted or stream.result is None:
            return
        stream.aborted = True
        try:
            N.attr(stream.result, "RequestOutput", "abort")()
        except Exception as e:  # the request may have just finished
            log.warning("llmapi: abort of %s failed: %s", stream.rid, e)
        if not stream.done:
            self._emit(stream.final("abort"))
        task = stream.task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()

    def _abort_rid(self, rid: str) -> None:
        stream = self._streams.get(rid)
        if stream is not None:
            if not stream.done:
                self._abort_stream(stream)
            return
        with self._lock:
            pending = rid in self._unfinished
        if pending:  # admitted, not started yet: abort it when it starts
            self._early_aborts.add(rid)

    async def _finish_all(self) -> None:
        for stream in list(self._streams.values()):
            if not stream.done:
                self._emit(stream.final("abort"))

    def _emit(self, out) -> None:
        with self._lock:
            self._counters.generation_tokens += len(out.new_token_ids)
            if out.finished:
                self._unfinished.discard(out.request_id)
                m = out.metrics
                if m is not None:
                    self._counters.draft_tokens += m.draft_tokens
                    self._counters.accepted_draft_tokens += m.accepted_draft_tokens
                    tpb = int(N.key(self._latest or {}, "kvCacheStats.tokensPerBlock", 0))
                    if tpb and out.error is None:
                        self._counters.prefix_query_tokens += out.num_prompt_tokens
                        self._counters.prefix_hit_tokens += min(m.kv_reused_blocks * tpb, out.num_prompt_tokens)
                self._lock.notify_all()
        try:
            self.on_output(out)
        except Exception:  # a broken callback must not kill the loop
            log.exception("output callback failed for %s", out.request_id)

    # ---- any thread ------------------------------------------------------------------------------
    def abort(self, request_id: str) -> None:
        if self._loop_thread.is_alive():
            self._loop.call_soon_threadsafe(self._abort_rid, request_id)

    def num_unfinished(self) -> int:
        with self._lock:
            return len(self._unfinished)

    def load(self) -> tuple[int, int, float]:
        with self._lock:
            latest, unfinished = self._latest, len(self._unfinished)
        if latest is None:
            return unfinished, 0, 0.0
        max_blocks = int(N.key(latest, "kvCacheStats.maxNumBlocks"))
        used = int(N.key(latest, "kvCacheStats.usedNumBlocks"))
        return (int(N.key(latest, "numActiveRequests")), int(N.key(latest, "numQueuedRequests")),
                used / max_blocks if max_blocks else 0.0)

    @property
    def stats(self) -> EngineStats:
        return self._counters

    def iteration_stats(self) -> dict[str, object] | None:
        with self._lock:
            latest = self._latest
            if latest is None or N.key(latest, "iter", None) == self._reported_iter:
                return None
            self._reported_iter = N.key(latest, "iter", None)
        return nvidia_iteration_stats(latest)

    def describe(self) -> list[str]:
        a = self.llm_args
        return [str(a.get("model")), f"TensorRT-LLM LLM API, backend {a.get('backend', 'pytorch')}",
                f"tp {a.get('tensor_parallel_size', 1)} x pp {a.get('pipeline_parallel_size', 1)}",
                f"max_batch_size {self.max_batch_size}"]

    def _poll_stats(self) -> None:
        get_stats = N.attr(self.llm, "LLM method", "get_stats")
        while not self._stats_stop.wait(self.stats_period):
            with self._lock:
                if not self._submitted:
                    continue
            try:
                entries = get_stats(**N.kwargs("get_stats", {"timeout": self.stats_period})) or []
            except Exception as e:
                log.debug("llmapi: get_stats failed: %s", e)
                continue
            entries = [json.loads(e) if isinstance(e, (str, bytes)) else e for e in entries]
            entries = [e for e in entries if isinstance(e, dict)]
            if not entries:
                continue
            with self._lock:
                c = self._counters
                for e in entries:
                    c.iterations += 1
                    c.busy_seconds += float(N.key(e, "iterLatencyMS")) / 1000.0
                    c.preemptions += int(N.key(e, "inflightBatchingStats.numPausedRequests"))
                c.reused_blocks = int(N.key(entries[-1], "kvCacheStats.reusedBlocks"))
                self._latest = entries[-1]
