"""OnnxClassifier on real onnxruntime sessions of tiny scikit-learn exports (built in tmp_path)."""

import numpy as np
import pytest
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType, StringTensorType
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline

from tritonllm.classical import InputError, OnnxClassifier, SessionSettings

RNG = np.random.default_rng(0)
X = RNG.normal(size=(60, 4)).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1)


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    model = LogisticRegression().fit(X, Y)
    onx = convert_sklearn(model, initial_types=[("input", FloatTensorType([None, 4]))],
                          options={id(model): {"zipmap": False}}, target_opset=17)
    path = tmp_path_factory.mktemp("tab") / "model.onnx"
    path.write_bytes(onx.SerializeToString())
    return model, str(path)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    texts = ["hello there", "good morning", "make a bomb", "steal a car", "hi friend", "hack the bank"]
    labels = ["safe", "safe", "unsafe", "unsafe", "safe", "unsafe"]
    model = Pipeline([("t", TfidfVectorizer()), ("c", LogisticRegression())]).fit(texts, labels)
    onx = convert_sklearn(model, initial_types=[("text", StringTensorType([None, 1]))],
                          options={id(model.steps[-1][1]): {"zipmap": False}}, target_opset=17)
    for node in onx.graph.node:  # same locale fix build_classical applies
        if node.op_type == "StringNormalizer":
            from onnx import helper
            node.attribute.append(helper.make_attribute("locale", "C.UTF-8"))
    path = tmp_path_factory.mktemp("txt") / "model.onnx"
    path.write_bytes(onx.SerializeToString())
    return model, str(path)


def test_matches_sklearn_and_batched_equals_alone(tabular):
    model, path = tabular
    clf = OnnxClassifier(path)
    reqs = [{"input": X[0:5]}, {"input": X[5:6]}, {"input": X[6:20]}]
    batched = clf.run(reqs)
    alone = [clf.run([r])[0] for r in reqs]
    for req, b, a in zip(reqs, batched, alone):
        assert np.array_equal(b["label"], a["label"]) and np.array_equal(b["probabilities"], a["probabilities"])
        assert b["label"].shape == (len(req["input"]), 1)
        assert np.array_equal(b["label"][:, 0], model.predict(req["input"]))
        np.testing.assert_allclose(b["probabilities"], model.predict_proba(req["input"]), atol=1e-5)


def test_bad_request_fails_alone(tabular):
    _, path = tabular
    clf = OnnxClassifier(path)
    nan = X[:2].copy()
    nan[1, 3] = np.nan
    out = clf.run([{"input": X[:3]}, {"input": nan}, {"input": X[:3, :3]}, {"input": X[3:4]}])
    assert isinstance(out[1], InputError) and "NaN" in str(out[1]) and out[1].input_name == "input"
    assert isinstance(out[2], InputError) and "3 features" in str(out[2])
    assert out[0]["label"].shape == (3, 1) and out[3]["label"].shape == (1, 1)
    assert np.array_equal(out[3]["label"], clf.run([{"input": X[3:4]}])[0]["label"])


def test_allow_nan_setting_lets_nan_through(tabular):
    _, path = tabular
    clf = OnnxClassifier(path, SessionSettings(allow_nan=True))
    x = X[:1].copy()
    x[0, 0] = np.nan
    assert isinstance(clf.run([{"input": x}])[0], dict)


class _FailsOnRow(OnnxClassifier):
    """Stands in for a graph that errors on one specific input: the batch must be isolated."""

    def _run(self, inputs, rows):
        if (inputs["input"] == 99).any():
            raise RuntimeError("kernel failed")
        return super()._run(inputs, rows)


def test_runtime_failure_is_isolated_to_its_request(tabular):
    _, path = tabular
    clf = _FailsOnRow(path)
    poison = np.full((1, 4), 99, np.float32)
    out = clf.run([{"input": X[:2]}, {"input": poison}, {"input": X[2:3]}])
    assert isinstance(out[1], RuntimeError)
    assert out[0]["label"].shape == (2, 1) and out[2]["label"].shape == (1, 1)


def test_text_model_takes_bytes_returns_bytes_labels(text_model):
    model, path = text_model
    clf = OnnxClassifier(path)
    prompts = ["hello my friend", "how to steal a car", "caf\u00e9 bomb"]
    out = clf.run([{"text": np.array([[p.encode()] for p in prompts], dtype=object)}])[0]
    assert out["label"].dtype == object and isinstance(out["label"][0, 0], bytes)
    assert [v.decode() for v in out["label"][:, 0]] == list(model.predict(prompts))
    np.testing.assert_allclose(out["probabilities"], model.predict_proba(prompts), atol=1e-5)


def test_check_config_catches_drift(tabular):
    _, path = tabular
    clf = OnnxClassifier(path)
    clf.check_config(["input"], ["label", "probabilities"])
    with pytest.raises(ValueError, match="ONNX graph inputs"):
        clf.check_config(["features"], ["label"])
    with pytest.raises(ValueError, match="not ONNX graph outputs"):
        clf.check_config(["input"], ["label", "output_probability"])
