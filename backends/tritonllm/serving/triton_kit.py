"""What every thin adapter does with the Python backend's objects; ``pb_utils`` is passed in (the library
imports nothing from Triton)."""
from __future__ import annotations


def read_inputs(pb_utils, request, names) -> dict:
    """The request's inputs among ``names`` as numpy arrays (inputs the client did not send are absent)."""
    arrays = {}
    for name in names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            arrays[name] = tensor.as_numpy()
    return arrays

