"""Triton adapter serving the model `tensorrt_llm` with our engine (NVIDIA's tensorrt_llm tensor contract).

Everything Triton-facing (tensors, batches, streaming, unary mode, cancellation, stop requests, metrics,
error codes) is ``tritonllm.serving.llm_model.LLMTritonModel``, shared with the TensorRT-LLM LLM API
adapter (backends/trtllm_llmapi); this file only plugs in our engine (LLMEngine + EngineRunner, built from
the config parameters by ``tritonllm.serving.engine_backend``).
"""
import os
import sys

import triton_python_backend_utils as pb_utils

# The stub builds sys.path itself (PYTHONPATH is ignored): make the sibling library package importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from tritonllm.serving.engine_backend import build_engine_backend  # noqa: E402
from tritonllm.serving.llm_model import LLMTritonModel  # noqa: E402


class TritonPythonModel(LLMTritonModel):
    pb_utils = pb_utils
    build_backend = staticmethod(build_engine_backend)
