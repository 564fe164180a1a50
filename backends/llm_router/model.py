"""Triton Python-based backend ``llm_router``: serves models ``llm_router`` (mode ``route``, a BLS cascade) and
``moderated_llm`` (mode ``moderate``), both decoupled, with the client contract of ``tensorrt_llm_bls``
plus outputs ``route``, ``moderation_label``, ``moderation_probabilities``.

Per request, on a worker thread (``execute`` returns at once): validate (``bls_stream.parse_request``, so a
bad input is INVALID_ARG naming it before any model runs), then
- route: ``guard_model`` via BLS ``exec()`` -> ``routing.decide`` -> refusal (one response, no LLM call)
  or the chosen slot via ``exec(decoupled=True)`` with the client's tensors unchanged;
- moderate: ``answer_model`` is started first, ``guard_model`` runs meanwhile;
and the answering model's responses are relayed by ``routing.Relay``. Logic: tritonllm.routing.

Cancellation: Triton 2.51's python_backend cannot cancel a BLS response iterator, so a cancelled client
stops receiving at once, but the chosen slot finishes its request (bounded by max_tokens); the iterator
is always drained so nothing stays pending.

Config parameters (string_value): mode, guard_model, small_model, large_model, min_confidence,
refusal_message, answer_model, max_inflight_requests (worker threads, default 64).
"""
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

# The stub builds sys.path itself (PYTHONPATH is ignored): make the sibling library package importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from tritonllm import contract as C  # noqa: E402
from tritonllm import routing as R  # noqa: E402
from tritonllm.errors import InnerError  # noqa: E402
from tritonllm.serving import triton_kit as K  # noqa: E402
from tritonllm.text import bls_stream as B  # noqa: E402
from tritonllm.text.preprocess import InvalidInput  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        K.trace_crashes()
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.config = R.RouterConfig.from_params(params)
        self.input_names = [t["name"] for t in config.get("input", [])]
        self.output_names = {t["name"] for t in config.get("output", [])}
        self.name = config.get("name", "llm_router")
        extra = {C.ROUTE_OUTPUT.name, *C.MODERATION_OUTPUT_NAMES.values()}
        self.inner_outputs = sorted(self.output_names - extra)  # what the answering model itself returns
        self.pool = ThreadPoolExecutor(max_workers=int(params.get("max_inflight_requests") or 64),
                                       thread_name_prefix="router")
        self.drained = K.DrainedIterators()  # every response iterator goes there once drained (why: its docstring)

    def execute(self, requests):
        for request in requests:
            arrays = K.read_inputs(pb_utils, request, self.input_names)
            self.pool.submit(self._run, request.get_response_sender(), arrays, K.requested_outputs(request))
        self.drained.prune()
        return None

    # ---- worker thread -----------------------------------------------------------------------------
    def _run(self, sender, arrays, outputs):
        try:
            if len(B.split_rows(arrays)) != 1:
                raise InvalidInput(f"text_input: {self.name} takes one prompt per request (batch size 1)")
            req = B.parse_request(arrays)
            if self.config.mode == R.MODERATE:
                # The answer does not depend on the verdict: the LLM starts first, the classifier
                # (about a millisecond) runs while the prompt is prefilled.
                responses = self._start(self.config.answer_model, arrays)
                try:
                    verdict = self._classify(req.text)
                except BaseException:
                    for _ in responses:  # drained: nothing may stay pending
                        pass
                    self.drained.keep(responses)
                    raise
                self._relay(sender, outputs, R.decide(self.config, verdict), req.stream, responses)
                return
            route = R.decide(self.config, self._classify(req.text))
            if route.model is None:  # refused: the LLM is never called
                sender.send(self._response(R.refusal_outputs(self.config, route), outputs), flags=FINAL)
            else:
                self._relay(sender, outputs, route, req.stream, self._start(route.model, arrays))
        except Exception as e:  # never let one request take the model down
            K.send_error(pb_utils, sender, *K.failure(pb_utils, e, self.name))

    def _classify(self, text):
        inputs = [pb_utils.Tensor(k, v) for k, v in R.guard_inputs(text).items()]
        resp = pb_utils.InferenceRequest(model_name=self.config.guard_model, inputs=inputs,
                                         requested_output_names=["label", "probabilities"]).exec()
        if resp.has_error():
            raise InnerError(f"{self.config.guard_model}: {resp.error().message()}", K.inner_code(pb_utils, resp.error()))
        return R.parse_verdict({t.name(): t.as_numpy() for t in resp.output_tensors()})

    def _start(self, model, arrays):
        """Send the client's tensors unchanged to ``model`` (same contract); its response iterator."""
        return pb_utils.InferenceRequest(
            model_name=model, inputs=[pb_utils.Tensor(k, v) for k, v in arrays.items()],
            requested_output_names=self.inner_outputs).exec(decoupled=True)

    def _relay(self, sender, outputs, route, stream, responses):
        relay = R.Relay(stream, R.route_outputs(route))
        error, cancelled = None, False
        for resp in responses:  # drained to the end: nothing may stay pending
            if error is not None or cancelled:
                continue
            if resp.has_error():
                error = InnerError(resp.error().message(), K.inner_code(pb_utils, resp.error()))
                continue
            tensors = resp.output_tensors()
            if not tensors:  # the inner flag-only final response
                continue
            now = relay.push({t.name(): t.as_numpy() for t in tensors})
            if now is not None:
                if sender.is_cancelled():
                    cancelled = True
                    continue
                sender.send(self._response(now, outputs), flags=0)
        self.drained.keep(responses)
        if error is not None:
            raise error
        final = relay.close()
        if final is None:
            sender.send(flags=FINAL)
        else:
            sender.send(self._response(final, outputs), flags=FINAL)

    def _response(self, arrays, outputs):
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items() if k in outputs])  # K.requested_outputs

    def finalize(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.drained.clear()
        K.drop_garbage()

