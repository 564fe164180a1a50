"""tritonllm.routing: config parsing, prompt_guard output parsing, the cascade decision, the relay.

Also checks that the contract's prompt_guard tensors / label order match the built model (when built),
since the renderer cross-checks moderated_llm against the contract, not against the built config.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tritonllm import contract as C
from tritonllm import routing as R

ROOT = Path(__file__).resolve().parents[2]


def verdict(label: str, probs=None) -> R.Verdict:
    if probs is None:
        probs = [0.1, 0.1, 0.1]
        probs[C.PROMPT_GUARD_LABELS.index(label)] = 0.8
    return R.Verdict(label, np.asarray(probs, dtype=np.float32))


def guard_out(label: bytes, probs) -> dict:
    return {"label": np.array([[label]], dtype=object), "probabilities": np.asarray([probs], dtype=np.float32)}


# --------------------------------------------------------------------------- config

def test_config_defaults_are_the_one_llm_slot():
    cfg = R.RouterConfig.from_params({})
    assert (cfg.guard_model, cfg.small_model, cfg.large_model) == ("prompt_guard", "tensorrt_llm_bls", "tensorrt_llm_bls")
    assert cfg.min_confidence == 0.0 and cfg.refusal_message == R.DEFAULT_REFUSAL


def test_config_from_params_reads_every_key_and_blank_means_default():
    cfg = R.RouterConfig.from_params({"small_model": " small_bls ", "large_model": "big_bls", "guard_model": "",
                                      "min_confidence": "0.6", "refusal_message": "No."})
    assert cfg == R.RouterConfig("prompt_guard", "small_bls", "big_bls", 0.6, "No.")


@pytest.mark.parametrize("value", ["abc", "-0.1", "1.5", "nan"])
def test_config_rejects_bad_min_confidence(value):
    with pytest.raises(ValueError, match="min_confidence"):
        R.RouterConfig.from_params({"min_confidence": value})


# --------------------------------------------------------------------------- verdict

def test_parse_verdict_decodes_label_and_keeps_probabilities():
    v = R.parse_verdict(guard_out(b"simple", [0.2, 0.7, 0.1]))
    assert v.label == "simple"
    np.testing.assert_array_equal(v.probabilities, np.array([0.2, 0.7, 0.1], dtype=np.float32))
    assert v.confidence == pytest.approx(0.7)


@pytest.mark.parametrize("outputs, match", [
    ({"label": np.array([[b"simple"]], dtype=object)}, "expected label and probabilities"),
    (guard_out(b"maybe", [0.2, 0.7, 0.1]), "'maybe' is not one of"),
    (guard_out(b"simple", [0.5, 0.5]), "shape"),
    ({"label": np.array([[b"a"], [b"b"]], dtype=object), "probabilities": np.zeros((2, 3), np.float32)}, "shape"),
])
def test_parse_verdict_rejects_what_the_contract_does_not_allow(outputs, match):
    with pytest.raises(R.RoutingError, match=match):
        R.parse_verdict(outputs)


# --------------------------------------------------------------------------- decide

def test_decide_follows_the_label():
    cfg = R.RouterConfig(small_model="small", large_model="large")
    for label, name, model in (("unsafe", R.REFUSED, None), ("simple", R.SMALL, "small"), ("complex", R.LARGE, "large")):
        v = verdict(label)
        route = R.decide(cfg, v)
        assert (route.name, route.model) == (name, model) and route.verdict is v


def test_unsure_simple_escalates_to_the_large_slot_but_unsafe_is_always_refused():
    cfg = R.RouterConfig(small_model="small", large_model="large", min_confidence=0.6)
    unsure = verdict("simple", [0.35, 0.45, 0.2])
    assert R.decide(cfg, unsure).model == "large"
    assert R.decide(cfg, verdict("simple", [0.2, 0.6, 0.2])).model == "small"  # boundary: >= keeps small
    assert R.decide(cfg, verdict("unsafe", [0.3, 0.3, 0.4])).model is None


def test_route_and_refusal_outputs_are_batch_one_tensors():
    cfg = R.RouterConfig(refusal_message="Nope \u2014 no.")
    route = R.decide(cfg, verdict("unsafe"))
    out = R.refusal_outputs(cfg, route)
    assert set(out) == {"text_output", "route", "moderation_label", "moderation_probabilities"}
    assert out["text_output"].shape == (1,) and out["text_output"][0].decode("utf-8") == "Nope \u2014 no."
    assert out["route"].tolist() == [[b"refused"]] and out["moderation_label"].tolist() == [[b"unsafe"]]
    assert out["moderation_probabilities"].dtype == np.float32 and out["moderation_probabilities"].shape == (1, 3)
    declared = {t.name for t in C.MODEL_TENSORS[C.ROUTER][1]}
    assert set(out) <= declared


# --------------------------------------------------------------------------- relay

def test_relay_streaming_forwards_each_response_and_ends_flag_only():
    relay = R.Relay(True, {"route": "r"})
    assert relay.push({"text_output": "a"}) == {"text_output": "a", "route": "r"}
    assert relay.push({"text_output": "b"}) == {"text_output": "b", "route": "r"}
    assert relay.close() is None
    with pytest.raises(RuntimeError):
        relay.close()


def test_relay_non_streaming_sends_one_final_response():
    relay = R.Relay(False, {"route": "r"})
    assert relay.push({"text_output": "whole answer"}) is None
    assert relay.close() == {"text_output": "whole answer", "route": "r"}
    with pytest.raises(RuntimeError):
        relay.push({"text_output": "late"})


def test_relay_non_streaming_without_inner_data_still_answers_with_the_route():
    assert R.Relay(False, {"route": "r"}).close() == {"route": "r"}


# --------------------------------------------------------------------------- contract vs built model

def test_contract_matches_the_built_prompt_guard():
    meta_path = ROOT / "build" / "classical" / "prompt_guard" / "meta.json"
    cfg_path = ROOT / "model_repository" / "prompt_guard" / "config.pbtxt"
    if not meta_path.exists() or not cfg_path.exists():
        pytest.skip("prompt_guard not built (python build_scripts/build_classical.py)")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    assert tuple(json.loads(meta_path.read_text())["classes"]) == C.PROMPT_GUARD_LABELS
    cfg = text_format.Parse(cfg_path.read_text(), mc.ModelConfig())
    for declared, built in ((C.PROMPT_GUARD_INPUTS, cfg.input), (C.PROMPT_GUARD_OUTPUTS, cfg.output)):
        assert [(t.name, t.dtype, list(t.dims)) for t in declared] == \
               [(b.name, mc.DataType.Name(b.data_type), list(b.dims)) for b in built]


# --------------------------------------------------------------------------- moderate mode (moderated_llm)

def test_moderate_mode_always_answers_with_the_answer_model_whatever_the_label():
    cfg = R.RouterConfig.from_params({"mode": "moderate", "answer_model": "ensemble", "min_confidence": "0.9"})
    for label in C.PROMPT_GUARD_LABELS:
        route = R.decide(cfg, verdict(label))
        assert (route.name, route.model) == (R.MODERATED, "ensemble")
        assert R.route_outputs(route)["moderation_label"].tolist() == [[label.encode()]]


def test_config_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        R.RouterConfig.from_params({"mode": "cascade"})
