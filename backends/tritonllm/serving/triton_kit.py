"""What every thin adapter does with the Python backend's objects: read inputs, map an exception to a
Triton error code (the table of ``errors.py``), answer with an error or send a request's last one.
``pb_utils`` is passed in (the library imports nothing from Triton)."""
from __future__ import annotations

from ..errors import InnerError, InvalidInput, QueueFull, recovered_code


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


def error_response(pb_utils, message: str, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def send_error(pb_utils, sender, message: str, code) -> None:
    """A decoupled request's last response: the error, with the final flag."""
    sender.send(error_response(pb_utils, message, code), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
