"""The errors of tritonllm, one class per meaning, and the Triton error code each stands for.

- ``InvalidInput``: the client must fix the request (INVALID_ARG); the message names the input. The
  engine's ``InvalidRequest``, the text steps' ``InvalidInput`` and the classifiers' ``InputError`` are
  this class (or a subclass), so every layer refuses bad input the same way.
- ``QueueFull``: admission refused for now (UNAVAILABLE).
- ``InnerError``: a composing model's error passed on by a BLS model with its own code.
Anything else is a bug or a failure of ours: INTERNAL. No Triton imports.
"""
from __future__ import annotations


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

