"""Engine outputs -> the responses of the `tensorrt_llm` model, as plain data (no Triton imports).

A ``Job`` is one Triton request: its response sender (opaque here), its Triton request id (for NVIDIA's
``stop`` requests) and one ``Row`` per batch row, each an engine request. ``Jobs`` keeps them by engine
request id and turns each engine output into ``Reply`` objects, which the adapter sends in order.

Responses, as NVIDIA's C++ backend gives them (``inflight_batcher_llm/src/model_instance_state.cc``,
read from their source):
- decoupled: every row answers on its own (``batch_index`` [1, 1] when the batch has several rows);
  streaming rows send each new-token delta, others one response when they finish; only the job's last
  finishing row carries the final flag;
- unary (not decoupled): one response for the whole job when its last row finishes, rows stacked in
  batch order (NVIDIA refuses batches here; we answer them);
- a ``stop`` request ends its target rows normally, with the tokens produced so far (a streaming row:
  a last response with no new tokens, so the ensemble's postprocessing flushes);
- ``stream_interval`` n > 1 (ours, as SGLang's): a streaming row sends its first token at once, then
  holds tokens until n are pending or it finishes, so each later response carries n tokens (the last
  one, the rest); the tokens and their order are unchanged;
- a client cancellation answers CANCELLED; an engine error answers its code (INVALID_ARG for a request the engine
  refused once admitted, e.g. a guide that did not compile; INTERNAL otherwise); either ends the whole job
  (its other rows are aborted) with one final error reply.

Invariants: a job gets exactly one final reply and nothing after it (INTERNAL when a reply cannot be made); a
job leaves the registry before its final reply is handed out (so nobody asks a freed response sender whether it was cancelled): both are
``lifecycle.Live``'s, as in the BLS. Threads: ``add`` (executing thread), ``on_output`` (one responder thread),
``cancelled`` / ``rows_of`` (watcher, stop requests) may run concurrently; everything is guarded by ``Live.lock``.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .engine.request import RequestOutput, SamplingParams
from .lifecycle import ClientRequest, Live, Sequences
from .llm_io import ParsedBatch, ParsedRequest, response_arrays, stack_rows

INTERNAL, CANCELLED = "INTERNAL", "CANCELLED"


@dataclass
class Reply:
    sender: Any
    arrays: dict[str, np.ndarray] | None = None  # None: no outputs (an error, or a flag-only final)
    final: bool = False
    error: str | None = None
    code: str | None = None                       # INTERNAL | INVALID_ARG | CANCELLED when error is set
    as_data: bool = False                         # the caller asked for failures as data (errors.py)


@dataclass
class Finished:
    """A row that finished normally, for the metrics: token counts and client-side timings."""

    prompt_tokens: int
    output_tokens: int
    ttft: float | None
    tpot: float | None


@dataclass(eq=False)
class Job(ClientRequest):
    """One Triton request (client_id: its Triton request id, for NVIDIA's ``stop``); pending counts its rows'
    sequences, ``cancelled`` is set by the watcher (aborts are then answered CANCELLED)."""
    decoupled: bool = True
    rows: list["Row"] = field(default_factory=list)  # every sequence of every batch row
    batch_size: int = 1
    done: list[dict[str, np.ndarray] | None] = field(default_factory=list)  # unary: each row's arrays
    outputs: frozenset[str] | None = None  # the outputs the caller asked for (None: every one we make)
    errors_as_data: bool = False           # a caller of ours: failures answered as data (errors.py)


@dataclass(eq=False)
class Row:
    job: Job
    index: int
    rid: str
    request: ParsedRequest
    params: SamplingParams               # the request's, with this sequence's seed and prefill_after
    seq: int = 0                          # sequence_index (num_return_sequences > 1)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    num_out: int = 0
    held: RequestOutput | None = None     # streamed tokens not sent yet (stream_interval)
    detok: Any = None                     # IncrementalDetokenizer when the caller asked for text_output

    def timings(self) -> tuple[float | None, float | None]:
        """(time to first token, mean time per later output token) as the client saw them."""
        if self.first_token is None:
            return None, None
        tpot = (time.monotonic() - self.first_token) / (self.num_out - 1) if self.num_out > 1 else None
        return self.first_token - self.arrival, tpot


def coalesce(outputs: list[RequestOutput]) -> list[RequestOutput]:
    """Outputs that queued up for the responder, with each request's deltas merged into one (tokens, log
    probs and top log probs concatenated; the rest from its latest output), in the order requests first
    appear. When sending falls behind generation, a stream then gets one response per send instead of one
    per token: the client sees the same tokens, in fewer, larger deltas."""
    merged: dict[str, RequestOutput] = {}
    for out in outputs:
        prev = merged.get(out.request_id)
        if prev is None:
            merged[out.request_id] = out
            continue
        merged[out.request_id] = dataclasses.replace(
            out, new_token_ids=prev.new_token_ids + out.new_token_ids,
            new_logprobs=prev.new_logprobs + out.new_logprobs,
            new_top_logprobs=prev.new_top_logprobs + out.new_top_logprobs)
    return list(merged.values())


class Jobs:
    def __init__(self, stream_interval: int = 1) -> None:
        self.stream_interval = stream_interval
        self.live = Live()
        self._rows: dict[str, Row] = {}  # engine id -> its row, under live.lock
        self._ids = itertools.count()

    def add(self, sender, triton_id: str, batch: ParsedBatch, decoupled: bool, detokenizer=None,
            outputs: frozenset[str] | None = None, errors_as_data: bool = False) -> Job:
        """``detokenizer``: a factory of IncrementalDetokenizer when the caller asked for ``text_output``
        (each row then answers its text too, as the postprocessing step would). ``outputs``: the names the
        caller asked for; replies carry only those (an ensemble step asks for the ones it maps)."""
        job = Job(sender, triton_id, decoupled=decoupled, batch_size=len(batch.rows), outputs=outputs,
                  errors_as_data=errors_as_data)
        with self.live.lock:
            for i, parsed in enumerate(batch.rows):  # each row: its sequences (lifecycle: seeds, shared prompt)
                seqs = Sequences.of(parsed.params, parsed.num_sequences, lambda: str(next(self._ids)))
                for seq, (rid, params) in enumerate(zip(seqs.ids, seqs.params)):
                    job.rows.append(Row(job, i, rid, parsed, params, seq,
                                        detok=detokenizer() if detokenizer else None))
            job.pending = len(job.rows)
            job.done = [None] * len(job.rows)
            self._rows.update((row.rid, row) for row in job.rows)
        self.live.add(job)
        return job

    def forget(self, job: Job) -> None:
        """Drop a job whose rows never reached the engine (its submission was refused)."""
        with self.live.lock:
            for row in job.rows:
                self._rows.pop(row.rid, None)
            self.live.close_locked(job)  # its answer is the refusal the caller sends

    def rows_of(self, triton_id: str) -> list[str]:
        """Engine ids of the unfinished rows of every job with this Triton request id (NVIDIA's ``stop``)."""
        jobs = self.live.with_id(triton_id)
        with self.live.lock:
            return [row.rid for job in jobs for row in job.rows if row.rid in self._rows]

    def cancelled(self, is_cancelled) -> list[str]:
        """Marks jobs whose client cancelled (``is_cancelled(sender)``); their rows' engine ids, to abort."""
        hit = self.live.cancelled(is_cancelled)
        with self.live.lock:
            return [row.rid for job in hit for row in job.rows if row.rid in self._rows]

    def __len__(self) -> int:
        with self.live.lock:
            return len(self._rows)

    # ---- responder thread --------------------------------------------------------------------------
    def on_output(self, out: RequestOutput) -> tuple[list[Reply], list[str], Finished | None]:
        """(replies to send in order, engine ids to abort, the row's figures if it finished normally)."""
        with self.live.lock:
            row = self._rows.get(out.request_id)
            if row is None:
                return [], [], None
            job = row.job
            if out.finished:
                del self._rows[out.request_id]
                self.live.end_locked(job)
            failed = out.error is not None or (out.finish_reason == "abort" and job.cancelled)
            # the whole job ends now: its other rows leave the registry, then get aborted
            others = self._end_job_locked(job) if failed else []
            if job.pending == 0:  # its final reply is handed out below: it leaves the registry first
                self.live.close_locked(job)
        if out.new_token_ids:
            row.num_out += len(out.new_token_ids)
            if row.first_token is None:
                row.first_token = time.monotonic()
        if failed:
            if out.error is not None:
                return [Reply(job.sender, final=True, error=out.error, code=out.error_code or INTERNAL,
                              as_data=job.errors_as_data)], others, None
            return [Reply(job.sender, final=True, error="request cancelled", code=CANCELLED,
                          as_data=job.errors_as_data)], others, None
        try:
            return self._data(row, out), [], (self._figures(row, out) if out.finished else None)
        except Exception as e:  # noqa: BLE001  a reply we could not build (a fault of ours): the job still ends
            with self.live.lock:
                others = self._end_job_locked(job)
                self.live.close_locked(job)
            return [Reply(job.sender, final=True, error=f"tensorrt_llm: the response could not be made: {e}",
                          code=INTERNAL, as_data=job.errors_as_data)], others, None

    def _end_job_locked(self, job: Job) -> list[str]:
        """Ends a job before its rows finish (under live.lock): the engine ids of its rows still open, to abort."""
        others = [r.rid for r in job.rows if r.rid in self._rows]
        for rid in others:
            del self._rows[rid]
        job.pending = 0
        return others

    @staticmethod
    def _figures(row: Row, out: RequestOutput) -> Finished:
        return Finished(out.num_prompt_tokens, out.num_output_tokens, *row.timings())

    def _data(self, row: Row, out: RequestOutput) -> list[Reply]:
        job, req = row.job, row.request
        batch_index = row.index if job.decoupled and job.batch_size > 1 else None
        sequence_index = row.seq if req.num_sequences > 1 else None

        def arrays(ids, logprobs, top):
            got = response_arrays(ids, logprobs, out.cum_logprob, out.num_prompt_tokens, req.flags, out.metrics,
                                  batch_index, int(row.rid), out.finished, sequence_index, top,
                                  out.finish_reason if out.finished else None, out.embedding)
            if row.detok is not None:  # postprocessing's OUTPUT: [1] UTF-8 bytes, the exact delta
                text = row.detok.finish(ids) if out.finished else row.detok.add(ids)
                got["text_output"] = np.array([text.encode("utf-8")], dtype=object)
            return got if job.outputs is None else {k: v for k, v in got.items() if k in job.outputs}

        if req.streaming:  # decoupled only (unary refuses streaming); a finished stream ends with data
            if not (out.new_token_ids or out.finished):
                return []
            if row.held is not None:
                out = coalesce([row.held, out])[0]
                row.held = None
            if not out.finished and row.num_out > len(out.new_token_ids) \
                    and len(out.new_token_ids) < self.stream_interval:
                row.held = out                # not the first token, not a full interval yet
                return []
            last = out.finished and job.pending == 0
            return [Reply(job.sender, arrays(out.new_token_ids, out.new_logprobs, out.new_top_logprobs), final=last)]
        row.tokens.extend(out.new_token_ids)
        row.logprobs.extend(out.new_logprobs)
        row.top.extend(out.new_top_logprobs)
        if not out.finished:
            return []
        ids = row.tokens if req.exclude_input else req.prompt_ids + row.tokens
        mine = arrays(ids, row.logprobs, row.top)
        if job.decoupled:
            return [Reply(job.sender, mine, final=job.pending == 0)]
        job.done[row.index] = mine
        if job.pending:
            return []
        return [Reply(job.sender, stack_rows(job.done) if len(job.done) > 1 else mine, final=True)]
