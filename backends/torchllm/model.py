"""Triton adapter serving the model `tensorrt_llm` with our engine (NVIDIA's tensorrt_llm tensor contract).

Thin by intent: tensors -> tritonllm.llm_io -> EngineRunner; engine outputs -> tritonllm.llm_jobs ->
responses. One engine on a background thread serves every request. Decoupled or not as the config says
(NVIDIA's ``decoupled_mode``): decoupled answers each batch row on its own and streams; unary sends one
response per request, through the response sender too, so ``execute`` never blocks on generation.
Client cancellation and NVIDIA's ``stop`` request abort engine requests, which frees their KV blocks.
Metrics: ours (tritonllm.metrics.LLMMetrics) and NVIDIA's families (NvidiaMetrics), whose
iteration-stats JSON is also logged at verbose level as NVIDIA's backend logs it.
"""
import json
import logging
import os
import queue
import sys
import threading
import time

import triton_python_backend_utils as pb_utils

# The stub builds sys.path itself (PYTHONPATH is ignored): make the sibling library package importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from tritonllm.error_names import with_client_names  # noqa: E402
from tritonllm.engine.engine import LLMEngine  # noqa: E402
from tritonllm.engine.lora import parse_adapter_list  # noqa: E402
from tritonllm.engine.request import InvalidRequest, QueueFull  # noqa: E402
from tritonllm.engine.runner import EngineRunner  # noqa: E402
from tritonllm.llm_io import (DRAFT_MODEL_MODES, INPUT_NAMES, STREAMING_NEEDS_DECOUPLED,  # noqa: E402
                              engine_config_from_parameters, parse_request, wants_ensemble_names)
from tritonllm.llm_jobs import CANCELLED, Jobs  # noqa: E402
from tritonllm.metrics import (COUNTER, GAUGE, HISTOGRAM, LLMMetrics, NvidiaMetrics,  # noqa: E402
                               iteration_stats)
from tritonllm.paths import model_parameters, model_path_param, model_path_value  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _TritonLogHandler(logging.Handler):
    """Routes the library's `logging` records (engine thread errors) into Triton's log."""

    def emit(self, record):
        msg = self.format(record)
        (pb_utils.Logger.log_error if record.levelno >= logging.ERROR else pb_utils.Logger.log_warn)(msg)


def _metric_family(name, description, kind):
    kinds = {COUNTER: pb_utils.MetricFamily.COUNTER, GAUGE: pb_utils.MetricFamily.GAUGE,
             HISTOGRAM: getattr(pb_utils.MetricFamily, "HISTOGRAM", None)}
    if kinds[kind] is None:
        return None  # no native histograms in this Triton: LLMMetrics builds them from counters
    return pb_utils.MetricFamily(name=name, description=description, kind=kinds[kind]).Metric


def _resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class TritonPythonModel:
    def initialize(self, args):
        lib_log = logging.getLogger("tritonllm")
        if not any(isinstance(h, _TritonLogHandler) for h in lib_log.handlers):
            lib_log.addHandler(_TritonLogHandler(logging.WARNING))
        config, params = model_parameters(args)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.output_names = {o["name"] for o in config.get("output", [])}
        model_path = str(model_path_param(args, params, "gpt_model_path"))
        engine_config, self.default_exclude_input = engine_config_from_parameters(params)
        tokenizer_dir = params.get("tokenizer_dir", "")
        if tokenizer_dir and not tokenizer_dir.startswith("${"):
            engine_config.tokenizer_dir = str(model_path_param(args, params, "tokenizer_dir", must_exist=False))
        engine_config.lora_adapters = {  # "1=../../build/models/demo-lora/x, 2=..." confined like every path
            tid: str(model_path_value(args, p, f"lora_adapters[{tid}]"))
            for tid, p in parse_adapter_list(params.get("lora_adapters", "")).items()}
        if params.get("speculative_decoding_mode") in DRAFT_MODEL_MODES:
            engine_config.draft_model_path = str(model_path_param(args, params, "draft_model_path"))
        self.engine = LLMEngine(model_path, engine_config)
        self.cancel_period = float(params.get("cancellation_check_period_ms", "50") or 50) / 1000.0
        self.stats_period = float(params.get("stats_check_period_ms", "100") or 100) / 1000.0
        self.jobs = Jobs()
        self.metrics = LLMMetrics(_metric_family, args["model_name"],
                                  float(params.get("cost_per_instance_hour_usd", "0") or 0))
        self.nvidia = NvidiaMetrics(_metric_family, args["model_name"], args["model_version"])
        # Responses leave on their own thread: each send is a round trip to the server process, and made
        # from the engine thread they would stall the next step (16 streams = 16 round trips per step).
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.responder = threading.Thread(target=self._respond, name="llm-responses", daemon=True)
        self.responder.start()
        self.runner = EngineRunner(self.engine, self.outbox.put).start()
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()
        pb_utils.Logger.log_info(
            f"tensorrt_llm: engine ready ({model_path}, device {self.engine.model.device}, dtype "
            f"{self.engine.model.dtype}, {self.engine.pool.num_blocks} KV blocks, "
            f"{'decoupled' if self.decoupled else 'unary (not decoupled)'})")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            ensemble = False
            try:
                arrays = {}
                for name in INPUT_NAMES:
                    t = pb_utils.get_input_tensor_by_name(request, name)
                    if t is not None:
                        arrays[name] = t.as_numpy()
                ensemble = wants_ensemble_names(arrays)
                batch = parse_request(arrays, self.default_exclude_input)
                if batch.stop:
                    self._stop(request.request_id())
                    sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)
                    continue
                if not self.decoupled and any(row.streaming for row in batch.rows):
                    raise InvalidRequest(f"streaming: {STREAMING_NEEDS_DECOUPLED}")
                job = self.jobs.add(sender, request.request_id(), batch, self.decoupled)
                try:
                    self.runner.submit_all([(r.rid, r.request.prompt_ids, r.request.params) for r in job.rows])
                except Exception:
                    self.jobs.forget(job)
                    raise
            except InvalidRequest as e:  # through the ensemble, also its input names: "request_output_len (max_tokens)"
                self._fail(sender, with_client_names(str(e)) if ensemble else str(e), pb_utils.TritonError.INVALID_ARG)
            except QueueFull as e:
                self._fail(sender, str(e), pb_utils.TritonError.UNAVAILABLE)
            except Exception as e:  # never let one request take the model down
                self._fail(sender, f"internal error: {e}", pb_utils.TritonError.INTERNAL)
        return None

    @staticmethod
    def _fail(sender, message, code):
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)

    def _stop(self, triton_id):
        if not triton_id:
            raise InvalidRequest("stop: a stop request must carry the request id of the request to stop")
        for rid in self.jobs.rows_of(triton_id):  # an unknown id is not an error: it may have finished
            self.runner.abort(rid)

    def _respond(self):
        while (out := self.outbox.get()) is not None:
            try:
                replies, abort, finished = self.jobs.on_output(out)
                for rid in abort:
                    self.runner.abort(rid)
                if finished is not None:
                    self.metrics.observe_request(finished.ttft, finished.tpot)
                    self.nvidia.observe(finished.prompt_tokens, finished.output_tokens)
                for reply in replies:
                    self._send(reply)
            except Exception as e:  # one failed send must not stop the others' responses
                pb_utils.Logger.log_error(f"tensorrt_llm: response for {out.request_id} failed: {e}")

    def _send(self, reply):
        flags = FINAL if reply.final else 0
        if reply.error is not None:
            code = pb_utils.TritonError.CANCELLED if reply.code == CANCELLED else pb_utils.TritonError.INTERNAL
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(reply.error, code))
        else:
            response = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(k, v) for k, v in (reply.arrays or {}).items() if k in self.output_names])
        reply.sender.send(response, flags=flags)

    def _watch(self):
        """Aborts requests whose client cancelled; publishes our metrics about every 0.5 s and NVIDIA's
        after each new engine iteration (at most every stats_check_period_ms)."""
        last_publish = last_stats = 0.0
        last_iteration = -1
        while not self.closing.wait(min(self.cancel_period, self.stats_period)):
            for rid in self.jobs.cancelled(lambda sender: sender.is_cancelled()):
                self.runner.abort(rid)
            now = time.monotonic()
            if now - last_publish >= 0.5:
                last_publish = now
                self.metrics.publish(self.engine.stats, *self.engine.load())
            step = self.engine.last_step
            if now - last_stats >= self.stats_period and step.iteration != last_iteration:
                last_stats, last_iteration = now, step.iteration
                self._publish_iteration(step)

    def _publish_iteration(self, step):
        e = self.engine
        gpu = 0
        if e.model.device.type == "cuda":
            import torch

            gpu = torch.cuda.memory_allocated(e.model.device)
        stats = iteration_stats(step, e.config.max_num_seqs, e.pool.num_blocks, e.config.block_size,
                                e.stats.reused_blocks, _resident_bytes(), gpu)
        self.nvidia.publish(stats)
        pb_utils.Logger.log_verbose(json.dumps(stats))  # as NVIDIA's backend logs its iteration stats

    def finalize(self):
        self.closing.set()
        self.runner.shutdown(timeout=30.0)
        self.outbox.put(None)  # after the runner's last output: every final response is sent first
        self.responder.join(10.0)
