"""Our engine as an NVIDIA Dynamo worker: ``dynamo.common.backend.LLMEngine`` over ``EngineRunner``.

Dynamo's frontend tokenizes, routes, detokenizes and applies stop strings (Rust side); a worker gets
token ids with ``sampling_options`` / ``stop_conditions`` / ``output_options`` and streams token ids back
(read from ai-dynamo 1.6.1, ``dynamo/common/backend/engine.py`` and ``sample_engine.py``). The engine and
its knobs are the ones ``make serve`` uses (``deployment.yaml: models.tensorrt_llm.parameters``).

Invariants:
- Every option Dynamo passes that the engine supports is mapped (``request_params``); the others, when
  set to anything but their neutral value, are refused with ``InvalidArgument`` naming the option.
- ``abort`` (client gone, request cancelled) aborts the engine requests at once, which frees their KV
  blocks; the stream then ends with ``finish_reason: cancelled``.
- Dynamo's request priority (routing.priority) orders admission as TensorRT-LLM's priority does (``dynamo_priority``).
- ``n`` (OpenAI's, sampling_options.n) and guided decoding (sampling_options.guided_decoding: json, regex, choice,
  grammar) are served as Triton serves num_return_sequences and guided_decoding_guide: the same sequence rule
  (``lifecycle.Sequences``) and the same guide conversion (``guides.vllm_guide``).
- KV events: every block the prefix cache publishes is sent as *stored* (its tokens, chained to its
  parent), every cached block the pool reuses as *removed*, with our 128-bit block hash folded to the
  signed 64 bits Dynamo's publisher takes; the router hashes the tokens itself, so its index and ours
  agree by construction. Load snapshots (used / total blocks, hit rate) go out at ~10 Hz.
- Engine work stays on the runner thread; outputs cross to the asyncio loop by call_soon_threadsafe.
- Disaggregated roles (``--disaggregation-mode prefill|decode``, ``disagg.py``): a prefill worker runs one
  token and offers the prompt's KV blocks; a decode worker reads them into its prefix cache before it admits
  the request. Usage on the decode side reports the prefill worker's cached tokens, as Dynamo's vLLM worker
  does.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import queue
import threading
from typing import Any

from ..engine.engine import LLMEngine as OurEngine
from ..engine.kv_transfer import KVPrefix
from ..engine.request import InvalidRequest, QueueFull, RequestOutput, SamplingParams
from ..errors import InvalidInput
from ..contract import MAX_RETURN_SEQUENCES
from ..guides import vllm_guide
from ..engine.runner import EngineRunner
from ..lifecycle import ClientRequest, Live, Sequences
from ..model_files import hf_folder
from .disagg import KVHandoff
from .settings import engine_settings

log = logging.getLogger(__name__)
FINISH = {"stop": "stop", "length": "length", "abort": "cancelled", "timeout": "length"}
# Dynamo sampling / stop options with no counterpart here, and their neutral values.
UNSUPPORTED = {"best_of": (None, 1), "use_beam_search": (None, False), "min_p": (None, 0.0),
               "length_penalty": (None, 1.0), "max_thinking_tokens": (None,)}
# sampling_options.guided_decoding keys (Dynamo's, as its vLLM worker reads them) that change nothing here
GUIDE_NEUTRAL = {"backend", "whitespace_pattern"}


def top_logprobs_wire(tops: list[list[tuple[int, float]]]) -> list[list[dict]]:
    """Dynamo's wire form of the alternatives (``dynamo.common.backend.logprobs``: per token a list of
    {rank, token_id, token, logprob}); token text is left to the frontend, which holds the tokenizer."""
    return [[{"rank": r + 1, "token_id": t, "token": None, "logprob": lp} for r, (t, lp) in enumerate(alts)]
            for alts in tops]


def request_params(request: dict) -> SamplingParams:
    """Dynamo's request options -> our SamplingParams (InvalidRequest naming a refused option)."""
    so = request.get("sampling_options") or {}
    sc = request.get("stop_conditions") or {}
    oo = request.get("output_options") or {}
    for group in (so, sc):
        for name, neutral in UNSUPPORTED.items():
            if name in group and group[name] not in neutral:
                raise InvalidRequest(f"{name}={group[name]!r} is not supported by this engine")
    if oo.get("prompt_logprobs") not in (None, 0, False):
        raise InvalidRequest("prompt_logprobs are not supported (log probs of the generated tokens are)")
    p = SamplingParams(max_tokens=int(sc.get("max_tokens") or 16))

    def take(src: dict, key: str, attr: str, conv) -> None:
        if src.get(key) is not None:
            setattr(p, attr, conv(src[key]))

    take(so, "temperature", "temperature", float)
    take(so, "top_p", "top_p", float)
    take(so, "top_k", "top_k", lambda v: max(int(v), 0))  # -1 (vLLM's "off") is our 0
    take(so, "repetition_penalty", "repetition_penalty", float)
    take(so, "presence_penalty", "presence_penalty", float)
    take(so, "frequency_penalty", "frequency_penalty", float)
    take(so, "seed", "seed", int)
    take(sc, "min_tokens", "min_tokens", int)
    guided = so.get("guided_decoding")
    if guided:  # json / regex / choice / grammar, as the OpenAI server maps vLLM's guided_* extras
        if not isinstance(guided, dict):
            raise InvalidRequest("guided_decoding must be an object")
        p.guide = vllm_guide(**{k: v for k, v in guided.items() if k not in GUIDE_NEUTRAL})
    priority = (request.get("routing") or {}).get("priority")
    if priority is not None:
        p.priority = dynamo_priority(priority)
    if sc.get("ignore_eos"):
        p.end_id = -1
    # EOS ids arrive here too; other hidden stop ids become one-token stop words.
    p.stop_words = [[int(t)] for t in sc.get("stop_token_ids_hidden") or []]
    p.return_log_probs = oo.get("logprobs") is not None
    p.top_logprobs = int(oo.get("logprobs") or 0)  # Dynamo's count of alternatives (OpenAI's top_logprobs)
    p.verify()  # refused here, naming the field, before the request reaches the engine thread
    return p


def dynamo_priority(value) -> float:
    """Dynamo's request priority (``nvext.agent_hints.priority`` -> ``routing.priority``: an int32, higher served
    first, 0 by default; its vLLM worker negates it for vLLM's lower-first queue) onto TensorRT-LLM's [0, 1], higher
    admitted first, 0.5 by default: 0.5 + atan(p) / pi keeps every order between two values and maps 0 to 0.5."""
    if isinstance(value, bool) or not isinstance(value, int) or not -2**31 <= value < 2**31:
        raise InvalidRequest(f"priority must be a 32-bit integer, got {value!r}")
    return 0.5 + math.atan(value) / math.pi


def sequence_count(request: dict) -> int:
    """OpenAI's n as Dynamo passes it (sampling_options.n), checked as the Triton contract checks
    num_return_sequences."""
    n = (request.get("sampling_options") or {}).get("n") or 1
    if not isinstance(n, int) or not 1 <= n <= MAX_RETURN_SEQUENCES:
        raise InvalidRequest(f"n must be an integer in [1, {MAX_RETURN_SEQUENCES}], got {n!r}")
    return n


def fold64(h: int | None) -> int | None:
    """Our 128-bit block hash as the signed 64-bit value Dynamo's KvEventPublisher takes."""
    if h is None:
        return None
    v = h & 0xFFFF_FFFF_FFFF_FFFF
    return v - (1 << 64) if v >= 1 << 63 else v


class DynamoWorker:
    """Built by ``dynamo_engine_class()`` as a subclass of Dynamo's LLMEngine (imported lazily, so this
    module imports without Dynamo installed)."""

    def __init__(self, model_path: str, served_name: str, config, mode: str = "agg") -> None:
        self.model_path, self.served_name, self.config, self.mode = model_path, served_name, config, mode
        self.handoff = KVHandoff() if mode in ("prefill", "decode") else None
        self._prefills: dict[str, tuple[list[int], int | None]] = {}  # prefill role: rid -> (prompt, LoRA)
        self._exports: dict[str, KVPrefix] = {}
        self.engine: OurEngine | None = None
        self.runner: EngineRunner | None = None
        self._streams: dict[str, asyncio.Queue] = {}  # engine id -> its request's queue
        self._live = Live()  # Dynamo requests streaming now (client_id: Dynamo's id; sender: their Sequences)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._snapshots = None

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self, worker_id: int):
        from dynamo.common.backend import EngineConfig, LlmRegistration

        del worker_id
        self._loop = asyncio.get_running_loop()
        if self.handoff is not None and not self.config.enable_prefix_caching:
            raise ValueError(f"--disaggregation-mode {self.mode} needs enable_kv_cache_reuse: true (the decode "
                             "worker installs the prefill worker's KV as cached prefix blocks)")
        def build() -> OurEngine:  # on the runner thread (runner.py: one thread for the engine's torch work)
            engine = OurEngine(self.model_path, self.config)
            engine.kv_manager.subscribe(self._events.put)  # KV events, on the engine thread
            return engine

        self.runner = await self._loop.run_in_executor(None, EngineRunner.launch, build, self._on_output)
        self.engine = self.runner.engine
        if self.handoff is not None:
            await self.handoff.start()
        c = self.engine.config
        return EngineConfig(model=str(hf_folder(self.model_path)), served_model_name=self.served_name, llm=LlmRegistration(
            context_length=self.engine.max_seq_len, kv_cache_block_size=c.block_size,
            total_kv_blocks=self.engine.kv_manager.num_blocks, max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_tokens))

    async def cleanup(self) -> None:
        self._stop.set()
        if self.handoff is not None:
            self.handoff.stop()
        if self.runner is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.runner.shutdown, 10.0)
        if self._thread is not None:
            self._thread.join(2.0)

    # ---- requests ----------------------------------------------------------------------------
    def _on_output(self, out: RequestOutput) -> None:
        job = self._prefills.pop(out.request_id, None) if out.finished else None
        if job is not None and out.error is None and out.finish_reason != "abort":  # engine thread: still cached
            self._exports[out.request_id] = self.engine.export_prefix(job[0], job[1])
        q = self._streams.get(out.request_id)
        if q is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(q.put_nowait, out)

    async def generate(self, request: dict, context):
        """One Dynamo request: ``n`` sequences (lifecycle.Sequences, as Triton's num_return_sequences), streamed
        as chunks with their ``index``; each sequence's last chunk carries its finish_reason and the usage so far
        (the prompt once, every sequence's completion tokens), and the stream ends after the last sequence."""
        from dynamo.llm.exceptions import InvalidArgument, Unknown

        rid = context.id()
        prompt = list(request.get("token_ids") or [])
        seqs, live = None, None
        try:
            params = request_params(request)
            n = 1 if self.mode == "prefill" else sequence_count(request)  # a prefill worker computes the prompt once
            eos = set(self.engine.spec.eos_token_ids)  # the engine stops on these itself
            params.stop_words = [w for w in params.stop_words if w[0] not in eos]
            prefill_result = request.get("prefill_result") if self.mode == "decode" else None
            if self.mode == "prefill":
                params.max_tokens, params.min_tokens = 1, min(params.min_tokens or 0, 1)
                self._prefills[rid] = (prompt, params.lora_task_id)
            elif prefill_result is not None:
                await self._import(prompt, params, prefill_result)
            names = iter([rid] if n == 1 else [f"{rid}/{i}" for i in range(n)])
            seqs = Sequences.of(params, n, lambda: next(names))
            q: asyncio.Queue = asyncio.Queue()
            for eid in seqs.ids:
                self._streams[eid] = q
            live = ClientRequest(seqs, rid)  # the last end is Sequences.end's to tell
            self._live.add(live)
            self.runner.submit_all(seqs.submissions(prompt))
        except (InvalidInput, QueueFull) as e:  # InvalidRequest is an InvalidInput
            for eid in (seqs.ids if seqs else []):
                self._streams.pop(eid, None)
            if live is not None:
                self._live.close(live)
            self._prefills.pop(rid, None)
            raise (InvalidArgument if isinstance(e, InvalidInput) else Unknown)(str(e)) from None
        completion, ends = [0] * n, []
        try:
            while True:
                out: RequestOutput = await q.get()
                if out.error is not None:
                    raise Unknown(f"engine: {out.error}")
                index = seqs.index(out.request_id)
                chunk: dict[str, Any] = {"token_ids": list(out.new_token_ids), "index": index}
                if params.return_log_probs:
                    chunk["log_probs"] = [float(x) for x in out.new_logprobs]
                if params.top_logprobs:
                    chunk["top_logprobs"] = top_logprobs_wire(out.new_top_logprobs)
                if out.finished:
                    last, reason = seqs.end(out.request_id), FINISH.get(out.finish_reason or "stop", "stop")
                    completion[index] = out.num_output_tokens
                    if n > 1:  # Dynamo's frontend reads no tokens after the first finish it sees (any choice):
                        if chunk["token_ids"]:  # every choice's tokens go first, the finishes at the end
                            yield chunk
                        chunk = {"token_ids": [], "index": index}
                    if not last:
                        ends.append({**chunk, "finish_reason": reason})
                        continue
                    chunk["finish_reason"] = reason
                    chunk["completion_usage"] = self._usage(out, sum(completion), prefill_result)
                    if self.mode == "prefill":
                        chunk["disaggregated_params"] = await self.handoff.offer(self._exports.pop(rid, None))
                    for end in ends:
                        yield end
                    yield chunk
                    return
                elif chunk["token_ids"]:
                    yield chunk
        finally:
            for eid in seqs.ids:
                self._streams.pop(eid, None)
            self._live.close(live)
            self._exports.pop(rid, None)
            if self.runner is not None:
                for eid in seqs.unfinished():  # the client left mid-stream: free the KV blocks now
                    self.runner.abort(eid)

    def _usage(self, out: RequestOutput, completion_tokens: int, prefill_result: dict | None) -> dict:
        usage = {"prompt_tokens": out.num_prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": out.num_prompt_tokens + completion_tokens}
        if prefill_result is not None and prefill_result.get("prompt_tokens_details"):
            usage["prompt_tokens_details"] = prefill_result["prompt_tokens_details"]
        elif out.metrics is not None:  # OpenAI's usage.prompt_tokens_details: our prefix-cache hits
            cached = out.metrics.kv_reused_blocks * self.engine.config.block_size
            usage["prompt_tokens_details"] = {"cached_tokens": min(cached, out.num_prompt_tokens)}
        return usage

    async def _import(self, prompt: list[int], params: SamplingParams, prefill_result: dict) -> None:
        """Decode role: the prefill worker's KV into our prefix cache, before the request is admitted."""
        prefix = await self.handoff.fetch(prefill_result)
        if prefix is None:
            return
        fut = self.runner.call(lambda e: e.import_prefix(prompt, prefix, params.lora_task_id))
        try:
            self.handoff.imported_blocks += await asyncio.wrap_future(fut)
        except ValueError as e:  # another layout (a different model or KV dtype): computed here
            self.handoff.failed += 1
            log.warning("KV handoff not installed: %s", e)

    async def abort(self, context) -> None:
        if self.runner is None:
            return
        for live in self._live.with_id(context.id(), cancel=True):
            for eid in live.sender.unfinished():
                self.runner.abort(eid)

    # ---- KV events and load --------------------------------------------------------------------
    async def kv_event_sources(self):
        from dynamo.common.backend.publisher import PushSource

        return [PushSource(on_ready=self._start_publisher, dp_rank=0)]

    def component_metrics_dp_ranks(self) -> list[int]:
        return [0]

    def attach_snapshot_publisher(self, publisher) -> None:
        self._snapshots = publisher

    def _start_publisher(self, publisher) -> None:
        self._thread = threading.Thread(target=self._publish, args=(publisher,), daemon=True, name="kv-events")
        self._thread.start()

    def _publish(self, publisher) -> None:
        from dynamo.common.backend.publisher import ComponentSnapshot

        bs = self.engine.config.block_size
        while not self._stop.is_set():
            try:
                event = self._events.get(timeout=0.1)
            except queue.Empty:
                if self._snapshots is not None:
                    kv, stats = self.engine.kv_manager, self.engine.stats
                    used = kv.num_blocks - kv.num_free
                    hit = stats.prefix_hit_tokens / stats.prefix_query_tokens if stats.prefix_query_tokens else None
                    self._snapshots.publish(0, ComponentSnapshot(
                        kv_used_blocks=used, kv_total_blocks=kv.num_blocks,
                        gpu_cache_usage=used / kv.num_blocks, dp_rank=0, kv_cache_hit_rate=hit))
                continue
            try:
                if event[0] == "stored":
                    _, h, parent, tokens = event
                    publisher.publish_stored(token_ids=list(tokens), num_block_tokens=[bs],
                                             block_hashes=[fold64(h)], parent_hash=fold64(parent))
                else:
                    publisher.publish_removed(block_hashes=[fold64(event[1])])
            except Exception:  # a dropped event costs routing quality, never a request
                log.exception("KV event %s not published", event[0])


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description="Our engine as a Dynamo worker")
    ap.add_argument("--deployment", default=None, help="deployment.yaml (default: the repository's)")
    ap.add_argument("--model-path", default=None, help="HF checkpoint (default: llm.gpt_model_path)")
    ap.add_argument("--served-model-name", default=None, help="name in the OpenAI API (default: the folder's name)")
    # Dynamo's operator sets DYN_NAMESPACE / DYN_DISCOVERY_BACKEND in its pods; locally: ours, file discovery.
    ap.add_argument("--namespace", default=os.environ.get("DYN_NAMESPACE", "tritonllm"))
    ap.add_argument("--disaggregation-mode", choices=("agg", "prefill", "decode"), default="agg",
                    help="Dynamo's disaggregated roles: agg (prefill and decode here), prefill, decode")
    ap.add_argument("--component", default=None, help="default: prefill for prefill workers, else backend")
    ap.add_argument("--endpoint", default="generate")
    ap.add_argument("--discovery-backend", default=os.environ.get("DYN_DISCOVERY_BACKEND", "file"))
    ap.add_argument("--num-threads", type=int, default=0, help="torch threads (0: the deployment's)")
    ap.add_argument("--no-kv-events", action="store_true", help="do not publish KV events (round-robin only)")
    return ap.parse_args(argv)


def dynamo_engine_class():
    """DynamoWorker mixed into Dynamo's LLMEngine ABC (Dynamo is imported here, not at module top)."""
    from dynamo.common.backend import LLMEngine, WorkerConfig
    from dynamo.common.constants import DisaggregationMode

    class Engine(DynamoWorker, LLMEngine):
        @classmethod
        async def from_args(cls, argv=None):
            args = parse_args(argv)
            model_path, served, config = engine_settings(args.deployment, args.model_path, args.num_threads)
            served = args.served_model_name or served
            engine = cls(model_path, served, config, args.disaggregation_mode)
            component = args.component or ("prefill" if args.disaggregation_mode == "prefill" else "backend")
            return engine, WorkerConfig(
                namespace=args.namespace, component=component, endpoint=args.endpoint,
                model_name=str(hf_folder(model_path)), served_model_name=served,
                discovery_backend=args.discovery_backend,
                enable_kv_routing=not args.no_kv_events,
                disaggregation_mode=DisaggregationMode(args.disaggregation_mode))

    return Engine


def main() -> None:
    from dynamo.common.backend.run import run

    run(dynamo_engine_class())
