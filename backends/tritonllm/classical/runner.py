"""OnnxClassifier: one onnxruntime CPU session serving many requests per call.

Invariants:
- `run(requests)` returns one entry per request, in order: a dict of output arrays, or the
  exception for that request (InputError for bad input). One bad request never fails the others:
  invalid requests are set aside before the batched run, and if the batched run itself raises,
  each request is re-run alone so only the one that triggers the failure gets the error.
- Outputs are numpy arrays with a leading batch axis; string outputs are object arrays of bytes
  (what Triton BYTES tensors carry).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .batching import concat_requests, split_outputs
from .settings import SessionSettings
from .validation import InputError, InputSpec, validate_request

Result = dict[str, np.ndarray] | Exception


def _to_bytes(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind not in "OU":
        return arr
    out = np.empty(arr.shape, dtype=object)
    out.reshape(-1)[:] = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in arr.reshape(-1)]
    return out


class OnnxClassifier:
    """A scikit-learn ONNX export on CPUExecutionProvider, with per-request validation."""

    def __init__(self, model_path: str, settings: SessionSettings | None = None):
        import onnxruntime as ort

        self.settings = settings or SessionSettings()
        self.session = ort.InferenceSession(
            model_path, sess_options=self.settings.session_options(), providers=["CPUExecutionProvider"]
        )
        self.input_specs = [InputSpec.from_node_arg(a) for a in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def check_config(self, input_names: Sequence[str], output_names: Sequence[str]) -> None:
        """Fail loading when the Triton config names tensors the graph lacks (config drift)."""
        graph_in = {s.name for s in self.input_specs}
        if set(input_names) != graph_in:
            raise ValueError(f"config inputs {sorted(input_names)} != ONNX graph inputs {sorted(graph_in)}")
        missing = sorted(set(output_names) - set(self.output_names))
        if missing:
            raise ValueError(f"config outputs {missing} are not ONNX graph outputs {self.output_names}")

    def _run(self, inputs: Mapping[str, np.ndarray], rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
        values = self.session.run(self.output_names, dict(inputs))
        outputs = {n: _to_bytes(np.asarray(v)) for n, v in zip(self.output_names, values)}
        return split_outputs(outputs, rows)

    def run(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[Result]:
        """Validate each request, run all valid ones in one session.run, split back per request."""
        results: list[Result | None] = [None] * len(requests)
        valid_idx: list[int] = []
        valid: list[dict[str, np.ndarray]] = []
        for i, arrays in enumerate(requests):
            try:
                valid.append(validate_request(self.input_specs, arrays, self.settings.allow_nan))
                valid_idx.append(i)
            except InputError as e:
                results[i] = e
        if valid:
            stacked, rows = concat_requests(valid)
            try:
                for i, out in zip(valid_idx, self._run(stacked, rows)):
                    results[i] = out
            except Exception:
                # Isolate the failure: re-run each request alone so healthy ones still succeed.
                for i, arrays in zip(valid_idx, valid):
                    try:
                        results[i] = self._run(arrays, [next(iter(arrays.values())).shape[0]])[0]
                    except Exception as e:  # noqa: BLE001 - reported per request, not swallowed
                        results[i] = e
        return results  # type: ignore[return-value]
