"""Classical (scikit-learn -> ONNX) model serving logic, free of Triton imports.

- `settings`   SessionSettings parsed from config parameters (threads, optimisation level, allow_nan).
- `validation` InputSpec read from the ONNX graph; per-request checks that raise InputError naming the input.
- `batching`   concatenate per-request arrays along the batch axis and split outputs back.
- `runner`     OnnxClassifier: one onnxruntime CPU session; validates, batches, runs, splits.
"""

from .batching import concat_requests, split_outputs
from .runner import OnnxClassifier
from .settings import SessionSettings
from .validation import InputError, InputSpec, validate_request

__all__ = [
    "InputError",
    "InputSpec",
    "OnnxClassifier",
    "SessionSettings",
    "concat_requests",
    "split_outputs",
    "validate_request",
]
