"""Triton adapter serving the model `tensorrt_llm` with our engine (NVIDIA's tensorrt_llm tensor contract).

Thin by intent: tensors -> tritonllm.llm_io -> EngineRunner; engine outputs -> responses. Decoupled: one
engine on a background thread serves every request; streaming sends each new-token delta, otherwise one
response at the end. Client cancellation and the `stop` input abort the request and free its KV blocks.
"""
import itertools
import logging
import os
import queue
import sys
import threading
import time

import triton_python_backend_utils as pb_utils

# The stub builds sys.path itself (PYTHONPATH is ignored): make the sibling library package importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from tritonllm.contract import with_client_names
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.lora import parse_adapter_list
from tritonllm.engine.request import InvalidRequest, QueueFull
from tritonllm.engine.runner import EngineRunner
from tritonllm.llm_io import DRAFT_MODEL_MODES, engine_config_from_parameters, parse_request, response_arrays
from tritonllm.metrics import COUNTER, GAUGE, HISTOGRAM, LLMMetrics
from tritonllm.paths import model_parameters, model_path_param, model_path_value

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


class _Stream:
    __slots__ = ("sender", "triton_id", "prompt", "streaming", "exclude_input", "tokens", "logprobs",
                 "arrival", "first_token", "num_out")

    def __init__(self, sender, triton_id, parsed):
        self.sender = sender
        self.triton_id = triton_id
        self.prompt = parsed.prompt_ids
        self.streaming = parsed.streaming
        self.exclude_input = parsed.exclude_input
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.arrival = time.monotonic()
        self.first_token: float | None = None
        self.num_out = 0

    def timings(self) -> tuple[float | None, float | None]:
        """(time to first token, mean time per later output token) as the client saw them."""
        if self.first_token is None:
            return None, None
        ttft = self.first_token - self.arrival
        tpot = (time.monotonic() - self.first_token) / (self.num_out - 1) if self.num_out > 1 else None
        return ttft, tpot


class TritonPythonModel:
    def initialize(self, args):
        lib_log = logging.getLogger("tritonllm")
        if not any(isinstance(h, _TritonLogHandler) for h in lib_log.handlers):
            lib_log.addHandler(_TritonLogHandler(logging.WARNING))
        config, params = model_parameters(args)
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
        self.logger = pb_utils.Logger
        self.streams: dict[str, _Stream] = {}
        self.lock = threading.Lock()
        self.ids = itertools.count()
        self.metrics = LLMMetrics(_metric_family, args["model_name"],
                                  float(params.get("cost_per_instance_hour_usd", "0") or 0))
        # Responses leave on their own thread: each send is a round trip to the server process, and made
        # from the engine thread they would stall the next step (16 streams = 16 round trips per step).
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.responder = threading.Thread(target=self._respond, name="llm-responses", daemon=True)
        self.responder.start()
        self.runner = EngineRunner(self.engine, self.outbox.put).start()
        self.closing = threading.Event()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()
        self.logger.log_info(f"tensorrt_llm: engine ready ({model_path}, device {self.engine.model.device}, "
                             f"dtype {self.engine.model.dtype}, {self.engine.pool.num_blocks} KV blocks)")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                arrays = {}
                for name in ("input_ids", "input_lengths", "request_output_len", "end_id", "pad_id",
                             "beam_width", "runtime_top_k", "num_return_sequences", "min_tokens",
                             "temperature", "runtime_top_p", "repetition_penalty", "presence_penalty",
                             "frequency_penalty", "len_penalty", "seed", "streaming", "return_log_probs",
                             "exclude_input_in_output", "stop", "return_context_logits",
                             "return_generation_logits", "stop_words_list", "bad_words_list",
                             "guided_decoding_guide_type", "guided_decoding_guide", "lora_task_id",
                             "lora_weights", "lora_config", "embedding_bias"):
                    t = pb_utils.get_input_tensor_by_name(request, name)
                    if t is not None:
                        arrays[name] = t.as_numpy()
                parsed = parse_request(arrays, self.default_exclude_input)
                if parsed.stop:
                    self._stop(request.request_id())
                    sender.send(flags=FINAL)
                    continue
                rid = str(next(self.ids))
                with self.lock:
                    self.streams[rid] = _Stream(sender, request.request_id(), parsed)
                try:
                    self.runner.submit(rid, parsed.prompt_ids, parsed.params)
                except Exception:
                    with self.lock:
                        self.streams.pop(rid, None)
                    raise
            except InvalidRequest as e:  # plus the ensemble's input names: "request_output_len (max_tokens)"
                self._fail(sender, with_client_names(str(e)), pb_utils.TritonError.INVALID_ARG)
            except QueueFull as e:
                self._fail(sender, str(e), pb_utils.TritonError.UNAVAILABLE)
            except Exception as e:  # never let one request take the model down
                self._fail(sender, f"internal error: {e}", pb_utils.TritonError.INTERNAL)
        return None

    @staticmethod
    def _fail(sender, message, code):
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code)), flags=FINAL)

    def _stop(self, triton_id):
        with self.lock:
            targets = [rid for rid, s in self.streams.items() if s.triton_id == triton_id and triton_id]
        for rid in targets:
            self.runner.abort(rid)

    def _response(self, arrays):
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items() if k in self.output_names])

    def _respond(self):
        while (out := self.outbox.get()) is not None:
            try:
                self._on_output(out)
            except Exception as e:  # one failed send must not stop the others' responses
                self.logger.log_error(f"tensorrt_llm: response for {out.request_id} failed: {e}")

    def _on_output(self, out):
        with self.lock:
            s = self.streams.get(out.request_id)
            if s is not None and out.finished:
                del self.streams[out.request_id]
        if s is None:
            return
        if out.new_token_ids:
            s.num_out += len(out.new_token_ids)
            if s.first_token is None:
                s.first_token = time.monotonic()
        if out.finished and out.finish_reason in ("stop", "length"):
            self.metrics.observe_request(*s.timings())
        if out.error:
            self._fail(s.sender, out.error, pb_utils.TritonError.INTERNAL)
            return
        if out.finish_reason == "abort":
            if s.sender.is_cancelled():
                self._fail(s.sender, "request cancelled", pb_utils.TritonError.CANCELLED)
            else:  # the `stop` input: finish normally with what was produced
                s.sender.send(flags=FINAL)
            return
        if s.streaming:
            # A finished stream always ends with a data response (possibly of 0 tokens) carrying
            # is_final, so a stateful postprocessing step learns that the sequence ended.
            if out.new_token_ids or out.finished:
                arrays = response_arrays(out.new_token_ids, out.new_logprobs, out.cum_logprob,
                                         out.num_prompt_tokens, out.num_output_tokens,
                                         int(out.request_id), out.finished)
                s.sender.send(self._response(arrays), flags=FINAL if out.finished else 0)
            return
        s.tokens.extend(out.new_token_ids)
        s.logprobs.extend(out.new_logprobs)
        if out.finished:
            ids = s.tokens if s.exclude_input else s.prompt + s.tokens
            arrays = response_arrays(ids, s.logprobs, out.cum_logprob, out.num_prompt_tokens,
                                     out.num_output_tokens, int(out.request_id), True)
            s.sender.send(self._response(arrays), flags=FINAL)

    def _watch(self):
        """Aborts requests whose client cancelled; publishes engine metrics about every 0.5 s."""
        last_publish = 0.0
        while not self.closing.wait(self.cancel_period):
            with self.lock:
                cancelled = [rid for rid, s in self.streams.items() if s.sender.is_cancelled()]
            for rid in cancelled:
                self.runner.abort(rid)
            if time.monotonic() - last_publish >= 0.5:
                last_publish = time.monotonic()
                self.metrics.publish(self.engine.stats, *self.engine.load())

    def finalize(self):
        self.closing.set()
        self.runner.shutdown(timeout=30.0)
        self.outbox.put(None)  # after the runner's last output: every final response is sent first
        self.responder.join(10.0)
