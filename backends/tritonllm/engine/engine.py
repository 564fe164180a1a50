"""LLMEngine: validates and admits requests, runs one scheduling step at a time, reports deltas.

Single-threaded by design: only the owner thread (see runner.py) calls add/abort/step.
"""
from __future__ import annotations

import dataclasses
import random
import threading
import time
from concurrent.futures import Future

import numpy as np
import torch

from .config import EngineConfig
from .kv_cache import BlockPool, KVCache, kv_layout
from .kv_manager import KVCacheManager
from .kv_transfer import KVPrefix, export_prefix, import_prefix
from .loader import load_model
from .lora import LoraAdapter, LoraSet
from .lora_loader import LoraLoader
from .batch_layout import attention_meta
from .model import Transformer
from .pooling import Pooled
from .request import InvalidRequest, Request, RequestOutput, SamplingParams
from .sampler import device_bias, sample
from .speculative import may_draft, propose_ngram, verify_greedy, verify_sampled
from .scheduler import Scheduler
from .stats import EngineStats, IterationStats


def _available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 4 << 30


class LLMEngine:
    def __init__(self, model_dir: str, config: EngineConfig | None = None,
                 model: Transformer | None = None) -> None:
        self.config = config or EngineConfig()
        if self.config.num_threads > 0:
            torch.set_num_threads(self.config.num_threads)
        self.model = model or load_model(model_dir, self.config.device, self.config.dtype,
                                         fp8_weights=self.config.quantization == "fp8",
                                         fp8_matmul=self.config.fp8_matmul,
                                         cpu_kernels=self.config.cpu_kernels,
                                         quantization=self.config.quantization,
                                         quant_group_size=self.config.quant_group_size,
                                         activation_quantization=self.config.activation_quantization)
        spec = self.model.spec
        self.spec = spec
        self.lora = LoraSet.load(self.config.lora_adapters, spec, self.model.device, self.model.dtype,
                                 self.config.max_loras)
        self.lora_loader = LoraLoader(spec, self.config.lora_root)
        self.max_seq_len = min(self.config.max_seq_len or spec.max_position_embeddings,
                               spec.max_position_embeddings)
        self.max_input_len = min(self.config.max_input_len or self.max_seq_len, self.max_seq_len)
        bs = self.config.block_size
        kv_dtype, kv_width = kv_layout(self.config.kv_cache_dtype, self.model.dtype, spec.head_dim)
        self.kv_bytes_per_token = KVCache.bytes_per_token(spec.num_layers, spec.num_kv_heads, kv_width, kv_dtype)
        if self.config.max_kv_tokens:
            tokens = self.config.max_kv_tokens
        else:
            budget = int(_available_memory(self.model.device) * self.config.kv_mem_fraction)
            tokens = min(budget // self.kv_bytes_per_token, self.config.max_num_seqs * self.max_seq_len)
        num_blocks = max(tokens // bs, 1)
        self.pool = BlockPool(num_blocks)  # read here by tests only: everything else asks kv_manager
        self.kv_manager = KVCacheManager(self.pool, bs, self.config.enable_prefix_caching)
        self.kv = KVCache(spec.num_layers, num_blocks, bs, spec.num_kv_heads, kv_width, kv_dtype,
                          self.model.device)
        self.scheduler = Scheduler(self.config, self.kv_manager)
        self.drafter = None
        if self.config.draft_model_path and self.config.max_draft_len:
            from .draft_model import DraftModel

            draft = load_model(self.config.draft_model_path, self.config.device, self.config.dtype,
                               cpu_kernels=self.config.cpu_kernels,
                               activation_quantization=self.config.activation_quantization)
            extra = self.config.max_num_seqs * -(-self.config.max_draft_len // bs)  # lookahead slots
            self.drafter = DraftModel(draft, spec.vocab_size, num_blocks + extra, bs)
        self.requests = self.scheduler.requests  # id -> every request in the engine (the scheduler keeps it)
        self.stats = EngineStats()
        self.last_step = IterationStats(free_blocks=num_blocks)
        self._step_stats: IterationStats | None = None  # the running step's, until it has finished
        self._grammar = None
        self._grammar_lock = threading.Lock()
        self._model_dir = model_dir

    # ---- admission -------------------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raises InvalidRequest naming the input. Read-only, safe to call from any thread."""
        V = self.spec.vocab_size
        if not prompt_ids:
            raise InvalidRequest("prompt_ids is empty")
        bad = [t for t in prompt_ids if not 0 <= t < V]
        if bad:
            raise InvalidRequest(f"prompt_ids holds ids outside the vocabulary [0, {V}): {bad[:5]}")
        if len(prompt_ids) > self.max_input_len:
            raise InvalidRequest(f"prompt_ids has {len(prompt_ids)} tokens, max_input_len is {self.max_input_len}")
        params.verify()
        if params.embedding_bias is not None and params.embedding_bias.numel() > V:
            raise InvalidRequest(f"embedding_bias has {params.embedding_bias.numel()} entries, "
                                 f"more than the vocabulary ({V})")
        # numpy, not torch, on the caller's thread (runner.py: a second OpenMP team would slow every step)
        if (params.embedding_bias is not None and params.embedding_bias.numel() == V
                and np.isneginf(params.embedding_bias.detach().cpu().numpy()).all()):  # nothing left to sample: NaN
            raise InvalidRequest("embedding_bias bans every token (-inf everywhere)")
        total = len(prompt_ids) + (0 if params.pooling else params.max_tokens)
        if total > self.max_seq_len:
            raise InvalidRequest(f"prompt_ids length {len(prompt_ids)} + max_tokens {params.max_tokens} "
                                 f"exceeds max_seq_len {self.max_seq_len}")
        if total > self.kv_manager.num_blocks * self.config.block_size:
            raise InvalidRequest(f"prompt_ids length + max_tokens = {total} tokens exceeds the KV cache "
                                 f"({self.kv_manager.num_blocks * self.config.block_size} tokens)")
        if not self.config.enable_chunked_prefill and total > self.config.max_num_tokens:
            raise InvalidRequest(f"{total} tokens exceed max_num_tokens {self.config.max_num_tokens} "
                                 "and chunked context is disabled")
        if params.end_id is not None and not (params.end_id == -1 or 0 <= params.end_id < V):
            raise InvalidRequest(f"end_id {params.end_id} is outside the vocabulary")
        if params.lora_source is not None and params.lora_task_id not in self.lora.pinned:
            self.lora_loader.check(params.lora_task_id, params.lora_source)
        else:
            try:
                self.lora.validate(params.lora_task_id)
            except ValueError as e:
                raise InvalidRequest(str(e)) from None
        for name, words in (("stop_words", params.stop_words), ("bad_words", params.bad_words)):
            for w in words:
                if not w or any(not 0 <= t < V for t in w):
                    raise InvalidRequest(f"{name} holds an empty word or ids outside the vocabulary")

    def guide_future(self, params: SamplingParams) -> Future | None:
        """The request's grammar compiling on the grammar thread (a done Future when cached), or None without a
        guide; raises InvalidRequest at once for a guide refused before compiling (type, size). Any thread."""
        if params.guide is None:
            return None
        with self._grammar_lock:
            if self._grammar is None:
                from .grammar import GrammarBackend

                c = self.config
                self._grammar = GrammarBackend(c.tokenizer_dir or self._model_dir, self.spec.vocab_size,
                                               cache_bytes=c.guide_cache_bytes, max_guide_bytes=c.guide_max_bytes)
        return self._grammar.compile_async(*params.guide)

    def lora_future(self, params: SamplingParams) -> Future | None:
        """The request's run-time adapter loading (a Future of a LoraAdapter), or None when it names none or its id
        is a fixed adapter (``lora_adapters``: it serves, whatever the path says, as TensorRT-LLM serves a cached id).
        Answered at once by the adapter serving the id: for in-request weights always (TensorRT-LLM ignores weights
        sent again for a cached id), for a path when it came from that path (another path replaces it). Any thread."""
        source = params.lora_source
        if source is None or params.lora_task_id in self.lora.pinned:
            return None
        if self.config.max_loras < 1:
            raise InvalidRequest("lora_path / lora_weights: this engine loads no adapters at run time (max_loras 0)")
        label = self.lora_loader.check(params.lora_task_id, source)
        current = self.lora.get(params.lora_task_id)  # a read from another thread: at worst a needless load
        if current is not None and (source.path is None or current.source == label):
            done: Future = Future()
            done.set_result(current)
            return done
        return self.lora_loader.submit(params.lora_task_id, source)

    def install_lora(self, adapter: LoraAdapter) -> None:
        """Makes a run-time adapter servable (engine thread): InvalidRequest on an id conflict, QueueFull when every
        max_loras slot serves requests in flight. The prefix-cache blocks of adapters it replaces or evicts go."""
        busy = {r.params.lora_task_id for r in self.requests.values()}
        try:
            left = self.lora.install(adapter, busy, self.model.device, self.model.dtype)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        for gone in left:
            self.kv_manager.purge(gone.root)

    def compile_guide(self, params: SamplingParams):
        """The request's compiled grammar (waits for it); raises InvalidRequest if it does not compile."""
        future = self.guide_future(params)
        return None if future is None else future.result()

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    compiled=None) -> None:
        """``compiled``: the guide's grammar when the caller compiled it already (the runner does, off this
        thread); else it is compiled here."""
        if request_id in self.requests:
            raise InvalidRequest(f"request id {request_id!r} is already in flight")
        self.validate(prompt_ids, params)
        if compiled is None:
            compiled = self.compile_guide(params)
        gen = torch.Generator(device=self.model.device)
        gen.manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
        req = Request(request_id, list(prompt_ids), params, self.scheduler.clock(), generator=gen)
        try:
            req.lora_root = self.lora.root(params.lora_task_id)
        except ValueError as e:  # evicted between its load and its admission (or never loaded)
            raise InvalidRequest(str(e)) from None
        self.lora.touch(params.lora_task_id)
        if params.embedding_bias is not None:
            req.embedding_bias = device_bias(params.embedding_bias, self.spec.vocab_size, self.model.device)
        if compiled is not None:
            req.matcher = self._grammar.matcher(compiled)
        self.scheduler.add(req)
        self.stats.prompt_tokens += len(req.prompt_ids)

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.get(request_id)
        if req is None:
            return None
        self._drop(req)
        return self._final(req, "abort")

    def _final(self, req: Request, reason: str) -> RequestOutput:
        """The last output of a request ended from outside (abort, timeout): every token was already sent."""
        req.finish_reason = reason
        return RequestOutput(req.request_id, [], [], True, reason, req.num_prompt, req.num_emitted,
                             req.cum_logprob, metrics=dataclasses.replace(req.metrics))

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_preemptions(self) -> int:
        return self.stats.preemptions

    def load(self) -> tuple[int, int, float]:
        """(running, waiting, KV usage ratio); approximate when read from another thread."""
        used = 1.0 - self.kv_manager.num_free / self.kv_manager.num_blocks
        return len(self.scheduler.running), len(self.scheduler.waiting), used

    @property
    def num_free_blocks(self) -> int:
        return self.kv_manager.num_free

    # ---- KV across engines (Dynamo's disaggregation and router); engine thread only -------------------
    def export_prefix(self, prompt_ids: list[int], lora_task_id: int | None = None) -> KVPrefix:
        return export_prefix(self.kv_manager, self.kv, prompt_ids, self.lora.root(lora_task_id))

    def import_prefix(self, prompt_ids: list[int], prefix: KVPrefix, lora_task_id: int | None = None) -> int:
        return import_prefix(self.kv_manager, self.kv, prompt_ids, prefix, self.lora.root(lora_task_id))

    # ---- one iteration ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = time.monotonic()
        try:
            return self._step()
        finally:
            self.stats.busy_seconds += time.monotonic() - t0
            if self._step_stats is not None:
                self.last_step = dataclasses.replace(self._step_stats, free_blocks=self.kv_manager.num_free)
                self._step_stats = None

    def _step(self) -> list[RequestOutput]:
        outputs = []
        for req in self.scheduler.expired():  # TensorRT-LLM's TIMED_OUT, waiting or running
            self._drop(req)
            outputs.append(self._final(req, "timeout"))
        if self.config.max_draft_len:
            self._propose_drafts()
        sched = self.scheduler.schedule()
        self.stats.preemptions += len(sched.preempted)
        if not sched.items:
            return outputs
        self._count_step(sched)
        sampling, rows, meta, ids, pos, pooled = self._prepare(sched.items)
        logits, hidden = self.model.forward(ids, pos, meta, self.kv.k, self.kv.v, rows, pooled.tensor(ids.device))
        speculating = [req for req, _ in sched.items if req.draft]
        self.scheduler.update_from_output(sched.items)
        for req in pooled.add(hidden, self.model.head_logits):
            self._drop(req)
            outputs.append(pooled.output(req))
        self.stats.prefix_hit_tokens = self.scheduler.prefix_hits
        self.stats.prefix_query_tokens = self.scheduler.prefix_queries
        plain = len(sampling) - len(speculating)
        tokens, lps, tops = sample(logits[:plain], sampling[:plain], self._end_ids) if plain else ([], [], [])
        now = time.monotonic()
        for req, tok, lp, top in zip(sampling, tokens, lps, tops):
            if req.first_token_time is None:
                req.first_token_time = now
            out = self._append(req, tok, lp, top)
            if out is not None:
                outputs.append(out)
        row = plain
        for req in speculating:
            k = len(req.draft)
            outputs.extend(self._accept(req, logits[row:row + k + 1]))
            row += k + 1
        return outputs

    def _count_step(self, sched) -> None:
        context = [(req, n) for req, n in sched.items if req.num_computed < req.num_prompt]
        self.stats.iterations += 1
        self.stats.reused_blocks = self.scheduler.reused_blocks
        self._step_stats = IterationStats(
            iteration=self.stats.iterations, active_requests=len(self.requests),
            scheduled_requests=len(sched.items),
            context_requests=len(context), generation_requests=len(sched.items) - len(context),
            context_tokens=sum(min(n, req.num_prompt - req.num_computed) for req, n in context),
            paused_requests=len(sched.preempted))

    def _propose_drafts(self) -> None:
        eligible, rooms = [], []
        for req in self.scheduler.running:
            p = req.params
            req.draft = []
            if req.num_computed != len(req.token_ids) - 1 or not may_draft(req):
                continue
            room = min(self.config.max_draft_len, p.max_tokens - req.num_output - 1,
                       self.max_seq_len - len(req.token_ids) - 1)
            if room > 0:
                eligible.append(req)
                rooms.append(room)
        if self.drafter is not None:
            for req, draft in zip(eligible, self.drafter.propose(eligible, rooms)):
                req.draft = draft
        else:
            for req, room in zip(eligible, rooms):
                req.draft = propose_ngram(req.token_ids, room, self.config.ngram_max)

    def _accept(self, req: Request, logits: torch.Tensor) -> list[RequestOutput]:
        """Verifies a draft (greedy or rejection sampling, both lossless), appends the tokens one by one."""
        draft, req.draft = req.draft, []
        if req.params.greedy:
            new, target = verify_greedy(logits, draft)
            lps = [0.0] * len(new)
            if req.params.return_log_probs:
                lps = torch.log_softmax(logits[:len(new)], -1).gather(1, target[:, None]).squeeze(1).tolist()
        else:
            new, lps = verify_sampled(logits, draft, req.params, req.generator)
        self.stats.draft_tokens += len(draft)
        self.stats.accepted_draft_tokens += len(new) - 1
        req.metrics.draft_tokens += len(draft)
        req.metrics.accepted_draft_tokens += len(new) - 1
        if self.drafter is not None:
            self.drafter.accepted(req.request_id, len(new) - 1)
        req.num_computed += len(new)        # the last token + accepted drafts now have valid KV
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        outputs = []
        for tok, lp in zip(new, lps):
            out = self._append(req, tok, lp)
            if out is not None:
                outputs.append(out)
                if out.finished:
                    return outputs
        self.scheduler.cache_full_blocks(req)  # the accepted tokens are appended: their full blocks publish
        return outputs

    def _prepare(self, items):
        """Flat ids / positions of the step, the attention layout, and which logits rows to sample."""
        dev = self.model.device
        ids, pos, spans = [], [], []
        sampling, rows, spec_rows = [], [], []
        pooled = Pooled()
        adapter_spans: dict[int, list[tuple[int, int]]] = {}
        for req, n in items:
            start = len(ids)
            if req.params.lora_task_id is not None:
                adapter_spans.setdefault(req.params.lora_task_id, []).append((start, n))
            p0 = req.num_computed
            seq = req.token_ids + req.draft if req.draft else req.token_ids
            ids.extend(seq[p0:p0 + n])
            pos.extend(range(p0, p0 + n))
            spans.append((req.block_table, p0, n))
            scored = req.params.prompt_logprobs and req.prompt_lp is not None and p0 < req.num_prompt - 1
            if req.params.pooling or scored:
                pooled.schedule(req, start, p0, n)
            if req.params.pooling:
                continue  # prefill only: never samples
            if req.draft:
                spec_rows.extend(range(start + n - 1 - len(req.draft), start + n))
            elif p0 + n == len(req.token_ids):
                sampling.append(req)
                rows.append(start + n - 1)
        meta = attention_meta(spans, self.config.block_size, dev, self.spec.sliding_window)
        meta.lora = self.lora.segments(adapter_spans, len(ids), dev)
        # Drafting requests come last: logits rows are [plain samples..., (k+1) rows per draft...].
        sampling += [req for req, _ in items if req.draft]
        rows += spec_rows
        return (sampling, torch.tensor(rows, dtype=torch.long, device=dev), meta,
                torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), pooled)

    def _drop(self, req: Request) -> None:
        """A request leaves the engine (finished or aborted): its KV blocks and drafter blocks are freed."""
        self.scheduler.remove(req)
        if self.drafter is not None:
            self.drafter.release(req.request_id)

    def _end_ids(self, req: Request) -> frozenset[int]:
        e = req.params.end_id
        if e is None:
            return frozenset(self.spec.eos_token_ids)
        return frozenset() if e == -1 else frozenset((e,))

    def _append(self, req: Request, tok: int, lp: float,
                top: list[tuple[int, float]] | None = None) -> RequestOutput | None:
        """Records a sampled token; returns the new delta, with the finish reason when it ends.

        As in TensorRT-LLM, a matched stop word stays in the output (the text layer cuts stop strings
        exactly, including a leading space that belongs to the text before the stop string); EOS does not.
        """
        p = req.params
        reason = None
        req.metrics.last_token_ns = time.monotonic_ns()
        if not req.metrics.first_token_ns:
            req.metrics.first_token_ns = req.metrics.last_token_ns
        if tok in self._end_ids(req) and req.num_output >= p.min_tokens:
            reason = "stop"
        else:
            req.token_ids.append(tok)
            req.logprobs.append(lp)
            if p.top_logprobs:
                req.top_logprobs.append(top or [])
            out = req.output_ids
            stopped = any(len(out) >= len(w) and out[-len(w):] == w for w in p.stop_words)
            if stopped and req.num_output >= p.min_tokens:
                reason = "stop"
            elif req.matcher is not None and req.matcher.terminated:
                reason = "stop"
            elif req.num_output >= p.max_tokens or len(req.token_ids) >= self.max_seq_len:
                reason = "length"
        new = req.output_ids[req.num_emitted:]
        new_lp = req.logprobs[req.num_emitted:]
        new_top = req.top_logprobs[req.num_emitted:]
        self.stats.generation_tokens += len(new)
        req.num_emitted = req.num_output
        req.cum_logprob += sum(new_lp)
        if reason is not None:
            req.finish_reason = reason
            self._drop(req)
        scored = None
        if p.prompt_logprobs and req.prompt_lp is not None:  # the request's first output carries them, once
            scored, req.prompt_lp = req.prompt_lp, None
        return RequestOutput(req.request_id, new, new_lp, reason is not None, reason, req.num_prompt,
                             req.num_emitted, req.cum_logprob, metrics=dataclasses.replace(req.metrics),
                             new_top_logprobs=new_top, prompt_logprobs=scored)

