"""Triton Python-based backend ``detokenizer``: serves model ``postprocessing`` with NVIDIA's tensor
contract (tensorrtllm_backend ``all_models/inflight_batcher_llm/postprocessing``): TOKENS_BATCH,
SEQUENCE_LENGTH (+ optional CUM_LOG_PROBS, OUTPUT_LOG_PROBS, CONTEXT_LOGITS, GENERATION_LOGITS,
BATCH_INDEX passed through as OUT_*) -> OUTPUT. Optional non-NVIDIA inputs REQUEST_KEY / IS_FINAL make
streamed text exact (see ``tritonllm.text.postprocess`` for why and for what the ensemble can carry).
All logic lives in ``tritonllm.text.postprocess``; this file moves tensors.

Config parameters (string_value):
- ``tokenizer_dir``: tokenizer directory; relative = relative to this model's directory.
- ``skip_special_tokens``: default true.
- ``max_stream_states`` (default 1024) / ``stream_state_ttl_s`` (default 60): bounds of the
  per-stream detokenizer state (LRU + idle timeout), so unfinished streams cannot leak.
- ``key_by_request_id``: default false; true keys stream state by the client's request id when the
  engine sends no REQUEST_KEY (the GPU profile; see ``tritonllm.text.postprocess``).

Invariants: one response per request, in order; requests are handled in arrival order, which keeps a
stream's chunks in order. Stream state lives in this process: the model must run ONE instance
(``instance_group { count: 1 }``), otherwise chunks of one stream land in different processes.
"""


import triton_python_backend_utils as pb_utils

from tritonllm.paths import model_parameters, model_path_param
from tritonllm.text.postprocess import Postprocessor
from tritonllm.text.tokenizer import load_tokenizer, parse_bool
from tritonllm.serving.triton_kit import drop_garbage, error_response, read_inputs, trace_crashes


class TritonPythonModel:
    def initialize(self, args):
        trace_crashes()
        config, params = model_parameters(args)
        tokenizer_dir = model_path_param(args, params, "tokenizer_dir")
        self.post = Postprocessor(
            load_tokenizer(tokenizer_dir),
            skip_special_tokens=parse_bool(params.get("skip_special_tokens"), True),
            max_streams=int(params.get("max_stream_states") or 1024),
            stream_ttl_s=float(params.get("stream_state_ttl_s") or 60.0),
            key_by_request_id=parse_bool(params.get("key_by_request_id"), False))
        self.input_names = [t["name"] for t in config.get("input", [])]
        self.output_names = [t["name"] for t in config.get("output", [])]
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
        if instances > 1:
            pb_utils.Logger.log_warn("postprocessing: more than one instance splits streams across processes; "
                                     "streamed text is only exact with instance_group count 1")

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        try:
            inputs = read_inputs(pb_utils, request, self.input_names)
            arrays = self.post.run(inputs, request_id=request.request_id())
            return pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(n, arrays[n]) for n in self.output_names if n in arrays])
        except ValueError as e:
            return error_response(pb_utils, str(e), pb_utils.TritonError.INVALID_ARG)
        except Exception as e:  # keep the other requests of the batch alive
            pb_utils.Logger.log_error(f"postprocessing failed: {e!r}")
            return error_response(pb_utils, f"postprocessing failed: {e}", pb_utils.TritonError.INTERNAL)

    def finalize(self):
        drop_garbage()
