"""What every thin adapter does with the Python backend's objects: read inputs, map an exception to a
Triton error code (the table of ``errors.py``), answer with an error (or, for our own callers, the error as data:
errors.py) or send a request's last one; read a composing model's failure back.
``pb_utils`` is passed in (the library imports nothing from Triton)."""
from __future__ import annotations

import json
import time
from collections import deque

from ..errors import (CODES, ERROR_OUTPUTS, ERRORS_AS_DATA, InnerError, InvalidInput, QueueFull, error_arrays, error_of,
                      recovered_code)


def trace_crashes() -> None:
    """A fatal signal in this stub process prints each Python thread's stack to stderr, the server's log: Triton's
    stub otherwise dies without a line (tritonserver does not report a stub that dies after finalize)."""
    import faulthandler

    if not faulthandler.is_enabled():
        faulthandler.enable()


def drop_garbage() -> None:
    """For a model's finalize: free garbage cycles while the stub can still reach the server. A pb_utils object
    (metric, request, response) freed later, in the stub's teardown, segfaults: python_backend's ~Stub releases
    the model and the collector runs after the stub instance is gone, and the object's destructor calls it."""
    import gc

    gc.collect()


def read_inputs(pb_utils, request, names) -> dict:
    """The request's inputs among ``names`` as numpy arrays (inputs the client did not send are absent)."""
    arrays = {}
    for name in names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            arrays[name] = tensor.as_numpy()
    return arrays


def requested_outputs(request) -> frozenset[str]:
    """The outputs the caller asked for (Triton marks every output requested when a client names none). A response
    must carry no other: python_backend r24.10 drops the others inside ``send()`` without the GIL, and a numpy array
    freed there corrupts the stub's heap (fixed upstream in python_backend #390, r24.12: ~PbTensor takes the GIL)."""
    return frozenset(request.requested_output_names())


def timeout_us(request) -> int:
    """The request's Triton timeout in microseconds (the ``timeout`` request parameter; 0 = none)."""
    try:
        return int(request.timeout() or 0)
    except AttributeError:  # a python_backend before 23.12 does not pass it to the model
        return 0


def error_code(pb_utils, exc: BaseException):
    """The Triton code an exception stands for: errors.py's classes, anything else INTERNAL."""
    codes = pb_utils.TritonError
    if isinstance(exc, InnerError):
        return exc.code
    if isinstance(exc, InvalidInput):
        return codes.INVALID_ARG
    if isinstance(exc, QueueFull):
        return codes.UNAVAILABLE
    return codes.INTERNAL


def failure(pb_utils, exc: BaseException, who: str) -> tuple[str, object]:
    """(message, code) for an exception that ends a request; a failure of ours (INTERNAL) is logged and
    says so in its message ("internal error", which ``recovered_code`` reads back)."""
    code = error_code(pb_utils, exc)
    if code == pb_utils.TritonError.INTERNAL:
        pb_utils.Logger.log_error(f"{who}: {exc!r}")
        return f"{who}: internal error: {exc}", code
    return str(exc), code


def inner_code(pb_utils, error):
    """A composing model's TritonError code to pass on. Triton reports errors of decoupled models as
    INTERNAL whatever they were sent as: the code is recovered from the message (errors.recovered_code)."""
    code = error.code()
    return getattr(pb_utils.TritonError, recovered_code(error.message())) if code == pb_utils.TritonError.INTERNAL else code


class DrainedIterators:
    """Drained BLS response iterators, each kept ``keep_s`` before its last reference drops (``prune``, from a Python
    thread). Why: python_backend r24.10 erases its own reference to a finished iterator on a stub thread that does not
    hold the GIL; when that is the last one, the iterator's responses and their numpy arrays are freed there and the
    stub's heap is corrupted ("malloc(): unaligned fastbin chunk detected", then SIGABRT or SIGSEGV: seen in the BLS
    under 32 concurrent short streams, every 100-3,500 requests). Kept a while, the stub lets go first and the last
    reference drops under the GIL. Fixed upstream in python_backend #390 (r24.12: ~PbTensor takes the GIL)."""

    def __init__(self, keep_s: float = 5.0) -> None:
        self.keep_s = keep_s
        self._kept: deque = deque()  # (time, iterator); append / popleft are atomic

    def keep(self, responses) -> None:
        self._kept.append((time.monotonic(), responses))

    def prune(self) -> None:
        expired = time.monotonic() - self.keep_s
        while self._kept and self._kept[0][0] < expired:
            self._kept.popleft()

    def clear(self) -> None:
        self._kept.clear()


def wants_error_data(request) -> bool:
    """The caller (one of ours) asked for failures as data: the request parameter ``errors_as_data`` (errors.py)."""
    try:
        return json.loads(request.parameters() or "{}").get(ERRORS_AS_DATA) is True
    except (AttributeError, ValueError):
        return False


def code_name(pb_utils, code) -> str:
    """A pb_utils TritonError code's name (errors.CODES); an unknown one is INTERNAL."""
    for name in CODES:
        if getattr(pb_utils.TritonError, name, None) == code:
            return name
    return "INTERNAL"


def failure_response(pb_utils, message: str, code, as_data: bool):
    """A failure: a Triton error, or, for a caller that asked (``wants_error_data``), the response carrying it as
    data."""
    if as_data:
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(k, v) for k, v in error_arrays(message, code_name(pb_utils, code)).items()])
    return error_response(pb_utils, message, code)


def error_data_request() -> dict:
    """The BLS request parameters with which a model of ours answers failures as data (ask for its ERROR_OUTPUTS)."""
    return {ERRORS_AS_DATA: True}


def inner_failure(pb_utils, response) -> InnerError | None:
    """A composing model's failure in a BLS response: as data (errors.py), or a Triton error (Triton's own: its
    code, which Triton 2.51 turns into INTERNAL, is recovered from its message); None when it succeeded."""
    if response.has_error():
        error = response.error()
        return InnerError(error.message(), inner_code(pb_utils, error))
    names = {t.name(): t for t in response.output_tensors() if t.name() in ERROR_OUTPUTS}
    found = error_of(lambda name: names[name].as_numpy() if name in names else None)
    if found is None:
        return None
    message, code = found
    return InnerError(message, getattr(pb_utils.TritonError, code, pb_utils.TritonError.INTERNAL))


def error_response(pb_utils, message: str, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def send_error(pb_utils, sender, message: str, code, as_data: bool = False) -> None:
    """A decoupled request's last response: the error (as data when the caller asked), with the final flag."""
    sender.send(failure_response(pb_utils, message, code, as_data), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
