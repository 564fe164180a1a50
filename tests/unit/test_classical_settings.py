"""SessionSettings: config parameters -> onnxruntime session options, bad values fail loudly."""

import onnxruntime as ort
import pytest

from tritonllm.classical import SessionSettings


def test_defaults_pin_one_thread_and_forbid_nan():
    s = SessionSettings.from_parameters({})
    assert (s.intra_op_num_threads, s.inter_op_num_threads, s.allow_nan) == (1, 1, False)
    assert s.model_file == "model.onnx"


def test_parameters_reach_session_options():
    s = SessionSettings.from_parameters(
        {
            "intra_op_num_threads": "3",
            "inter_op_num_threads": "2",
            "execution_mode": "Parallel",
            "graph_optimization_level": "basic",
            "allow_nan": "TRUE",
            "unrelated_key": "whatever",
        }
    )
    so = s.session_options()
    assert so.intra_op_num_threads == 3
    assert so.inter_op_num_threads == 2
    assert so.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert s.allow_nan is True


@pytest.mark.parametrize(
    "params, key",
    [
        ({"intra_op_num_threads": "two"}, "intra_op_num_threads"),
        ({"inter_op_num_threads": "-1"}, "inter_op_num_threads"),
        ({"allow_nan": "maybe"}, "allow_nan"),
        ({"execution_mode": "fast"}, "execution_mode"),
        ({"graph_optimization_level": "max"}, "graph_optimization_level"),
        ({"model_file": "../other/model.onnx"}, "model_file"),
    ],
)
def test_bad_values_name_the_parameter(params, key):
    with pytest.raises(ValueError, match=key):
        SessionSettings.from_parameters(params)
