"""validate_request: every rejection is an InputError naming the tensor; accepted inputs are ORT-ready."""

import numpy as np
import pytest

from tritonllm.classical import InputError, InputSpec, validate_request

FEATS = [InputSpec("input", np.dtype(np.float32), (None, 4))]
TEXT = [InputSpec("text", np.dtype(object), (None, 1))]


def _reject(specs, arrays, allow_nan=False) -> InputError:
    with pytest.raises(InputError) as info:
        validate_request(specs, arrays, allow_nan)
    return info.value


def test_accepts_exact_dtype_and_shape_unchanged():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = validate_request(FEATS, {"input": x}, allow_nan=False)
    assert out["input"].dtype == np.float32 and np.array_equal(out["input"], x)


def test_wrong_feature_count_names_input_and_counts():
    e = _reject(FEATS, {"input": np.zeros((2, 3), np.float32)})
    assert e.input_name == "input"
    assert "'input'" in str(e) and "3 features" in str(e) and "expects 4" in str(e)


def test_wrong_dtype_is_not_cast():
    e = _reject(FEATS, {"input": np.zeros((1, 4), np.float64)})
    assert e.input_name == "input" and "float64" in str(e) and "float32" in str(e)


def test_wrong_rank_and_empty_batch():
    assert "rank 1" in str(_reject(FEATS, {"input": np.zeros(4, np.float32)}))
    assert "no rows" in str(_reject(FEATS, {"input": np.zeros((0, 4), np.float32)}))


@pytest.mark.parametrize("bad, word", [(np.nan, "NaN"), (np.inf, "infinite"), (-np.inf, "infinite")])
def test_non_finite_rejected_with_row_unless_allowed(bad, word):
    x = np.ones((3, 4), np.float32)
    x[2, 1] = bad
    e = _reject(FEATS, {"input": x})
    assert e.input_name == "input" and word in str(e) and "row 2" in str(e)
    assert np.isnan(validate_request(FEATS, {"input": x}, allow_nan=True)["input"][2, 1]) == np.isnan(bad)


def test_missing_and_unexpected_inputs():
    assert _reject(FEATS, {}).input_name == "input"
    e = _reject(FEATS, {"input": np.ones((1, 4), np.float32), "extra": np.ones(1)})
    assert e.input_name == "extra" and "not an input" in str(e)


def test_text_bytes_decoded_to_str():
    x = np.array([[b"hello"], ["caf\u00e9".encode()]], dtype=object)
    out = validate_request(TEXT, {"text": x}, allow_nan=False)["text"]
    assert out.dtype == object and out[:, 0].tolist() == ["hello", "caf\u00e9"]


def test_text_rejects_invalid_utf8_and_numbers():
    e = _reject(TEXT, {"text": np.array([[b"ok"], [b"\xff\xfe"]], dtype=object)})
    assert e.input_name == "text" and "UTF-8" in str(e) and "element 1" in str(e)
    e = _reject(TEXT, {"text": np.zeros((1, 1), np.float32)})
    assert e.input_name == "text" and "string" in str(e)


def test_rows_must_agree_across_inputs():
    specs = [InputSpec("a", np.dtype(np.float32), (None, 2)), InputSpec("b", np.dtype(np.int64), (None, 1))]
    e = _reject(specs, {"a": np.zeros((2, 2), np.float32), "b": np.zeros((3, 1), np.int64)})
    assert e.input_name == "b" and "3 rows" in str(e)
