"""Triton adapter serving the model `tensorrt_llm` with TensorRT-LLM's LLM API (profile ``llmapi``, GPU hosts).

Same tensor contract as backends/torchllm (token ids in, token ids out, streaming, cancellation, the
``stop`` input), so the ensemble, the BLS and every client are unchanged: everything Triton-facing is
``tritonllm.serving.llm_model.LLMTritonModel``; this file plugs in ``tensorrt_llm.LLM`` (PyTorch backend,
built from the config parameters by ``tritonllm.trtllm.llmapi_settings``). tensorrt_llm is imported only
when the model loads.
"""
import os
import sys

import triton_python_backend_utils as pb_utils

# The stub builds sys.path itself (PYTHONPATH is ignored): make the sibling library package importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from tritonllm.serving.llm_model import LLMTritonModel  # noqa: E402
from tritonllm.trtllm.llmapi_settings import build_llmapi_backend  # noqa: E402


class TritonPythonModel(LLMTritonModel):
    pb_utils = pb_utils
    build_backend = staticmethod(build_llmapi_backend)
