"""Triton Python-based backend ``llm_bls``: serves model ``tensorrt_llm_bls`` with the client contract of
NVIDIA's ``ensemble`` (text_input, max_tokens, stream, ... -> text_output + pass-through).

Per batch row, on a worker thread (``execute`` returns at once, so requests run concurrently):
preprocessing via BLS ``exec()``, then tensorrt_llm, each response's new ids ->
``tritonllm.text.text_generation.TextGeneration`` (exact incremental detokenization + stop strings) -> text.
Decoupled (NVIDIA's ``decoupled_mode``, the default): tensorrt_llm via ``exec(decoupled=True)``, always
streaming; each row answers on its own (``batch_index`` when the batch has several rows), deltas when
``stream=true``, and the last row to finish carries the final flag. ``num_return_sequences`` n > 1
(decoupled only): the row's engine request streams n sequences, each answering on its own
(``sequence_index``; ``tritonllm.text.sequences``), and the final flag waits for every sequence of every
row; the engine request is stopped early only once every sequence completed a stop string. Unary: one
unary tensorrt_llm call per row and one response for the request, rows stacked (``text_output``
``[batch]``). The client's Triton timeout (``request.timeout()``, what is left of it) is the inner
request's, which tensorrt_llm turns into the engine's deadline.
All logic that is not Triton plumbing lives in ``tritonllm.text.bls_stream``.

Ending the engine request early (stop string completed, the client cancelled, or another row of the
request failed): the python_backend of Triton 2.51 has no ``ResponseIterator.cancel()``, and dropping
the iterator would leave the engine generating (and holding KV blocks) until max_tokens. So the inner
request carries a unique request id, and a second request to tensorrt_llm with ``stop=true`` and that
id aborts it (NVIDIA's tensorrt_llm contract; our torchllm aborts the engine request, which frees its KV
blocks, and ends the stream normally). The iterator is then drained so nothing is left pending.

Contracts (parameter ``contract``): ``ensemble`` (default; NVIDIA's ensemble / BLS tensors, model
``tensorrt_llm_bls``) or ``llmapi`` (NVIDIA's LLM-API model: one request is one row, text cumulative,
``stop`` cancels by request id; ``tritonllm.text.llmapi_text``).

Config parameters (string_value): contract, tokenizer_dir, tensorrt_llm_model_name, preprocessing_model_name,
skip_special_tokens (default true), include_stop_words (default false: text ends just before a stop
word, OpenAI's semantics; true: through it, NVIDIA's BLS), engine_finish_reason (default true: ask tensorrt_llm
for its finish_reason and pass it on; false for NVIDIA's backend, which has none), max_inflight_requests (worker threads,
default 64; more rows queue), accumulate_tokens (NVIDIA's; ignored: deltas are exact without it).
"""
import itertools
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

# The stub builds sys.path itself (PYTHONPATH is ignored): make the sibling library package importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from tritonllm import contract as C  # noqa: E402
from tritonllm.errors import ERROR_OUTPUTS, InnerError  # noqa: E402
from tritonllm.lifecycle import ClientRequest, Live  # noqa: E402
from tritonllm.llm_io import STREAMING_NEEDS_DECOUPLED, stack_rows  # noqa: E402
from tritonllm.paths import model_parameters, model_path_param  # noqa: E402
from tritonllm.serving import triton_kit as K  # noqa: E402
from tritonllm.text import bls_stream as B  # noqa: E402
from tritonllm.text import llmapi_text as LT  # noqa: E402
from tritonllm.text.detokenizer import tokenizer_traits  # noqa: E402
from tritonllm.text.preprocess import InvalidInput  # noqa: E402
from tritonllm.text.sequences import Sequences  # noqa: E402
from tritonllm.text.text_generation import stackable  # noqa: E402
from tritonllm.text.tokenizer import load_tokenizer, parse_bool  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
WATCH_PERIOD_S = 0.05


class _Job(ClientRequest):
    """One client request (lifecycle.ClientRequest: sender, client_id = its Triton request id, pending sequences,
    cancelled, answered; under ``Live.lock``) and what its rows have done."""

    def __init__(self, sender, rows, triton_id="", timeout_us=0, as_data=False, outputs=frozenset()):
        super().__init__(sender, triton_id, pending=rows)  # a row counts 1 until it knows its n
        self.outputs = outputs          # what the client asked for: its responses carry nothing else (K.requested_outputs)
        self.as_data = as_data          # a caller of ours asked for failures as data (tritonllm.errors)
        self.timeout_us = timeout_us    # the client's Triton timeout (0: none), the engine's deadline
        self.start = time.monotonic()
        self.rows = []          # its _Row objects (a `stop` request stops their engine requests)
        self.done = [None] * rows  # unary: each row's final arrays


class _Row:
    __slots__ = ("job", "index", "inner_id", "stop_sent", "finished")

    def __init__(self, job, index, inner_id):
        self.job = job
        self.index = index
        self.inner_id = inner_id
        self.stop_sent = False
        self.finished = False  # its last chunk was handed to the job


class TritonPythonModel:
    def initialize(self, args):
        K.trace_crashes()
        config, params = model_parameters(args)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        tokenizer_dir = model_path_param(args, params, "tokenizer_dir")
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.traits = tokenizer_traits(self.tokenizer)
        self.skip_special = parse_bool(params.get("skip_special_tokens"), True)
        self.engine_finish_reason = parse_bool(params.get("engine_finish_reason"), True)  # false: NVIDIA's backend
        self.include_stop_words = parse_bool(params.get("include_stop_words"), False)
        self.llmapi = (params.get("contract") or "ensemble") == "llmapi"
        if params.get("contract") not in (None, "", "ensemble", "llmapi"):
            raise pb_utils.TritonModelException(f"contract {params['contract']!r}: use ensemble or llmapi")
        self.names = LT.client_names if self.llmapi else (lambda message: message)
        self.llm_model = params.get("tensorrt_llm_model_name") or C.TENSORRT_LLM
        self.pre_model = params.get("preprocessing_model_name") or C.PREPROCESSING
        self.input_names = [t["name"] for t in config.get("input", [])]
        self.pre_outputs = [t.name for t in C.PREPROCESSING_OUTPUTS]
        self.pool = ThreadPoolExecutor(max_workers=int(params.get("max_inflight_requests") or 64),
                                       thread_name_prefix="bls")
        self.live = Live()  # unanswered client requests; its lock also orders every send (see _send)
        self.ids = itertools.count()
        # Inner request ids: unique across instances (each is its own process) and numeric, because
        # NVIDIA's tensorrtllm backend (GPU profile) reads request ids as integers for `stop`.
        self.id_base = (os.getpid() & 0xFFFFFF) << 32
        self.drained = K.DrainedIterators()  # every response iterator goes there once drained (why: its docstring)
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self._watch_cancellations, daemon=True)
        self.watcher.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            arrays = K.read_inputs(pb_utils, request, self.input_names)
            as_data = K.wants_error_data(request)
            try:
                if self.llmapi and LT.is_stop(arrays):
                    self._stop_request(sender, request.request_id())
                    continue
                rows = [arrays] if self.llmapi else B.split_rows(arrays)
            except InvalidInput as e:
                K.send_error(pb_utils, sender, str(e), pb_utils.TritonError.INVALID_ARG, as_data)
                continue
            job = _Job(sender, len(rows), request.request_id(), K.timeout_us(request), as_data,
                       K.requested_outputs(request))
            job.rows = [_Row(job, i, str(self.id_base + next(self.ids))) for i in range(len(rows))]
            self.live.add(job)
            for row, row_arrays in zip(job.rows, rows):
                self.pool.submit(self._run, row, row_arrays, row.index if len(rows) > 1 else None)
        return None

    # ---- worker thread -----------------------------------------------------------------------------
    def _run(self, row, arrays, batch_index):
        try:
            if self.llmapi:
                req = LT.parse(arrays)
            else:
                req = B.parse_request(arrays, batch_index if self.decoupled else None, vocab_size=len(self.tokenizer))
            if req.stream and not self.decoupled:
                raise InvalidInput(self.names(f"stream: {STREAMING_NEEDS_DECOUPLED}"))
            why = None if self.decoupled else B.needs_decoupled(req)
            if why:
                raise InvalidInput(why)
            n = req.num_return_sequences
            if n > 1:  # before any of this row's sequences can finish: the job's final flag waits for all
                with self.live.lock:
                    row.job.pending += n - 1
            pre = self._preprocess(req)
            prompt = B.prompt_ids(pre)
            seqs = Sequences(n, lambda index: LT.generation_for(
                self.tokenizer, req, prompt, skip_special_tokens=self.skip_special, traits=self.traits,
                include_stop_words=self.include_stop_words, sequence_index=index))
            if self.decoupled:
                self._generate(row, req, pre, seqs)
            else:
                self._generate_unary(row, req, pre, seqs)
        except Exception as e:  # never let one request take the model down
            self._fail(row.job, *K.failure(pb_utils, e, "tensorrt_llm_bls"))
        finally:
            if not row.finished:  # a no-op when the job already has its final response
                self._fail(row.job, "tensorrt_llm_bls: request ended without a response",
                           pb_utils.TritonError.INTERNAL)

    def _preprocess(self, req):
        inputs = [pb_utils.Tensor(k, v) for k, v in B.preprocessing_inputs(req).items()]
        resp = pb_utils.InferenceRequest(model_name=self.pre_model, requested_output_names=self.pre_outputs,
                                         inputs=inputs, parameters=K.error_data_request()).exec()
        failed = self._inner_failure(resp)
        if failed is not None:
            raise failed
        return {t.name(): t.as_numpy() for t in resp.output_tensors()}

    def _llm_request(self, row, req, pre, stream):
        inputs = [pb_utils.Tensor(k, v) for k, v in B.llm_inputs(req, pre, stream=stream).items()]
        timeout = B.inner_timeout_us(row.job.timeout_us, time.monotonic() - row.job.start)
        # failures as data from our tensorrt_llm only (NVIDIA's backend, engine_finish_reason false, has no such outputs)
        return pb_utils.InferenceRequest(model_name=self.llm_model, requested_output_names=B.llm_outputs(req, self.engine_finish_reason),
                                         inputs=inputs, request_id=row.inner_id, timeout=timeout,
                                         parameters=K.error_data_request() if self.engine_finish_reason else {})

    def _generate_unary(self, row, req, pre, seqs):
        resp = self._llm_request(row, req, pre, stream=False).exec()
        if row.job.cancelled:  # a `stop` request ended the engine request early
            self._fail(row.job, "request cancelled", pb_utils.TritonError.CANCELLED)
            row.finished = True
            return
        failed = self._inner_failure(resp)
        if failed is not None:
            raise failed
        finals = [c for c, _ in seqs.on_response({t.name(): t.as_numpy() for t in resp.output_tensors()})]
        self._row_final(row, req, (finals + seqs.finish_all())[-1])  # n == 1: one final chunk

    def _generate(self, row, req, pre, seqs):
        responses = self._llm_request(row, req, pre, stream=True).exec(decoupled=True)
        job, done, error = row.job, False, None
        for resp in responses:  # always iterated to the end: nothing may stay pending
            if done:
                continue
            if job.cancelled or job.answered:  # the client cancelled, or another row failed
                # answered first: the client's final waits on nothing (the stop is a round trip to tensorrt_llm)
                self._fail(job, "request cancelled", pb_utils.TritonError.CANCELLED)
                self._stop_engine(row)
                done = True
                continue
            failed = self._inner_failure(resp)
            if failed is not None:
                error, done = failed, True
                continue
            tensors = resp.output_tensors()
            if not tensors:  # the flag-only final response
                continue
            try:
                sends = seqs.on_response({t.name(): t.as_numpy() for t in tensors})
            except Exception as e:  # e.g. a sequence_index out of range: still drain, and free the engine
                error, done = e, True
                self._stop_engine(row)
                continue
            for chunk, final in sends:
                if final:
                    self._row_final(row, req, chunk, seqs.done)
                else:
                    self._send(job, self._response(job, chunk.arrays()), 0)
            if seqs.done:  # every sequence completed a stop string: the shared engine request can go
                done = True
                self._stop_engine(row)
        self.drained.keep(responses)
        if error is not None:
            raise error
        if not done:
            if job.cancelled:
                self._fail(job, "request cancelled", pb_utils.TritonError.CANCELLED)
            else:
                for chunk in seqs.finish_all():
                    self._row_final(row, req, chunk, seqs.done)

    def _stop_engine(self, row):
        """Abort the engine request (see module docstring); its KV blocks are freed."""
        if row.stop_sent:
            return
        row.stop_sent = True
        one = np.ones((1, 1), dtype=np.int32)
        # Failures as data (as for the generation request): python_backend r24.10 files a decoupled BLS response
        # that carries a Triton error under a stale iterator id (InferResponse::SaveToSharedMemory, fixed in
        # r25.04 by python_backend #398), so an error final would leave this iterator waiting forever.
        as_data = self.engine_finish_reason
        stop = pb_utils.InferenceRequest(
            model_name=self.llm_model, request_id=row.inner_id,
            requested_output_names=["output_ids", *(ERROR_OUTPUTS if as_data else ())],
            inputs=[pb_utils.Tensor("input_lengths", one), pb_utils.Tensor("request_output_len", one),
                    pb_utils.Tensor("stop", np.ones((1, 1), dtype=bool))],
            parameters=K.error_data_request() if as_data else {})
        responses = stop.exec(decoupled=True)
        for resp in responses:
            failed = K.inner_failure(pb_utils, resp)
            if failed is not None:
                pb_utils.Logger.log_warn(f"tensorrt_llm_bls: stop {row.inner_id} failed: {failed}")
        self.drained.keep(responses)

    def _stop_request(self, sender, triton_id):
        """NVIDIA's LLM-API `stop`: cancel every request carrying this request id; the stop request itself
        is answered CANCELLED too, as NVIDIA's model answers it."""
        if not triton_id:
            raise InvalidInput(LT.NO_ID_MESSAGE)
        targets = self.live.with_id(triton_id, cancel=True)
        for job in targets:  # unary rows block in exec(): stop their engine requests (decoupled ones too)
            for row in job.rows:
                if not row.finished:
                    self._stop_engine(row)
        K.send_error(pb_utils, sender, LT.STOP_MESSAGE, pb_utils.TritonError.CANCELLED)

    def _row_final(self, row, req, chunk, row_done=True):
        """A sequence's last chunk (``row_done``: the row's last one): the job's final response once every
        sequence of every row is done. Counting and sending happen under one lock, so the final flag always
        leaves after every other sequence's answer."""
        job = row.job
        row.finished = row_done
        with self.live.lock:
            last = self.live.end_locked(job)
            if not self.decoupled:
                job.done[row.index] = chunk.arrays()
                if last:
                    self._send_locked(job, self._response(job, stack_rows(stackable(job.done)) if len(job.done) > 1
                                                          else job.done[0]), FINAL)
            elif req.stream and chunk.empty:  # a stream ends without an empty event when nothing is left
                if last:
                    self._send_locked(job, None, FINAL)
            else:
                self._send_locked(job, self._response(job, chunk.arrays()), FINAL if last else 0)

    def _response(self, job, arrays):
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items() if k in job.outputs])

    def _fail(self, job, message, code):
        self._send(job, K.failure_response(pb_utils, message, code, job.as_data), FINAL)

    def _send(self, job, response, flags):
        """Send a response (None: flag only), never after the final one. Under the lock shared with the
        watcher: Triton frees the response factory after the final flag, and `is_cancelled()` on a freed
        factory crashes the server (seen on 2.51: SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled)."""
        with self.live.lock:
            self._send_locked(job, response, flags)

    def _send_locked(self, job, response, flags):
        if job.answered or (flags == FINAL and not self.live.close_locked(job)):
            return
        try:
            if response is None:
                job.sender.send(flags=flags)
            else:
                job.sender.send(response, flags=flags)
        except Exception as e:  # the worker goes on draining its inner stream; a lost final is logged, never silent
            pb_utils.Logger.log_error(f"tensorrt_llm_bls: a response{' (final)' if flags == FINAL else ''} to "
                                      f"request {job.client_id or '(no id)'} was not sent: {e}")

    def _inner_failure(self, resp):
        """A composing model's failure (as data or a Triton error), in the client's names; None if it succeeded."""
        failed = K.inner_failure(pb_utils, resp)
        return None if failed is None else InnerError(self.names(B.client_message(str(failed))), failed.code)

    # ---- cancellation ------------------------------------------------------------------------------
    def _watch_cancellations(self):
        # Flags only: the workers that own the job's rows stop their engine requests on the next response.
        # Live asks only unanswered requests, under the lock every send takes (see _send).
        while not self.closing.wait(WATCH_PERIOD_S):
            try:
                self.live.cancelled(lambda sender: sender.is_cancelled())
            except Exception as e:  # the watcher must outlive one bad reading (it also releases drained iterators)
                pb_utils.Logger.log_error(f"tensorrt_llm_bls: watcher: {e}")
            self.drained.prune()

    def finalize(self):
        self.closing.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.drained.clear()
        K.drop_garbage()

