"""Guided decoding off the request path: a grammar compiles on its own thread while the engine serves everyone
else; a compile past its time budget fails its request (INVALID_ARG) and nobody else; guides past the size limit
are refused at once; the compiled-grammar cache stays within its byte bound."""
from __future__ import annotations

import json
import threading
import time

import pytest

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.grammar import GrammarBackend
from tritonllm.engine.request import InvalidRequest, SamplingParams
from tritonllm.engine.runner import EngineRunner

from engine_helpers import byte_level_model
from text_helpers import byte_level

SCHEMA = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                     "additionalProperties": False})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("guided-async")
    byte_level_model(path)
    return str(path)


class Collector:
    def __init__(self):
        self.outputs, self.finished, self.cv = {}, {}, threading.Condition()

    def __call__(self, out):
        with self.cv:
            self.outputs.setdefault(out.request_id, []).append(out)
            if out.finished:
                self.finished[out.request_id] = (time.monotonic(), out)
                self.cv.notify_all()

    def wait(self, rid, timeout=30.0):
        with self.cv:
            assert self.cv.wait_for(lambda: rid in self.finished, timeout), f"{rid} did not finish"
            return self.finished[rid]


@pytest.fixture()
def gated(model_dir, monkeypatch):
    """A runner whose grammar compiles wait for ``gate`` (a stand-in for a schema that takes long to compile)."""
    gate = threading.Event()
    compile_ = GrammarBackend._compile

    def slow(self, guide_type, guide):
        gate.wait(30)
        return compile_(self, guide_type, guide)

    monkeypatch.setattr(GrammarBackend, "_compile", slow)

    def make(**config):
        engine = LLMEngine(model_dir, EngineConfig(max_kv_tokens=2048, max_num_tokens=64, **config))
        got = Collector()
        runner = EngineRunner(engine, got).start()
        return engine, runner, got

    yield gate, make
    gate.set()


def test_other_requests_never_wait_for_a_compile(gated):
    gate, make = gated
    engine, runner, got = make()
    try:
        start = time.monotonic()
        runner.submit("guided", [5, 6, 7], SamplingParams(max_tokens=40, guide=("json_schema", SCHEMA)))
        runner.submit("plain", [5, 6, 7], SamplingParams(max_tokens=8, end_id=-1))
        done_at, plain = got.wait("plain")
        assert plain.error is None and plain.num_output_tokens == 8 and "guided" not in got.finished
        assert done_at - start < 5.0
        gate.set()                                                      # the compile ends: the request runs
        _, guided = got.wait("guided")
        text = byte_level().decode([t for o in got.outputs["guided"] for t in o.new_token_ids], skip_special_tokens=True)
        assert guided.error is None and json.loads(text) in ({"ok": True}, {"ok": False})
    finally:
        runner.shutdown()
    assert engine.num_free_blocks == engine.pool.num_blocks


def test_a_compile_past_its_budget_fails_that_request_only(gated):
    gate, make = gated
    engine, runner, got = make(guide_compile_timeout_s=0.3)
    try:
        runner.submit("guided", [5, 6], SamplingParams(max_tokens=8, guide=("json_schema", SCHEMA)))
        runner.submit("plain", [5, 6], SamplingParams(max_tokens=4, end_id=-1))
        _, out = got.wait("guided")
        assert out.error_code == "INVALID_ARG" and "did not compile within 0.3 s" in out.error
        assert "guided_decoding_compile_timeout_s" in out.error
        assert got.wait("plain")[1].error is None
        runner.submit("aborted", [5, 6], SamplingParams(max_tokens=8, guide=("regex", "a+")))
        runner.abort("aborted")                                         # a client that leaves while it compiles
        assert got.wait("aborted")[1].finish_reason == "abort"
    finally:
        gate.set()
        runner.shutdown()
    assert runner.num_unfinished() == 0 and engine.num_free_blocks == engine.pool.num_blocks


def test_guides_past_the_size_limit_or_that_do_not_compile_are_invalid(model_dir):
    engine = LLMEngine(model_dir, EngineConfig(max_kv_tokens=256, guide_max_bytes=100))
    got = Collector()
    runner = EngineRunner(engine, got).start()
    try:
        with pytest.raises(InvalidRequest, match="guided_decoding_guide is 2[0-9]{2} bytes: more than the 100"):
            runner.submit("big", [5], SamplingParams(max_tokens=4, guide=("regex", "a" * 200)))
        runner.submit("broken", [5], SamplingParams(max_tokens=4, guide=("regex", "(unclosed")))
        _, out = got.wait("broken")
        assert out.error_code == "INVALID_ARG" and "does not compile as regex" in out.error
    finally:
        runner.shutdown()


def test_the_compiled_grammar_cache_stays_within_its_bound(model_dir):
    backend = GrammarBackend(model_dir, 260, cache_bytes=200_000)
    sizes = []
    for i in range(40):  # distinct schemas: each would stay cached without the bound
        schema = {"type": "object", "properties": {f"f{i}_{j}": {"type": "integer"} for j in range(12)}}
        backend.compile("json_schema", json.dumps(schema))
        sizes.append(backend.compiler.get_cache_size_bytes())
    assert max(sizes) <= 200_000 * 1.2 and sizes[-1] > 0
    backend.shutdown()
