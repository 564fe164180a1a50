"""The errors of tritonllm, one class per meaning, and the Triton error code each stands for.

- ``InvalidInput``: the client must fix the request (INVALID_ARG); the message names the input. The
  engine's ``InvalidRequest``, the text steps' ``InvalidInput`` and the classifiers' ``InputError`` are
  this class (or a subclass), so every layer refuses bad input the same way.
- ``QueueFull``: admission refused for now (UNAVAILABLE).
- ``InnerError``: a composing model's error passed on by a BLS model with its own code (``recovered_code``
  when Triton hands it over as INTERNAL).
Anything else is a bug or a failure of ours: INTERNAL. No Triton imports.
"""
from __future__ import annotations

import re


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
