"""concat_requests / split_outputs: request i gets back exactly its own rows, in order."""

import numpy as np
import pytest

from tritonllm.classical import concat_requests, split_outputs


def test_round_trip_preserves_each_request_rows():
    reqs = [{"x": np.full((n, 3), i, np.float32)} for i, n in enumerate([2, 1, 4])]
    stacked, rows = concat_requests(reqs)
    assert rows == [2, 1, 4] and stacked["x"].shape == (7, 3)
    # A row-wise "model": label = the request index stored in the row, proba = the row itself.
    parts = split_outputs({"label": stacked["x"][:, 0].astype(np.int64), "probabilities": stacked["x"]}, rows)
    for i, (req, part) in enumerate(zip(reqs, parts)):
        assert part["label"].shape == (len(req["x"]), 1)  # rank-1 output gains the [N, 1] column
        assert (part["label"] == i).all()
        assert np.array_equal(part["probabilities"], req["x"])


def test_split_returns_copies_not_views_of_the_batch():
    parts = split_outputs({"p": np.zeros((3, 2))}, [1, 2])
    parts[0]["p"][:] = 7
    assert (parts[1]["p"] == 0).all() and parts[0]["p"].base is None


def test_split_rejects_row_mismatch():
    with pytest.raises(ValueError, match="'p' has 3 rows, the batch had 4"):
        split_outputs({"p": np.zeros((3, 2))}, [2, 2])


def test_concat_single_request_is_passthrough_and_empty_rejected():
    x = np.ones((2, 2))
    stacked, rows = concat_requests([{"x": x}])
    assert stacked["x"] is x and rows == [2]
    with pytest.raises(ValueError):
        concat_requests([])
