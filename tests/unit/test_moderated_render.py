"""render_configs: llm_router and moderated_llm (both served by backend llm_router) are rendered from deployment.yaml."""
from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[2]

import render_configs as rc  # noqa: E402
from tritonllm import contract as C  # noqa: E402
from tritonllm import routing as R  # noqa: E402


@pytest.fixture(scope="module")
def files():
    return rc.render_files(rc.load_deployment(), ROOT)


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


@pytest.mark.parametrize("name", [C.ROUTER, C.MODERATED])
def test_router_models_are_decoupled_unbatched_bls_with_the_text_contract(files, name):
    cfg = parse(files[f"model_repository/{name}/config.pbtxt"])
    assert cfg.name == name and cfg.backend == "llm_router" and cfg.model_transaction_policy.decoupled
    assert not cfg.HasField("dynamic_batching")  # the BLS fans out to batched models itself
    assert [t.name for t in cfg.input] == [t.name for t in C.TEXT_INPUTS]
    outputs = {t.name for t in cfg.output}
    assert {t.name for t in C.TEXT_OUTPUTS} <= outputs
    assert {"route", "moderation_label", "moderation_probabilities"} <= outputs
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    R.RouterConfig.from_params(params)  # the rendered parameters are ones the backend accepts


def test_router_and_moderated_modes_and_slots(files):
    router = R.RouterConfig.from_params({k: v.string_value for k, v in parse(
        files["model_repository/llm_router/config.pbtxt"]).parameters.items()})
    moderated = R.RouterConfig.from_params({k: v.string_value for k, v in parse(
        files["model_repository/moderated_llm/config.pbtxt"]).parameters.items()})
    assert (router.mode, router.small_model, router.large_model) == (R.ROUTE, C.BLS, C.BLS)
    assert (moderated.mode, moderated.answer_model) == (R.MODERATE, C.ENSEMBLE)
    assert router.guard_model == moderated.guard_model == C.PROMPT_GUARD
