"""Configs rendered from an ONNX graph parse as Triton ModelConfig and carry the graph's tensors."""


import pytest
from google.protobuf import text_format
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType
from sklearn.linear_model import LogisticRegression
from tritonclient.grpc import model_config_pb2 as pb

from classical_configs import cpu_config, gpu_config, render  # noqa: E402


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    x = [[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 2.0, 0.0], [0.5, 0.5, 0.5]]
    model = LogisticRegression().fit(x, [0, 1, 2, 1])
    onx = convert_sklearn(model, initial_types=[("input", FloatTensorType([None, 3]))],
                          options={id(model): {"zipmap": False}}, target_opset=17)
    path = tmp_path_factory.mktemp("cfg") / "model.onnx"
    path.write_bytes(onx.SerializeToString())
    return path


def _parse(text: str) -> pb.ModelConfig:
    return text_format.Parse(text, pb.ModelConfig())


def test_cpu_config_uses_our_backend_with_batching_and_parameters(onnx_path):
    cfg = _parse(render(cpu_config("m", onnx_path, allow_nan=True)))
    assert cfg.backend == "onnxruntime_cpu" and not cfg.platform
    assert cfg.max_batch_size > 0 and cfg.HasField("dynamic_batching")
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("input", pb.TYPE_FP32, [3])]
    outs = {o.name: (o.data_type, list(o.dims), o.HasField("reshape")) for o in cfg.output}
    assert outs == {"label": (pb.TYPE_INT64, [1], False), "probabilities": (pb.TYPE_FP32, [3], False)}
    assert cfg.parameters["allow_nan"].string_value == "true"
    assert cfg.parameters["intra_op_num_threads"].string_value == "1"
    assert cfg.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU


def test_gpu_config_is_native_onnxruntime_on_gpu(onnx_path):
    cfg = _parse(render(gpu_config("m", onnx_path)))
    assert cfg.platform == "onnxruntime_onnx" and not cfg.backend
    assert cfg.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
    label = next(o for o in cfg.output if o.name == "label")
    # The graph's label is [N]: exposed as [N, 1], reshaped to the model's own rank-1 tensor.
    assert list(label.dims) == [1] and label.HasField("reshape") and list(label.reshape.shape) == []
    assert cfg.HasField("dynamic_batching") and not cfg.parameters
