"""StopStringMatcher: stop strings found across any split, cut exactly, tails held minimally."""

from __future__ import annotations

import random

import pytest

from text_helpers import ALL
from tritonllm.text.detokenizer import IncrementalDetokenizer
from tritonllm.text.stop_strings import StopStringMatcher


def _reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """Cut at the occurrence that completes first (smallest end, then smallest start)."""
    hits = [(i + len(s), i) for s, i in ((s, text.find(s)) for s in stops) if i != -1]
    return (text[: min(hits)[1]], True) if hits else (text, False)


def _run(matcher: StopStringMatcher, deltas: list[str]) -> tuple[str, bool]:
    out, stopped = [], False
    for d in deltas:
        text, stopped = matcher.feed(d)
        out.append(text)
    out.append(matcher.flush())
    return "".join(out), stopped


def _random_split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
    parts, prev = [], 0
    for c in cuts + [len(text)]:
        parts.append(text[prev:c])
        prev = c
    return parts


def test_stop_across_deltas_is_cut():
    m = StopStringMatcher(["</answer>"])
    assert m.feed("The answer is 42</ans") == ("The answer is 42", False)
    assert m.held == "</ans"
    assert m.feed("wer> and more") == ("", True)
    assert m.matched == "</answer>"
    assert m.feed("ignored") == ("", True)
    assert m.flush() == ""


def test_false_alarm_is_released():
    m = StopStringMatcher(["STOP"])
    assert m.feed("go ST") == ("go ", False)
    assert m.feed("OP") == ("", True)
    m = StopStringMatcher(["STOP"])
    assert m.feed("go ST") == ("go ", False)
    assert m.feed("ART") == ("START", False)
    assert m.feed("S") == ("", False)
    assert m.flush() == "S"


def test_earliest_match_wins_and_overlaps():
    m = StopStringMatcher(["bc", "ab"])
    assert m.feed("xabc") == ("x", True)
    assert m.matched == "ab"
    m = StopStringMatcher(["aab"])
    assert m.feed("aaaa") == ("aa", False)  # "aa" could still start "aab"
    assert m.feed("b") == ("", True)
    # The string that completes first wins, however the text arrives:
    for deltas in (["abcd"], ["a", "b", "c", "d"]):
        assert _run(StopStringMatcher(["abcd", "c"]), deltas) == ("ab", True)


def test_stop_at_start_and_no_stops():
    assert StopStringMatcher(["\n"]).feed("\nabc") == ("", True)
    m = StopStringMatcher([])
    assert m.feed("anything") == ("anything", False)


def test_multibyte_stop_strings():
    m = StopStringMatcher(["世界", "🙂"])
    assert _run(m, ["你好", "世", "界!"]) == ("你好", True)


@pytest.mark.parametrize("seed", range(5))
def test_random_splits_match_reference(seed):
    rng = random.Random(seed)
    alphabet = "ab c\n世🙂"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 3))]
        assert _run(StopStringMatcher(stops), _random_split(text, rng)) == _reference(text, stops)


def test_invalid_stop_strings():
    with pytest.raises(ValueError, match="stop string 1 is empty"):
        StopStringMatcher(["ok", ""])
    with pytest.raises(ValueError, match="must be a string"):
        StopStringMatcher([b"bytes"])


@pytest.mark.parametrize("name", sorted(ALL))
def test_stop_string_spanning_tokens(name):
    """Detokenizer deltas -> matcher: a stop string made of several tokens is cut exactly."""
    tok = ALL[name]()
    text = "the quick brown fox jumps over a lazy dog"
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok)
    deltas = [d.add([t]) for t in ids] + [d.finish()]
    full = "".join(deltas)
    for stop in ["brown fox", "x jumps o", "dog", "o", "not there"]:
        assert _run(StopStringMatcher([stop]), deltas) == _reference(full, [stop])
    assert sum(1 for x in deltas if x) > 3  # the stop strings really were split across deltas


def test_include_stop_keeps_the_stop_string_and_drops_only_what_follows():
    """NVIDIA's BLS returns the text through the stop word; the split must not matter either way."""
    text = "hello world, the end. more"
    for cut in range(1, len(text)):
        m = StopStringMatcher(["end."], include_stop=True)
        out = m.feed(text[:cut])[0] + m.feed(text[cut:])[0] + m.flush()
        assert out == "hello world, the end." and m.matched == "end."
