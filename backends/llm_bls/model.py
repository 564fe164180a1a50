"""Triton Python-based backend ``llm_bls``: serves model ``tensorrt_llm_bls`` (decoupled) with the client
contract of NVIDIA's ``ensemble`` (text_input, max_tokens, stream, ... -> text_output + pass-through).

Per request, on a worker thread (``execute`` returns at once, so requests run concurrently):
preprocessing via BLS ``exec()``, then tensorrt_llm via BLS ``exec(decoupled=True)`` (always streaming),
each response's new ids -> ``tritonllm.text.bls_stream.TextGeneration`` (exact incremental
detokenization + stop strings) -> text deltas (stream=true) or one response (stream=false).
All logic that is not Triton plumbing lives in ``tritonllm.text.bls_stream``.

Ending the engine request early (stop string completed, or the client cancelled): the python_backend
of Triton 2.51 has no ``ResponseIterator.cancel()``, and dropping the iterator would leave the engine
generating (and holding KV blocks) until max_tokens. So the inner request carries a unique request id,
and a second request to tensorrt_llm with ``stop=true`` and that id aborts it (NVIDIA's tensorrt_llm
contract; our torchllm aborts the engine request, which frees its KV blocks, and ends the stream with a
flag-only final response). The iterator is then drained so nothing is left pending.

Config parameters (string_value): tokenizer_dir, tensorrt_llm_model_name, preprocessing_model_name,
skip_special_tokens (default true), max_inflight_requests (worker threads, default 64; more requests
queue), accumulate_tokens (NVIDIA's; ignored: deltas are exact without it).
"""
import itertools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

# The stub builds sys.path itself (PYTHONPATH is ignored): make the sibling library package importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from tritonllm import contract as C  # noqa: E402
from tritonllm.paths import model_parameters, model_path_param  # noqa: E402
from tritonllm.text import bls_stream as B  # noqa: E402
from tritonllm.text.detokenizer import tokenizer_traits  # noqa: E402
from tritonllm.text.preprocess import InvalidInput  # noqa: E402
from tritonllm.text.tokenizer import load_tokenizer, parse_bool  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
WATCH_PERIOD_S = 0.05


class _InnerError(Exception):
    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class _Job:
    __slots__ = ("sender", "inner_id", "cancelled", "stop_sent", "answered")

    def __init__(self, sender, inner_id):
        self.sender = sender
        self.inner_id = inner_id
        self.cancelled = False  # set by the watcher thread when the client cancels
        self.stop_sent = False
        self.answered = False  # the final response went out: nothing more may be sent


class TritonPythonModel:
    def initialize(self, args):
        config, params = model_parameters(args)
        tokenizer_dir = model_path_param(args, params, "tokenizer_dir")
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.traits = tokenizer_traits(self.tokenizer)
        self.skip_special = parse_bool(params.get("skip_special_tokens"), True)
        self.llm_model = params.get("tensorrt_llm_model_name") or C.TENSORRT_LLM
        self.pre_model = params.get("preprocessing_model_name") or C.PREPROCESSING
        self.input_names = [t["name"] for t in config.get("input", [])]
        self.output_names = {t["name"] for t in config.get("output", [])}
        self.pre_outputs = [t.name for t in C.PREPROCESSING_OUTPUTS]
        self.pool = ThreadPoolExecutor(max_workers=int(params.get("max_inflight_requests") or 64),
                                       thread_name_prefix="bls")
        self.jobs: set[_Job] = set()
        self.lock = threading.Lock()
        self.ids = itertools.count()
        # Inner request ids: unique across instances (each is its own process) and numeric, because
        # NVIDIA's tensorrtllm backend (GPU profile) reads request ids as integers for `stop`.
        self.id_base = (os.getpid() & 0xFFFFFF) << 32
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self._watch_cancellations, daemon=True)
        self.watcher.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            arrays = {}
            for name in self.input_names:
                t = pb_utils.get_input_tensor_by_name(request, name)
                if t is not None:
                    arrays[name] = t.as_numpy()
            job = _Job(sender, str(self.id_base + next(self.ids)))
            with self.lock:
                self.jobs.add(job)
            self.pool.submit(self._run, job, arrays)
        return None

    # ---- worker thread -----------------------------------------------------------------------------
    def _run(self, job, arrays):
        try:
            req = B.parse_request(arrays)
            pre = self._preprocess(req)
            gen = B.TextGeneration(self.tokenizer, req, B.prompt_ids(pre),
                                   skip_special_tokens=self.skip_special, traits=self.traits)
            self._generate(job, req, pre, gen)
        except InvalidInput as e:
            self._fail(job, str(e), pb_utils.TritonError.INVALID_ARG)
        except _InnerError as e:
            self._fail(job, str(e), e.code)
        except Exception as e:  # never let one request take the model down
            pb_utils.Logger.log_error(f"tensorrt_llm_bls: {e!r}")
            self._fail(job, f"internal error: {e}", pb_utils.TritonError.INTERNAL)
        finally:
            self._finish(job, pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "tensorrt_llm_bls: request ended without a response", pb_utils.TritonError.INTERNAL)))

    def _preprocess(self, req):
        inputs = [pb_utils.Tensor(k, v) for k, v in B.preprocessing_inputs(req).items()]
        resp = pb_utils.InferenceRequest(model_name=self.pre_model, requested_output_names=self.pre_outputs,
                                         inputs=inputs).exec()
        if resp.has_error():
            raise self._inner_error(resp.error())
        return {t.name(): t.as_numpy() for t in resp.output_tensors()}

    def _generate(self, job, req, pre, gen):
        inputs = [pb_utils.Tensor(k, v) for k, v in B.llm_inputs(req, pre).items()]
        responses = pb_utils.InferenceRequest(
            model_name=self.llm_model, requested_output_names=list(B.LLM_OUTPUTS), inputs=inputs,
            request_id=job.inner_id).exec(decoupled=True)
        done, error = False, None
        for resp in responses:  # always iterated to the end: nothing may stay pending
            if done:
                continue
            if job.cancelled:
                self._stop_engine(job)
                self._fail(job, "request cancelled", pb_utils.TritonError.CANCELLED)
                done = True
                continue
            if resp.has_error():
                error, done = self._inner_error(resp.error()), True
                continue
            tensors = resp.output_tensors()
            if not tensors:  # the flag-only final response
                continue
            chunk = gen.on_response({t.name(): t.as_numpy() for t in tensors})
            if chunk is not None:
                self._send(job, chunk, 0)
            if gen.stopped:
                self._send_final(job, req, gen.finish())
                done = True
                self._stop_engine(job)
        if error is not None:
            raise error
        if not done:
            if job.cancelled:
                self._fail(job, "request cancelled", pb_utils.TritonError.CANCELLED)
            else:
                self._send_final(job, req, gen.finish())

    def _stop_engine(self, job):
        """Abort the engine request (see module docstring); its KV blocks are freed."""
        if job.stop_sent:
            return
        job.stop_sent = True
        one = np.ones((1, 1), dtype=np.int32)
        stop = pb_utils.InferenceRequest(
            model_name=self.llm_model, requested_output_names=["output_ids"], request_id=job.inner_id,
            inputs=[pb_utils.Tensor("input_lengths", one), pb_utils.Tensor("request_output_len", one),
                    pb_utils.Tensor("stop", np.ones((1, 1), dtype=bool))])
        for resp in stop.exec(decoupled=True):
            if resp.has_error():
                pb_utils.Logger.log_warn(f"tensorrt_llm_bls: stop {job.inner_id} failed: {resp.error().message()}")

    def _send_final(self, job, req, chunk):
        # A streamed stream ends without an empty event when there is nothing left to say.
        if req.stream and chunk.empty:
            self._finish(job, None)
        else:
            self._send(job, chunk, FINAL)

    def _send(self, job, chunk, flags):
        arrays = chunk.arrays()
        response = pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items() if k in self.output_names])
        if flags == FINAL:
            self._finish(job, response)
        elif not job.answered:
            job.sender.send(response, flags=flags)

    def _fail(self, job, message, code):
        self._finish(job, pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)))

    def _finish(self, job, response):
        """Send the final response (None: flag only), once. Under the lock shared with the watcher:
        Triton frees the response factory after the final flag, and `is_cancelled()` on a freed
        factory crashes the server (seen on 2.51: SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled)."""
        with self.lock:
            if job.answered:
                return
            job.answered = True
            self.jobs.discard(job)
            if response is None:
                job.sender.send(flags=FINAL)
            else:
                job.sender.send(response, flags=FINAL)

    @staticmethod
    def _inner_error(error):
        code = error.code() if hasattr(error, "code") else pb_utils.TritonError.INTERNAL
        return _InnerError(B.client_message(error.message()), code)

    # ---- cancellation ------------------------------------------------------------------------------
    def _watch_cancellations(self):
        # Flags only: the worker that owns the job stops the engine request on its next response.
        while not self.closing.wait(WATCH_PERIOD_S):
            with self.lock:  # see _finish: never ask a sender that has sent its final response
                for job in self.jobs:
                    if not job.cancelled and not job.answered and job.sender.is_cancelled():
                        job.cancelled = True

    def finalize(self):
        self.closing.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
