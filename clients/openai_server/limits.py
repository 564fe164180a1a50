"""What a client can hold the OpenAI server to: the size of a request body, the time it takes to send it, and the
generation it started (cancelled when it goes away).

- ``BodyLimits`` (ASGI middleware, inside ``ApiKey``): reads the whole body before the application sees the request. A
  body over ``max_bytes`` is answered 413 (at once when Content-Length says so, else when the bytes arrive), a body
  that stops arriving for ``timeout_s`` between chunks 408, with OpenAI's error JSON and the connection closed. The
  application then receives the body from memory and, after it, the connection's own events (the disconnect that
  streaming responses and ``until_disconnected`` wait for).
- ``ApiKey`` (ASGI middleware, outermost): the bearer key on ``/v1`` routes, checked before any body is read.
- ``unless_disconnected(request, work)``: runs ``work`` (a non-streamed generation) and cancels it when the client
  disconnects first; cancelling closes the gRPC stream, which cancels the request in Triton and the engine.
- ``CancellingStream``: a StreamingResponse that listens for the disconnect while it streams (Starlette, on an ASGI
  2.4 server such as uvicorn, only notices at the next send that fails) and always closes its body iterator at the
  end, which closes the Triton stream. Without that the iterator was left to the garbage collector: seen, an
  ``n=4`` stream whose client had gone kept generating for seconds (5 of 9 cancelled in the issue's probe).
"""
from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any, Awaitable, TypeVar

import anyio
from starlette.responses import StreamingResponse

T = TypeVar("T")


class ClientGone(Exception):
    """The HTTP client disconnected before its (non-streamed) answer was ready."""


def _error_body(status: int, message: str) -> bytes:
    kind = {408: "timeout", 413: "invalid_request_error"}.get(status, "invalid_request_error")
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()


class BodyLimits:
    def __init__(self, app, max_bytes: int, timeout_s: float) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def _refuse(self, send, status: int, message: str) -> None:
        body = _error_body(status, message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send, 413, f"the request body is {int(declared)} bytes: more than this server's "
                                                 f"limit of {self.max_bytes} (--max-request-bytes)")
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except asyncio.TimeoutError:
                return await self._refuse(send, 408, f"the request body did not arrive: nothing for {self.timeout_s:g} s "
                                                     f"after {size} bytes (--request-body-timeout-s)")
            if message["type"] == "http.disconnect":
                return  # the client left before sending its request: nothing to answer
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await self._refuse(send, 413, f"the request body is more than this server's limit of "
                                                     f"{self.max_bytes} bytes (--max-request-bytes)")
            chunks.append(body)
            more = message.get("more_body", False)
        buffered: list[dict[str, Any]] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay():
            return buffered.pop() if buffered else await receive()

        await self.app(scope, replay, send)


class ApiKey:
    """With a key set, every ``/v1`` route needs ``Authorization: Bearer <key>`` (constant-time compare) and answers
    401 with OpenAI's error body (code ``invalid_api_key``) otherwise; health routes stay open. Plain ASGI: Starlette's
    ``BaseHTTPMiddleware`` would pass every streamed chunk through memory streams (~0.2 ms of a token's 8 ms)."""

    def __init__(self, app, key: str | None) -> None:
        self.app, self.key = app, key.encode("utf-8") if key else None

    async def __call__(self, scope: dict, receive, send) -> None:
        if self.key is None or scope["type"] != "http" or not scope["path"].startswith("/v1"):
            return await self.app(scope, receive, send)
        # header values are bytes as the client sent them
        scheme, _, token = dict(scope.get("headers") or []).get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            return await self.app(scope, receive, send)
        message = ("Incorrect API key provided" if token.strip() else
                   "You didn't provide an API key: send it as 'Authorization: Bearer <key>'")
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                     "code": "invalid_api_key"}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


async def _disconnected(request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request, work: Awaitable[T]) -> T:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled and ClientGone raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done() and not watcher.done():  # this coroutine itself was cancelled
            task.cancel()
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
    raise ClientGone()


class CancellingStream(StreamingResponse):
    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away during a send
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()  # ends the Triton stream now, not at garbage collection
