"""tritonllm.paths: config path parameters resolve against the model directory, confined to the repo."""
from __future__ import annotations

import pytest

from tritonllm.paths import relative_to_model_dir, resolve_param_path


@pytest.fixture()
def repo(tmp_path):
    (tmp_path / "model_repository" / "tensorrt_llm").mkdir(parents=True)
    (tmp_path / "build" / "models" / "demo").mkdir(parents=True)
    return tmp_path


def test_relative_path_resolves_against_the_model_directory(repo):
    model_dir = repo / "model_repository" / "tensorrt_llm"
    got = resolve_param_path("../../build/models/demo", model_dir, name="gpt_model_path", confine=repo,
                             must_exist=True)
    assert got == (repo / "build" / "models" / "demo").resolve()
    assert relative_to_model_dir(got, model_dir) == "../../build/models/demo"


def test_absolute_path_stays_and_is_not_confined(repo, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("checkpoint")
    got = resolve_param_path(str(elsewhere), repo / "model_repository" / "tensorrt_llm", confine=repo)
    assert got == elsewhere.resolve()


def test_relative_escape_is_rejected_naming_the_parameter(repo):
    with pytest.raises(ValueError, match="'tokenizer_dir' points outside"):
        resolve_param_path("../../../etc", repo / "model_repository" / "tensorrt_llm", name="tokenizer_dir",
                           confine=repo)


def test_escape_through_a_symlink_is_rejected(repo, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (repo / "build" / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="points outside"):
        resolve_param_path("../../build/link", repo / "model_repository" / "tensorrt_llm", name="p", confine=repo)


@pytest.mark.parametrize("value", ["", "   ", "${tokenizer_dir}"])
def test_empty_or_unfilled_value_is_rejected(repo, value):
    with pytest.raises(ValueError, match="'tokenizer_dir' is empty or an unfilled template"):
        resolve_param_path(value, repo, name="tokenizer_dir")


def test_missing_path_is_reported_when_required(repo):
    with pytest.raises(ValueError, match="'gpt_model_path' points to a missing path"):
        resolve_param_path("nope", repo, name="gpt_model_path", must_exist=True)
