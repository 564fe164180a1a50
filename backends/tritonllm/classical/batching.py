"""Concatenate validated requests along the batch axis and split the outputs back.

Invariant: split_outputs(run(concat_requests(rs))) gives request i exactly the rows that came from
request i, in order; rank-1 outputs (ONNX `label` is [N]) become [N, 1] so they match a Triton
config with `dims: [1]` under max_batch_size > 0. Row-wise models (every scikit-learn classifier)
therefore give the same answer batched or alone.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def concat_requests(requests: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], list[int]]:
    """Stack every input along axis 0; return the stacked inputs and each request's row count.

    All requests must have the same input names (validate_request guarantees it).
    """
    if not requests:
        raise ValueError("concat_requests needs at least one request")
    names = list(requests[0])
    rows = [int(next(iter(r.values())).shape[0]) for r in requests]
    if len(requests) == 1:
        return dict(requests[0]), rows
    stacked = {n: np.concatenate([r[n] for r in requests], axis=0) for n in names}
    return stacked, rows


def _with_batch_column(arr: np.ndarray) -> np.ndarray:
    return arr.reshape(-1, 1) if arr.ndim == 1 else arr


def split_outputs(outputs: Mapping[str, np.ndarray], rows: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cut each output into per-request slices of `rows[i]` rows (copies, so slices don't pin the batch)."""
    total = sum(rows)
    for name, arr in outputs.items():
        if arr.shape[0] != total:
            raise ValueError(f"output {name!r} has {arr.shape[0]} rows, the batch had {total}")
    bounds = np.cumsum([0, *rows])
    return [
        {name: _with_batch_column(arr[bounds[i] : bounds[i + 1]]).copy() for name, arr in outputs.items()}
        for i in range(len(rows))
    ]
