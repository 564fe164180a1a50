"""DetokenizerRegistry: interleaved keyed streams stay exact; state is bounded and released."""

from __future__ import annotations

import random

import pytest

from text_helpers import ALL, SAMPLES, random_chunks
from tritonllm.text.detokenizer import IncrementalDetokenizer
from tritonllm.text.stream_registry import DetokenizerRegistry


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture(scope="module")
def tok():
    return ALL["llama_fallback"]()


def _registry(tok, **kw):
    return DetokenizerRegistry(lambda: IncrementalDetokenizer(tok), **kw)


def test_interleaved_streams_are_exact(tok):
    """Chunks of several requests arrive interleaved, as postprocessing sees them in an ensemble."""
    rng = random.Random(0)
    reg = _registry(tok)
    streams = {f"req-{i}": random_chunks(tok.encode(s, add_special_tokens=False), rng, 3)
               for i, s in enumerate(SAMPLES)}
    out = {k: [] for k in streams}
    pending = {k: list(v) for k, v in streams.items()}
    while pending:
        key = rng.choice(sorted(pending))
        chunk = pending[key].pop(0)
        last = not pending[key]
        out[key].append(reg.process(key, chunk, first=len(out[key]) == 0, final=last))
        if last:
            del pending[key]
    for i, s in enumerate(SAMPLES):
        ids = tok.encode(s, add_special_tokens=False)
        assert "".join(out[f"req-{i}"]) == tok.decode(ids)
    assert len(reg) == 0  # every stream signalled its end


def test_no_key_decodes_chunk_alone(tok):
    reg = _registry(tok)
    ids = tok.encode("ab 😀", add_special_tokens=False)
    assert reg.process(None, ids) == tok.decode(ids)  # fully flushed, even a split character
    assert reg.process("", ids) == tok.decode(ids)
    assert len(reg) == 0


def test_lru_bound(tok):
    reg = _registry(tok, max_entries=3)
    for i in range(10):
        reg.process(i, tok.encode("hello", add_special_tokens=False))
    assert len(reg) == 3 and reg.evicted == 7
    assert 9 in reg and 0 not in reg


def test_idle_ttl(tok):
    clock = FakeClock()
    reg = _registry(tok, ttl_s=5.0, clock=clock)
    reg.process("a", [1])
    clock.now = 3.0
    reg.process("b", [1])
    clock.now = 7.0  # "a" idle 7 s > 5 s, "b" idle 4 s
    reg.process("c", [1])
    assert "a" not in reg and "b" in reg and reg.evicted == 1


def test_first_resets_stale_state(tok):
    reg = _registry(tok)
    hello = tok.encode("hello", add_special_tokens=False)
    reg.process("k", hello)  # a stream whose end never came
    world = tok.encode("world", add_special_tokens=False)
    assert reg.process("k", world, first=True, final=True) == tok.decode(world)
    assert "k" not in reg


def test_invalid_bounds(tok):
    with pytest.raises(ValueError):
        _registry(tok, max_entries=0)
    with pytest.raises(ValueError):
        _registry(tok, ttl_s=0)
