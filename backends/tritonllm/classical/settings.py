"""Session settings for the CPU onnxruntime backend, parsed from Triton config parameters.

Invariant: every known key is validated here (a bad value raises ValueError naming the key), so a
misconfigured model fails at load time rather than on its first request. Unknown keys are ignored:
the same parameters map also carries keys meant for other layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_OPT_LEVELS = ("disable", "basic", "extended", "all")
_EXEC_MODES = ("sequential", "parallel")


def _parse_bool(key: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"parameter {key!r}: expected true/false, got {value!r}")


def _parse_threads(key: str, value: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise ValueError(f"parameter {key!r}: expected an integer, got {value!r}") from None
    if n < 0:
        # 0 is onnxruntime's "pick for me"; negatives have no meaning.
        raise ValueError(f"parameter {key!r}: must be >= 0, got {n}")
    return n


def _parse_choice(key: str, value: str, choices: tuple[str, ...]) -> str:
    v = value.strip().lower()
    if v not in choices:
        raise ValueError(f"parameter {key!r}: expected one of {choices}, got {value!r}")
    return v


@dataclass(frozen=True)
class SessionSettings:
    """What the backend needs to build an onnxruntime session and to validate inputs.

    intra_op_num_threads / inter_op_num_threads: 0 lets onnxruntime choose (all cores), which is
    wrong next to other models on a shared CPU, hence the default of 1.
    allow_nan: when False, NaN and +/-inf in float inputs are rejected as INVALID_ARG; models
    that handle missing values natively (HistGradientBoosting) set it to true.
    """

    model_file: str = "model.onnx"
    intra_op_num_threads: int = 1
    inter_op_num_threads: int = 1
    execution_mode: str = "sequential"
    graph_optimization_level: str = "all"
    allow_nan: bool = False

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> "SessionSettings":
        """Build from Triton's `parameters` map (already flattened to key -> string_value)."""
        kw: dict = {}
        if "model_file" in params:
            name = params["model_file"].strip()
            # The file is resolved inside <model_dir>/<version>/; a path separator would escape it.
            if not name or "/" in name or "\\" in name or name in (".", ".."):
                raise ValueError(f"parameter 'model_file': expected a bare file name, got {name!r}")
            kw["model_file"] = name
        for key in ("intra_op_num_threads", "inter_op_num_threads"):
            if key in params:
                kw[key] = _parse_threads(key, params[key])
        if "execution_mode" in params:
            kw["execution_mode"] = _parse_choice("execution_mode", params["execution_mode"], _EXEC_MODES)
        if "graph_optimization_level" in params:
            kw["graph_optimization_level"] = _parse_choice(
                "graph_optimization_level", params["graph_optimization_level"], _OPT_LEVELS
            )
        if "allow_nan" in params:
            kw["allow_nan"] = _parse_bool("allow_nan", params["allow_nan"])
        return cls(**kw)

    def session_options(self):
        """onnxruntime.SessionOptions carrying these settings (import deferred: keeps parsing testable alone)."""
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = self.intra_op_num_threads
        so.inter_op_num_threads = self.inter_op_num_threads
        so.execution_mode = {
            "sequential": ort.ExecutionMode.ORT_SEQUENTIAL,
            "parallel": ort.ExecutionMode.ORT_PARALLEL,
        }[self.execution_mode]
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.graph_optimization_level]
        return so
