"""The errors of tritonllm, one class per meaning, and the Triton error code each stands for.

- ``InvalidInput``: the client must fix the request (INVALID_ARG); the message names the input. The
  engine's ``InvalidRequest``, the text steps' ``InvalidInput`` and the classifiers' ``InputError`` are
  this class (or a subclass), so every layer refuses bad input the same way.
- ``QueueFull``: admission refused for now (UNAVAILABLE).
- ``InnerError``: a composing model's error passed on by a BLS model with its own code.
Anything else is a bug or a failure of ours: INTERNAL. No Triton imports.

Codes between our models travel as data. Triton 2.51 loses them on the way: a BLS caller gets every error of a
composing model as INTERNAL, a gRPC stream carries only the message, and python_backend 2.51 has no response
parameters. So a caller of ours sets the request parameter ``errors_as_data`` (true) and asks for the outputs
``error_code`` / ``error_message``; our models then answer a failure as a final response carrying those two
tensors (``error_arrays``), which the caller reads back (``error_of``). Callers that do not ask (NVIDIA's clients
and tools, the ensemble) get Triton errors as before. ``recovered_code`` is left for errors Triton itself raises
(a model not ready, a request it refused), whose codes the BLS also loses.
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

ERRORS_AS_DATA = "errors_as_data"           # request parameter: answer failures as data (see above)
ERROR_CODE, ERROR_MESSAGE = "error_code", "error_message"
ERROR_OUTPUTS = (ERROR_CODE, ERROR_MESSAGE)
CODES = ("INVALID_ARG", "UNAVAILABLE", "CANCELLED", "INTERNAL", "NOT_FOUND", "UNSUPPORTED")
HTTP_STATUS = {"INVALID_ARG": 400, "NOT_FOUND": 404, "UNAVAILABLE": 503, "CANCELLED": 499, "INTERNAL": 500,
               "UNSUPPORTED": 501}


def error_arrays(message: str, code: str) -> dict[str, np.ndarray]:
    """A failure as the two output tensors, [1, 1] like every output of a batching model (``code``: one of
    ``CODES``)."""
    if code not in CODES:
        raise ValueError(f"error code {code!r}: one of {', '.join(CODES)}")
    return {ERROR_CODE: np.array([[code.encode()]], dtype=object),
            ERROR_MESSAGE: np.array([[message.encode("utf-8")]], dtype=object)}


def error_of(get: Callable[[str], object]) -> tuple[str, str] | None:
    """(message, code) of a response that carries a failure as data, else None. ``get(name)``: the response's
    output as a numpy array, or None when absent."""
    code = get(ERROR_CODE)
    if code is None or np.asarray(code).size == 0:
        return None
    message = get(ERROR_MESSAGE)

    def text(a) -> str:
        v = np.asarray(a).reshape(-1)[0]
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)

    name = text(code)
    return (text(message) if message is not None else name), (name if name in CODES else "INTERNAL")


class InvalidInput(ValueError):
    """A request the client must fix (Triton: INVALID_ARG); the message names the input."""


class QueueFull(RuntimeError):
    """The waiting queue is at max_queue_size, or the server is shutting down (Triton: UNAVAILABLE)."""


class InnerError(Exception):
    """An inner model's error, re-raised by a BLS model with the code it should keep (a pb_utils
    TritonError code)."""

    def __init__(self, message: str, code):
        super().__init__(message)
        self.code = code


# Triton 2.51's BLS hands a composing model's error to the caller with code INTERNAL whatever the model
# said (seen: preprocessing's INVALID_ARG arrives INTERNAL through exec(); through an ensemble it stays
# INVALID_ARG). Our models' messages tell the codes apart, so the BLS and the routers recover them.
_CODE_BY_MESSAGE = (
    (re.compile(r"request cancelled"), "CANCELLED"),
    (re.compile(r"Maximum queue size|shutting down|not ready|unavailable", re.I), "UNAVAILABLE"),
    (re.compile(r"internal error|(pre|post)processing failed|engine step failed|[Ss]tub", re.I), "INTERNAL"),
)


def recovered_code(message: str) -> str:
    """The code name (INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL) of an inner error that arrived as
    INTERNAL (see _CODE_BY_MESSAGE): our backends' refusals of bad input carry no marker, so anything
    not marked otherwise is INVALID_ARG."""
    for pattern, code in _CODE_BY_MESSAGE:
        if pattern.search(message):
            return code
    return "INVALID_ARG"
