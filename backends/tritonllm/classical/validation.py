"""Input specs read from an ONNX graph, and per-request validation against them.

Invariants:
- Every rejection is an InputError whose `input_name` is the offending tensor (or None for a
  request-level problem) and whose message names it, so the client can tell which tensor to fix.
- A validated request is ready for onnxruntime: numeric arrays have exactly the graph's dtype and
  shape, string arrays are object arrays of `str` (Triton delivers BYTES as `bytes`).
- Dtypes are never cast silently: a float64 array sent to a float32 model is an error, because
  the caller's numbers would otherwise be rounded without their knowledge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..errors import InvalidInput

# onnxruntime's type strings for the element types scikit-learn models use.
_ORT_TO_NUMPY = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(string)": np.dtype(object),
}


class InputError(InvalidInput):
    """A request the model cannot accept (INVALID_ARG), with the offending input's name."""

    def __init__(self, input_name: str | None, message: str):
        super().__init__(message)
        self.input_name = input_name


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, numpy dtype (object for strings) and shape (None = dynamic dim).

    shape[0] is the batch axis; scikit-learn exports always have one.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    @property
    def is_string(self) -> bool:
        return self.dtype == np.dtype(object)

    @property
    def is_float(self) -> bool:
        return self.dtype.kind == "f"

    @classmethod
    def from_node_arg(cls, arg) -> "InputSpec":
        """From an onnxruntime NodeArg (session.get_inputs()); symbolic dims become None."""
        if arg.type not in _ORT_TO_NUMPY:
            raise ValueError(f"input {arg.name!r}: unsupported ONNX type {arg.type}")
        shape = tuple(d if isinstance(d, int) and d > 0 else None for d in arg.shape)
        if not shape:
            raise ValueError(f"input {arg.name!r}: scalar graph inputs cannot be batched")
        return cls(arg.name, _ORT_TO_NUMPY[arg.type], shape)


def _type_name(dtype: np.dtype) -> str:
    return "string" if dtype == np.dtype(object) else str(dtype)


def _as_strings(spec: InputSpec, arr: np.ndarray) -> np.ndarray:
    """Object array of str from bytes/str elements; invalid UTF-8 or non-text is an InputError."""
    if arr.dtype.kind not in "OSU":
        raise InputError(spec.name, f"input {spec.name!r} has dtype {arr.dtype}, model expects string (BYTES)")
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, item in enumerate(flat_in):
        if isinstance(item, (bytes, np.bytes_)):
            try:
                flat_out[i] = bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(spec.name, f"input {spec.name!r} element {i} is not valid UTF-8") from None
        elif isinstance(item, str):
            flat_out[i] = str(item)
        else:
            raise InputError(spec.name, f"input {spec.name!r} element {i} is {type(item).__name__}, not text")
    return out


def _check_shape(spec: InputSpec, arr: np.ndarray) -> None:
    if arr.ndim != len(spec.shape):
        raise InputError(
            spec.name, f"input {spec.name!r} has rank {arr.ndim} (shape {list(arr.shape)}), model expects rank {len(spec.shape)}"
        )
    if arr.shape[0] == 0:
        raise InputError(spec.name, f"input {spec.name!r} has no rows")
    for axis, (want, got) in enumerate(zip(spec.shape[1:], arr.shape[1:]), start=1):
        if want is not None and want != got:
            what = "features" if axis == 1 and arr.ndim == 2 else f"elements on axis {axis}"
            raise InputError(spec.name, f"input {spec.name!r} has {got} {what}, model expects {want}")


def _check_finite(spec: InputSpec, arr: np.ndarray) -> None:
    bad = ~np.isfinite(arr)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        kind = "NaN" if np.isnan(arr).any() else "infinite values"
        raise InputError(
            spec.name, f"input {spec.name!r} contains {kind} (first at row {row}); this model does not allow missing values"
        )


def validate_request(
    specs: Sequence[InputSpec], arrays: Mapping[str, np.ndarray], allow_nan: bool
) -> dict[str, np.ndarray]:
    """Check one request's tensors against the graph and return them ready for onnxruntime.

    Raises InputError on: a missing or unexpected input, wrong dtype, wrong rank or feature count,
    zero rows, rows disagreeing across inputs, invalid text, NaN/inf when `allow_nan` is False.
    """
    expected = {s.name for s in specs}
    extra = sorted(set(arrays) - expected)
    if extra:
        raise InputError(extra[0], f"input {extra[0]!r} is not an input of this model (inputs: {sorted(expected)})")
    ready: dict[str, np.ndarray] = {}
    rows: int | None = None
    for spec in specs:
        if spec.name not in arrays:
            raise InputError(spec.name, f"input {spec.name!r} is missing")
        arr = np.asarray(arrays[spec.name])
        if spec.is_string:
            arr = _as_strings(spec, arr)
        elif arr.dtype != spec.dtype:
            raise InputError(
                spec.name, f"input {spec.name!r} has dtype {_type_name(arr.dtype)}, model expects {_type_name(spec.dtype)}"
            )
        _check_shape(spec, arr)
        if spec.is_float and not allow_nan:
            _check_finite(spec, arr)
        if rows is not None and arr.shape[0] != rows:
            raise InputError(spec.name, f"input {spec.name!r} has {arr.shape[0]} rows, other inputs have {rows}")
        rows = arr.shape[0]
        ready[spec.name] = arr
    return ready
