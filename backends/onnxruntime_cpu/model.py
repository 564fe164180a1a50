"""Triton Python-based backend `onnxruntime_cpu`: scikit-learn ONNX exports on onnxruntime CPU.

A model selects it with `backend: "onnxruntime_cpu"`; its graph is `<model_dir>/<version>/model.onnx`
(parameter `model_file` changes the name). Parameters: intra_op_num_threads, inter_op_num_threads,
execution_mode, graph_optimization_level, allow_nan (see tritonllm.classical.settings).

Thin adapter: tensors in -> tritonllm.classical.OnnxClassifier -> responses out. With dynamic
batching Triton hands `execute` several requests; they run as one session.run, and a bad request
gets its own INVALID_ARG response without failing the others.
"""

import json
import os

import triton_python_backend_utils as pb_utils

from tritonllm.classical import InputError, OnnxClassifier, SessionSettings
from tritonllm.serving.triton_kit import drop_garbage, error_response, trace_crashes


class TritonPythonModel:
    def initialize(self, args):
        trace_crashes()
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        settings = SessionSettings.from_parameters(params)
        path = os.path.join(args["model_repository"], args["model_version"], settings.model_file)
        self._model = OnnxClassifier(path, settings)
        self._model.check_config([i["name"] for i in config["input"]], [o["name"] for o in config["output"]])

    def execute(self, requests):
        arrays = [{t.name(): t.as_numpy() for t in request.inputs()} for request in requests]
        responses = []
        for result in self._model.run(arrays):
            if isinstance(result, InputError):
                responses.append(error_response(pb_utils, str(result), pb_utils.TritonError.INVALID_ARG))
            elif isinstance(result, Exception):
                responses.append(error_response(pb_utils, f"inference failed: {result}", pb_utils.TritonError.INTERNAL))
            else:
                tensors = [pb_utils.Tensor(name, value) for name, value in result.items()]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self):
        drop_garbage()
