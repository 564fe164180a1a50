"""The Triton side of the model ``tensorrt_llm`` (NVIDIA's tensorrt_llm tensor contract), shared by every
generator backend (``generator.GeneratorBackend``: our engine, TensorRT-LLM's LLM API).

Tensors -> ``tritonllm.llm_io`` -> the backend; backend outputs -> ``tritonllm.llm_jobs`` -> responses.
One backend per model instance serves every request. Decoupled or not as the config says (NVIDIA's
``decoupled_mode``): decoupled answers each batch row on its own and streams; unary sends one response
per request, through the response sender too, so ``execute`` never blocks on generation. Client
cancellation and NVIDIA's ``stop`` request abort backend requests, which frees their KV blocks. Metrics:
ours (``metrics.LLMMetrics``) and NVIDIA's families (``NvidiaMetrics``), whose iteration-stats JSON is
also logged at verbose level as NVIDIA's backend logs it.

Library code: Triton's ``triton_python_backend_utils`` is not imported here; the thin adapter
(``backends/<name>/model.py``) sets it as the class attribute ``pb_utils`` together with ``build_backend``.

Invariants: InvalidRequest -> INVALID_ARG (through the ensemble its message also names the ensemble's
inputs), QueueFull -> UNAVAILABLE, anything else -> INTERNAL, and one failing request never takes the
model down; responses leave on their own thread, in the order the backend produced them; ``finalize``
sends every final response before it returns (the backend's last output precedes the outbox's end mark).
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time

from ..engine.request import InvalidRequest
from ..engine.knobs import BY_PARAM as KNOBS_BY_PARAM
from ..error_names import with_client_names
from ..llm_io import (INPUT_NAMES, SEQUENCES_NEED_DECOUPLED, STREAMING_NEEDS_DECOUPLED, in_tensor_names,
                      parse_request, wants_ensemble_names)
from ..llm_jobs import CANCELLED, Jobs, coalesce
from ..metrics import COUNTER, GAUGE, HISTOGRAM, LLMMetrics, NvidiaMetrics
from ..paths import model_parameters, model_path_param
from .generator import BackendBuilder, GeneratorBackend
from .triton_kit import (drop_garbage, failure, failure_response, read_inputs, requested_outputs, send_error,
                         timeout_us, trace_crashes, wants_error_data)


class _TritonLogHandler(logging.Handler):
    """Routes the library's `logging` records (engine thread errors) into Triton's log."""

    def __init__(self, pb_utils, level=logging.WARNING):
        super().__init__(level)
        self.pb_utils = pb_utils

    def emit(self, record):
        msg = self.format(record)
        log = self.pb_utils.Logger
        (log.log_error if record.levelno >= logging.ERROR else log.log_warn)(msg)


def _family_factory(pb_utils):
    def family(name, description, kind):
        kinds = {COUNTER: pb_utils.MetricFamily.COUNTER, GAUGE: pb_utils.MetricFamily.GAUGE,
                 HISTOGRAM: getattr(pb_utils.MetricFamily, "HISTOGRAM", None)}
        if kinds[kind] is None:
            return None  # no native histograms in this Triton: LLMMetrics builds them from counters
        return pb_utils.MetricFamily(name=name, description=description, kind=kinds[kind]).Metric
    return family


class LLMTritonModel:
    """Base of ``TritonPythonModel`` for the ``tensorrt_llm`` slot; subclasses set the two attributes."""

    pb_utils = None                        # the module triton_python_backend_utils
    build_backend: BackendBuilder = None   # (args, params, on_output) -> a GeneratorBackend, not started

    def initialize(self, args):
        pb = self.pb_utils
        trace_crashes()
        self.final_flag = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        lib_log = logging.getLogger("tritonllm")
        if not any(isinstance(h, _TritonLogHandler) for h in lib_log.handlers):
            lib_log.addHandler(_TritonLogHandler(pb, logging.WARNING))
        config, params = model_parameters(args)
        self.decoupled = pb.using_decoupled_model_transaction_policy(config)
        self.output_names = {o["name"] for o in config.get("output", [])}
        # Responses leave on their own thread: each send is a round trip to the server process, and made
        # from the engine thread they would stall the next step (16 streams = 16 round trips per step).
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.backend: GeneratorBackend = type(self).build_backend(args, params, self.outbox.put)
        self.default_exclude_input = self.backend.default_exclude_input
        self.coalescing = KNOBS_BY_PARAM["stream_coalescing"].parse(params.get("stream_coalescing"))
        self.cancel_period = float(params.get("cancellation_check_period_ms", "50") or 50) / 1000.0
        self.stats_period = float(params.get("stats_check_period_ms", "100") or 100) / 1000.0
        self.jobs = Jobs(KNOBS_BY_PARAM["stream_interval"].parse(params.get("stream_interval")))
        self.detokenizer = _detokenizer_factory(args, params) if "text_output" in self.output_names else None
        if "text_output" in self.output_names and self.detokenizer is None:
            pb.Logger.log_warn("tensorrt_llm: no tokenizer in tokenizer_dir: text_output is refused (the two-step "
                               "ensemble needs it)")
        family = _family_factory(pb)
        self.metrics = LLMMetrics(family, args["model_name"], float(params.get("cost_per_instance_hour_usd", "0") or 0))
        self.nvidia = NvidiaMetrics(family, args["model_name"], args["model_version"])
        self.responder = threading.Thread(target=self._respond, name="llm-responses", daemon=True)
        self.responder.start()
        self.backend.start()
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()
        mode = "decoupled" if self.decoupled else "unary (not decoupled)"
        pb.Logger.log_info(f"tensorrt_llm: engine ready ({', '.join([*self.backend.describe(), mode])})")

    def execute(self, requests):
        pb = self.pb_utils
        for request in requests:
            sender = request.get_response_sender()
            ensemble, as_data = False, wants_error_data(request)
            try:
                arrays = read_inputs(pb, request, INPUT_NAMES)
                ensemble = wants_ensemble_names(arrays)
                batch = parse_request(arrays, self.default_exclude_input, timeout_us(request))
                if batch.stop:
                    self._stop(request.request_id())
                    sender.send(pb.InferenceResponse(output_tensors=[]), flags=self.final_flag)
                    continue
                if not self.decoupled and any(row.streaming for row in batch.rows):
                    raise InvalidRequest(f"streaming: {STREAMING_NEEDS_DECOUPLED}")
                if not self.decoupled and any(row.num_sequences > 1 for row in batch.rows):
                    raise InvalidRequest(f"num_return_sequences > 1: {SEQUENCES_NEED_DECOUPLED}")
                # Text only for our ensemble's requests: Triton marks every output requested when a direct
                # client names none, and those clients would pay for decoding they never read. Replies carry only
                # the outputs asked for (triton_kit.requested_outputs says why).
                outputs = requested_outputs(request)
                text = ensemble and "text_output" in outputs and "text_output" in self.output_names
                if text and self.detokenizer is None:
                    raise InvalidRequest("text_output: this tensorrt_llm has no tokenizer (tokenizer_dir)")
                job = self.jobs.add(sender, request.request_id(), batch, self.decoupled,
                                    self.detokenizer if text else None, outputs, as_data)
                try:
                    self.backend.submit_all([(r.rid, r.request.prompt_ids, r.params) for r in job.rows])
                except Exception:
                    self.jobs.forget(job)
                    raise
            except InvalidRequest as e:  # in the contract's names; through the ensemble also its own ones
                message = in_tensor_names(str(e))      # "max_tokens" -> "request_output_len (max_tokens)"
                self._fail(sender, with_client_names(message) if ensemble else message, pb.TritonError.INVALID_ARG,
                           as_data)
            except Exception as e:  # QueueFull -> UNAVAILABLE; never let one request take the model down
                self._fail(sender, *failure(pb, e, "tensorrt_llm"), as_data)
        return None

    def _fail(self, sender, message, code, as_data=False):
        send_error(self.pb_utils, sender, message, code, as_data)

    def _stop(self, triton_id):
        if not triton_id:
            raise InvalidRequest("stop: a stop request must carry the request id of the request to stop")
        for rid in self.jobs.rows_of(triton_id):  # an unknown id is not an error: it may have finished
            self.backend.abort(rid)

    def _respond(self):
        while True:
            batch = [self.outbox.get()]
            while self.coalescing:  # what queued while the last ones were sent goes out merged (stream_coalescing)
                try:
                    batch.append(self.outbox.get_nowait())
                except queue.Empty:
                    break
            outputs = [o for o in batch if o is not None]
            for out in coalesce(outputs) if self.coalescing else outputs:
                self._respond_one(out)
            if None in batch:  # the sentinel follows the backend's last output
                return

    def _respond_one(self, out):
        try:
            replies, abort, finished = self.jobs.on_output(out)
            for rid in abort:
                self.backend.abort(rid)
            if finished is not None:
                self.metrics.observe_request(finished.ttft, finished.tpot)
                self.nvidia.observe(finished.prompt_tokens, finished.output_tokens)
        except Exception as e:  # one bad output must not stop the others' responses
            self.pb_utils.Logger.log_error(f"tensorrt_llm: output for {out.request_id} failed: {e}")
            return
        for reply in replies:
            try:
                self._send(reply)
            except Exception as e:  # logged, and a lost final still ends the stream: its caller would wait forever
                self.pb_utils.Logger.log_error(f"tensorrt_llm: a response{' (final)' if reply.final else ''} for "
                                               f"{out.request_id} was not sent: {e}")
                if reply.final:
                    self._end(reply.sender)

    def _end(self, sender):
        try:
            sender.send(flags=self.final_flag)
        except Exception as e:
            self.pb_utils.Logger.log_error(f"tensorrt_llm: nor its final flag: {e}")

    def _send(self, reply):
        pb = self.pb_utils
        flags = self.final_flag if reply.final else 0
        if reply.error is not None:
            code = getattr(pb.TritonError, reply.code or "INTERNAL", pb.TritonError.INTERNAL)  # CANCELLED, INVALID_ARG, ...
            response = failure_response(pb, reply.error, code, reply.as_data)
        else:
            response = pb.InferenceResponse(output_tensors=[
                pb.Tensor(k, v) for k, v in (reply.arrays or {}).items() if k in self.output_names])
        reply.sender.send(response, flags=flags)

    def _watch(self):
        """Aborts requests whose client cancelled; publishes our metrics about every 0.5 s and NVIDIA's
        after each new backend iteration (at most every stats_check_period_ms)."""
        last_publish = last_stats = 0.0
        while not self.closing.wait(min(self.cancel_period, self.stats_period)):
            try:
                for rid in self.jobs.cancelled(lambda sender: sender.is_cancelled()):
                    self.backend.abort(rid)
                now = time.monotonic()
                if now - last_publish >= 0.5:
                    last_publish = now
                    self.metrics.publish(self.backend.stats, *self.backend.load())
                if now - last_stats >= self.stats_period:
                    stats = self.backend.iteration_stats()
                    if stats is not None:
                        last_stats = now
                        self.nvidia.publish(stats)
                        self.pb_utils.Logger.log_verbose(json.dumps(stats))  # as NVIDIA's backend logs them
            except Exception as e:  # the watcher must outlive one bad reading (it also drives cancellation)
                self.pb_utils.Logger.log_error(f"tensorrt_llm: watcher: {e}")

    def finalize(self):
        self.closing.set()
        self.backend.shutdown(timeout=30.0)
        self.outbox.put(None)  # after the backend's last output: every final response is sent first
        self.responder.join(10.0)
        self.watcher.join(10.0)
        # Metric families must go now, while the stub can still tell the server: left to the stub's own
        # teardown, ~MetricFamily runs after the stub instance is gone and segfaults in SaveToSharedMemory
        # (python_backend's pb_stub.cc: the model object is released inside ~Stub).
        self.metrics = self.nvidia = None
        drop_garbage()


def _detokenizer_factory(args: dict, params: dict[str, str]):
    """IncrementalDetokenizer factory for text_output (the two-step ensemble, contract.ensemble_steps) over
    tokenizer_dir: it decodes exactly as the postprocessing step does. None when there is no tokenizer."""
    from ..text.detokenizer import detokenizer_factory
    from ..text.tokenizer import load_tokenizer, parse_bool

    value = params.get("tokenizer_dir") or ""
    if not value or value.startswith("${"):
        return None
    try:
        tokenizer = load_tokenizer(model_path_param(args, params, "tokenizer_dir"))
    except (OSError, ValueError):
        return None
    return detokenizer_factory(tokenizer, skip_special_tokens=parse_bool(params.get("skip_special_tokens"), True))
