"""Structured output: every finished output is in the grammar's language (JSON schema, regex, EBNF);
a guide that does not compile is InvalidRequest naming the input; nothing leaks."""
import json
import re

import pytest

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.request import InvalidRequest, SamplingParams

from engine_helpers import byte_level_model, run_staggered


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("guided")
    tok = byte_level_model(path)
    engine = LLMEngine(str(path), EngineConfig(block_size=4, max_kv_tokens=4096, max_num_tokens=64,
                                               max_draft_len=3))
    return engine, tok


SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                           "ok": {"type": "boolean"}},
          "required": ["color", "ok"], "additionalProperties": False}


def test_guided_outputs_are_in_the_language(setup):
    engine, tok = setup
    guides = [("json_schema", json.dumps(SCHEMA)), ("regex", r"(yes|no), [0-9]{3}"),
              ("ebnf_grammar", 'root ::= "ab" ("c" | "d")+ "!"'), ("json_schema", json.dumps(SCHEMA))]
    prompts = [tok.encode("hello world"), tok.encode("x"), tok.encode("café"), tok.encode("a b c")]
    initial = engine.num_free_blocks
    params = lambda i: SamplingParams(max_tokens=60, guide=guides[i], temperature=0.0 if i % 2 else 1.0,  # noqa: E731
                                      top_p=0.9, seed=i)
    results, reasons = run_staggered(engine, prompts, params)
    texts = [tok.decode(results[str(i)], skip_special_tokens=True) for i in range(4)]
    for i in (0, 3):
        assert reasons[str(i)] == "stop", texts[i]
        obj = json.loads(texts[i])
        assert set(obj) == {"color", "ok"} and obj["color"] in SCHEMA["properties"]["color"]["enum"]
    assert re.fullmatch(r"(yes|no), [0-9]{3}", texts[1]) and reasons["1"] == "stop"
    assert re.fullmatch(r"ab[cd]+!", texts[2]) or (reasons["2"] == "length" and re.fullmatch(r"ab[cd]*", texts[2]))
    assert engine.num_free_blocks == initial


@pytest.mark.parametrize("guide,needle", [
    (("regex", "("), "does not compile as regex"),
    (("ebnf_grammar", "root ::= "), "does not compile as ebnf_grammar"),
    (("json_schema", "{not json"), "does not compile as json_schema"),
    (("xml", "<a/>"), "guided_decoding_guide_type"),
    (("regex", ""), "guided_decoding_guide is required"),
])
def test_bad_guides_are_invalid(setup, guide, needle):
    engine, tok = setup
    with pytest.raises(InvalidRequest, match=needle):
        engine.add_request("bad", tok.encode("hi"), SamplingParams(max_tokens=4, guide=guide))
    assert not engine.has_work()
