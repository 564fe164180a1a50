"""Runs an LLMEngine on one background thread and hands each output to a callback.

Invariants: only the runner thread touches the engine after start(); submit() validates in the caller's
thread (so bad input fails at once) and is refused with QueueFull when more than
max_num_seqs + max_queue_size requests are unfinished; every submitted request gets exactly one final
output (finished=True), also on abort, engine error, or shutdown.

Guided requests and run-time LoRA adapters: submit() starts the guide compiling on the grammar thread
(engine.guide_future) and the adapter loading on the loader thread (engine.lora_future), and returns; the request
waits aside (``_compiling``) until both are ready, then enters the engine (its adapter installed first), so no
other request ever waits for a compile or a load. A guide not ready ``guide_compile_timeout_s`` after submission
ends the request with an INVALID_ARG error naming the guide; a guide that does not compile, or an adapter that does
not load, too. The loop sleeps until one finishes or a deadline passes (no polling).

Build the engine on the runner thread (``EngineRunner.launch``) when it serves: torch's CPU kernels run in GNU
OpenMP teams, one per thread that starts parallel work, and libgomp cuts its barrier spinning to ~100 iterations
once its threads outnumber the CPUs. An engine loaded on one thread (whose team stays) and stepped on another
makes two teams: every barrier of a step then sleeps and wakes through the kernel (SmolLM2-135M on 2 cores: 14 ms a
decode step instead of 7).
"""
from __future__ import annotations

import logging
import threading
import traceback
from collections import deque
from concurrent.futures import Future
from typing import Callable

import time

from ..errors import InvalidInput
from .engine import LLMEngine
from .request import QueueFull, RequestOutput, SamplingParams, admit

log = logging.getLogger(__name__)


class EngineRunner:
    def __init__(self, engine: LLMEngine, on_output: Callable[[RequestOutput], None],
                 _thread: threading.Thread | None = None) -> None:
        self.engine = engine
        self.on_output = on_output
        self._cv = threading.Condition()
        self._inbox: deque = deque()
        self._unfinished: set[str] = set()
        self._stop = False
        self._thread = _thread or threading.Thread(target=self._loop, name="llm-engine", daemon=True)
        self.capacity = engine.config.max_num_seqs + engine.config.max_queue_size
        # request id -> (guide future, adapter future, prompt, params, guide deadline); runner thread only
        self._compiling: dict[str, tuple[Future | None, Future | None, list[int], SamplingParams, float]] = {}

    def start(self) -> "EngineRunner":
        self._thread.start()
        return self

    @classmethod
    def launch(cls, build: Callable[[], LLMEngine], on_output: Callable[[RequestOutput], None]) -> "EngineRunner":
        """A started runner whose engine ``build()`` made on the runner thread itself (why: the module docstring);
        what ``build`` raises is raised here. Work done for the engine on other threads (``submit``'s checks) stays
        below torch's parallel grain for the same reason."""
        built: Future = Future()

        def main() -> None:
            try:
                runner = cls(build(), on_output, threading.current_thread())
            except BaseException as e:  # noqa: BLE001  (handed to the caller, whatever it is)
                built.set_exception(e)
                return
            built.set_result(runner)
            runner._loop()

        threading.Thread(target=main, name="llm-engine", daemon=True).start()
        return built.result()

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self.submit_all([(request_id, prompt_ids, params)])

    def submit_all(self, requests: list[tuple[str, list[int], SamplingParams]]) -> None:
        """Admits every request or none (a client's batch is one unit, as TensorRT-LLM enqueues it)."""
        for _, prompt_ids, params in requests:
            self.engine.validate(prompt_ids, params)
        futures = [(self.engine.guide_future(params), self.engine.lora_future(params))  # refusals raise here
                   for _, _, params in requests]
        deadline = time.monotonic() + self.engine.config.guide_compile_timeout_s
        with self._cv:
            if self._stop:
                raise QueueFull("the engine is shutting down")
            admit(self._unfinished, [rid for rid, _, _ in requests], self.capacity,
                  self.engine.config.max_queue_size, self.engine.config.max_num_seqs)
            for (request_id, prompt_ids, params), (guide, lora) in zip(requests, futures):
                self._unfinished.add(request_id)
                self._inbox.append(("add", request_id, prompt_ids, params, guide, lora, deadline))
            self._cv.notify()
        for future in (f for pair in futures for f in pair):
            if future is not None and not future.done():
                future.add_done_callback(self._wake)

    def _wake(self, _future=None) -> None:
        with self._cv:
            self._cv.notify()

    def abort(self, request_id: str) -> None:
        with self._cv:
            self._inbox.append(("abort", request_id))
            self._cv.notify()

    def call(self, fn: Callable[[LLMEngine], object]) -> Future:
        """Runs fn(engine) on the engine thread between steps, after every command already submitted (so a
        request submitted after call() returns sees its effect); the Future holds the result or exception."""
        fut: Future = Future()
        with self._cv:
            if self._stop:
                raise QueueFull("the engine is shutting down")
            self._inbox.append(("call", fn, fut))
            self._cv.notify()
        return fut

    def num_unfinished(self) -> int:
        with self._cv:
            return len(self._unfinished)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Lets in-flight requests finish (up to `timeout`), then aborts the rest and stops the thread."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cv:
                for rid in list(self._unfinished):
                    self._inbox.append(("abort", rid))
                self._inbox.append(("exit",))
                self._cv.notify()
            self._thread.join(5.0)

    # ---- runner thread ---------------------------------------------------------------------------
    def _emit(self, out: RequestOutput) -> None:
        if out.finished:
            with self._cv:
                self._unfinished.discard(out.request_id)
        try:
            self.on_output(out)
        except Exception:  # a broken callback must not kill the engine thread
            log.exception("output callback failed for %s", out.request_id)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._inbox and not self.engine.has_work() and not self._stop and not self._ready():
                    self._cv.wait(self._next_deadline())
                cmds = list(self._inbox)
                self._inbox.clear()
                if self._stop and not cmds and not self.engine.has_work() and not self._compiling:
                    return
            for cmd in cmds:
                if cmd[0] == "exit":
                    for left in cmds:
                        if left[0] == "call":
                            left[2].cancel()
                    for rid in list(self._compiling):
                        self._emit(self._end_compiling(rid, "abort"))
                    return
                self._apply(cmd)
            self._admit_compiled()
            if not self.engine.has_work():
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # fail the running batch, keep serving
                log.error("engine step failed: %s", traceback.format_exc())
                outputs = [self._fail(rid, f"engine step failed: {e}") for rid in list(self.engine.requests)]
            for out in outputs:
                self._emit(out)

    # Guided requests wait here, out of the engine, while their grammar compiles.
    @staticmethod
    def _done(guide: Future | None, lora: Future | None) -> bool:
        return (guide is None or guide.done()) and (lora is None or lora.done())

    def _ready(self) -> bool:
        now = time.monotonic()
        return any(self._done(g, lo) or (g is not None and not g.done() and now >= deadline)
                   for g, lo, _, _, deadline in self._compiling.values())

    def _next_deadline(self) -> float | None:
        pending = [d for g, _, _, _, d in self._compiling.values() if g is not None and not g.done()]
        return max(0.0, min(pending) - time.monotonic()) if pending else None

    def _end_compiling(self, rid: str, reason: str, error: str | None = None) -> RequestOutput:
        del self._compiling[rid]
        return RequestOutput(rid, [], [], True, reason, error=error, error_code="INVALID_ARG" if error else None)

    def _admit_compiled(self) -> None:
        now = time.monotonic()
        for rid, (guide, lora, prompt, params, deadline) in list(self._compiling.items()):
            if self._done(guide, lora):
                del self._compiling[rid]
                self._add(rid, prompt, params, guide, lora)
            elif guide is not None and not guide.done() and now >= deadline:
                self._emit(self._end_compiling(rid, "error", (
                    f"guided_decoding_guide did not compile within {self.engine.config.guide_compile_timeout_s:g} s "
                    "(guided_decoding_compile_timeout_s): simplify it (fewer properties, alternatives, nesting)")))

    def _add(self, rid: str, prompt: list[int], params: SamplingParams, guide: Future | None,
             lora: Future | None) -> None:
        try:
            if lora is not None:
                self.engine.install_lora(lora.result())
            self.engine.add_request(rid, prompt, params, compiled=None if guide is None else guide.result())
        except Exception as e:
            code = ("INVALID_ARG" if isinstance(e, InvalidInput) else "UNAVAILABLE" if isinstance(e, QueueFull)
                    else "INTERNAL")
            if code == "INTERNAL":
                log.error("request %s failed to enter the engine: %s", rid, traceback.format_exc())
            self._emit(RequestOutput(rid, [], [], True, "error", error=str(e), error_code=code))

    def _apply(self, cmd) -> None:
        if cmd[0] == "add":
            _, rid, prompt, params, guide, lora, deadline = cmd
            if not self._done(guide, lora):
                self._compiling[rid] = (guide, lora, prompt, params, deadline)
            else:
                self._add(rid, prompt, params, guide, lora)
        elif cmd[0] == "abort":
            if cmd[1] in self._compiling:
                self._emit(self._end_compiling(cmd[1], "abort"))
                return
            out = self.engine.abort(cmd[1])
            if out is not None:
                self._emit(out)
        elif cmd[0] == "call":
            _, fn, fut = cmd
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self.engine))
                except Exception as e:  # the caller gets it; the engine keeps serving
                    fut.set_exception(e)

    def _fail(self, rid: str, msg: str) -> RequestOutput:
        self.engine.abort(rid)
        return RequestOutput(rid, [], [], True, "error", error=msg, error_code="INTERNAL")
