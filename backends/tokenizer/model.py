"""Triton Python-based backend ``tokenizer``: serves model ``preprocessing`` with NVIDIA's tensor
contract (tensorrtllm_backend ``all_models/inflight_batcher_llm/preprocessing``): QUERY,
REQUEST_OUTPUT_LEN, BAD_WORDS_DICT, STOP_WORDS_DICT, EMBEDDING_BIAS_*, END_ID, PAD_ID -> INPUT_ID,
REQUEST_INPUT_LEN, BAD_WORDS_IDS, STOP_WORDS_IDS, EMBEDDING_BIAS, REQUEST_OUTPUT_LEN, OUT_END_ID,
OUT_PAD_ID. All logic lives in ``tritonllm.text.preprocess``; this file moves tensors.

Config parameters (string_value):
- ``tokenizer_dir``: tokenizer directory; relative = relative to this model's directory.
- ``add_special_tokens``: default true (plain prompts only; chat templates carry their own).
- ``chat_template``: off | auto | on (or the boolean ``apply_chat_template``), see tokenizer.CHAT_MODES.
- ``stop_words_in_context``: default true: also encode stop/bad words as they appear after a space
  and glued to text (NVIDIA encodes the bare word only, which rarely matches generated ids).

Invariants: one response per request, in order; a bad request gets an INVALID_ARG error naming the
input and does not affect the other requests of the batch; unexpected failures are INTERNAL. A caller of ours
(request parameter ``errors_as_data``) gets failures as data (tritonllm.errors).
"""


import triton_python_backend_utils as pb_utils

from tritonllm.error_names import with_client_names
from tritonllm.paths import model_parameters, model_path_param
from tritonllm.text.preprocess import preprocess
from tritonllm.text.tokenizer import TextTokenizer, chat_mode_from_params, parse_bool
from tritonllm.serving.triton_kit import (drop_garbage, failure_response, read_inputs, requested_outputs, trace_crashes,
                                         wants_error_data)


class TritonPythonModel:
    def initialize(self, args):
        trace_crashes()
        config, params = model_parameters(args)
        tokenizer_dir = model_path_param(args, params, "tokenizer_dir")
        self.tokenizer = TextTokenizer.from_dir(
            str(tokenizer_dir),
            add_special_tokens=parse_bool(params.get("add_special_tokens"), True),
            chat_mode=chat_mode_from_params(params))
        self.in_context = parse_bool(params.get("stop_words_in_context"), True)
        self.input_names = [t["name"] for t in config.get("input", [])]
        self.output_names = [t["name"] for t in config.get("output", [])]
        pb_utils.Logger.log_info(
            f"preprocessing: tokenizer {tokenizer_dir} (eos {self.tokenizer.eos_id}, pad {self.tokenizer.pad_id}, "
            f"chat {self.tokenizer.chat_mode}, add_special_tokens {self.tokenizer.add_special_tokens})")

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        as_data = wants_error_data(request)  # the BLS asks: Triton 2.51 would hand it our code as INTERNAL
        try:
            inputs = read_inputs(pb_utils, request, self.input_names)
            arrays = preprocess(self.tokenizer, inputs, in_context_words=self.in_context)
            wanted = requested_outputs(request)  # nothing else (triton_kit.requested_outputs: why)
            return pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(n, arrays[n]) for n in self.output_names if n in arrays and n in wanted])
        except ValueError as e:  # named as the ensemble's client knows them too: "QUERY (text_input): ..."
            return failure_response(pb_utils, with_client_names(str(e)), pb_utils.TritonError.INVALID_ARG, as_data)
        except Exception as e:  # keep the other requests of the batch alive
            pb_utils.Logger.log_error(f"preprocessing failed: {e!r}")
            return failure_response(pb_utils, f"preprocessing failed: {e}", pb_utils.TritonError.INTERNAL, as_data)

    def finalize(self):
        drop_garbage()
