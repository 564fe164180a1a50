"""deployment.yaml -> config.pbtxt: parses, matches NVIDIA's contract, cross-checks catch broken wiring."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[2]

import render_configs as rc  # noqa: E402
from config_checks import check_pipeline  # noqa: E402
from tritonllm import contract as C  # noqa: E402
from tritonllm.paths import resolve_param_path  # noqa: E402


@pytest.fixture(scope="module")
def deployment() -> dict:
    return rc.load_deployment(ROOT / "deployment.yaml")


@pytest.fixture()
def configs(deployment) -> dict[str, mc.ModelConfig]:
    return rc.render_default(deployment, ROOT)


def test_every_rendered_file_parses_back_to_the_same_config(deployment):
    files = rc.render_files(deployment, ROOT)
    configs = rc.render_default(deployment, ROOT)
    pbtxt = {p: t for p, t in files.items() if p.endswith("/config.pbtxt")}
    assert len(pbtxt) == len(rc.MODEL_DIRS)
    for name, model_dir in rc.MODEL_DIRS.items():
        parsed = text_format.Parse(pbtxt[f"{model_dir}/config.pbtxt"], mc.ModelConfig())
        assert parsed == configs[name]
        assert parsed.name == name
        assert f"{model_dir}/1/.gitkeep" in files  # Triton needs a version folder


def test_committed_configs_are_current():
    assert rc.main(["--check"]) == 0


def test_check_detects_drift_and_rendering_fixes_it(tmp_path):
    assert rc.main(["--repo", str(tmp_path)]) == 0
    assert rc.main(["--repo", str(tmp_path), "--check"]) == 0
    target = tmp_path / "model_repository/tensorrt_llm/config.pbtxt"
    target.write_text(target.read_text().replace("max_batch_size: 16", "max_batch_size: 4"))
    assert rc.main(["--repo", str(tmp_path), "--check"]) == 1
    assert rc.main(["--repo", str(tmp_path)]) == 0
    assert rc.main(["--repo", str(tmp_path), "--check"]) == 0


def test_rendered_pipeline_passes_cross_checks(configs):
    assert check_pipeline(configs) == []


def test_tensorrt_llm_keeps_nvidia_contract(configs):
    cfg = configs[C.TENSORRT_LLM]
    assert cfg.backend == "torchllm" and cfg.model_transaction_policy.decoupled and cfg.max_batch_size > 0
    inputs = {t.name: t for t in cfg.input}
    outputs = {t.name: t for t in cfg.output}

    def spec(t):
        return mc.DataType.Name(t.data_type), list(t.dims), t.optional, t.HasField("reshape")

    assert spec(inputs["input_lengths"]) == ("TYPE_INT32", [1], False, True)
    assert spec(inputs["request_output_len"]) == ("TYPE_INT32", [1], False, True)
    assert spec(inputs["stop_words_list"]) == ("TYPE_INT32", [2, -1], True, False)
    assert spec(inputs["streaming"]) == ("TYPE_BOOL", [1], True, True)
    assert spec(inputs["seed"]) == ("TYPE_UINT64", [1], True, True)
    assert spec(inputs["runtime_top_p"]) == ("TYPE_FP32", [1], True, True)
    assert inputs["input_ids"].allow_ragged_batch
    assert (mc.DataType.Name(outputs["output_ids"].data_type), list(outputs["output_ids"].dims)) == ("TYPE_INT32", [-1, -1])
    assert list(outputs["sequence_length"].dims) == [-1]


def test_engine_parameters_come_from_deployment_with_paths_relative_to_the_model(configs, deployment):
    params = {k: v.string_value for k, v in configs[C.TENSORRT_LLM].parameters.items()}
    yaml_params = deployment["models"]["tensorrt_llm"]["parameters"]
    model_dir = ROOT / rc.MODEL_DIRS[C.TENSORRT_LLM]
    for key, value in yaml_params.items():
        if key == "lora_adapters":  # {task id: folder} -> "1=<folder relative to the model dir>,..."
            pairs = dict(item.split("=", 1) for item in params[key].split(",") if item)
            assert {int(t): resolve_param_path(p, model_dir, confine=ROOT) for t, p in pairs.items()} == {
                int(t): (ROOT / p).resolve() for t, p in value.items()}
            continue
        assert params[key] == rc.param_str(value)
    assert not Path(params["gpt_model_path"]).is_absolute()
    assert resolve_param_path(params["gpt_model_path"], model_dir, confine=ROOT) == (
        ROOT / deployment["llm"]["gpt_model_path"]).resolve()
    for name in (C.PREPROCESSING, C.POSTPROCESSING, C.BLS):
        tok = configs[name].parameters["tokenizer_dir"].string_value
        assert resolve_param_path(tok, ROOT / rc.MODEL_DIRS[name]) == (ROOT / deployment["llm"]["tokenizer_dir"]).resolve()


def test_ensemble_wiring_is_nvidias_with_the_text_made_in_the_llm_step(configs, deployment):
    ens = configs[C.ENSEMBLE]
    assert ens.platform == "ensemble"
    assert [s.model_name for s in ens.ensemble_scheduling.step] == [C.PREPROCESSING, C.TENSORRT_LLM]
    llm_step = ens.ensemble_scheduling.step[1]
    assert llm_step.input_map["streaming"] == "stream"
    assert llm_step.input_map["runtime_top_k"] == "top_k"
    assert llm_step.output_map["text_output"] == "text_output"
    assert not {"output_ids", "sequence_length", "request_key", "is_final"} & set(llm_step.output_map)
    assert (configs[C.TENSORRT_LLM].parameters["skip_special_tokens"].string_value
            == configs[C.POSTPROCESSING].parameters["skip_special_tokens"].string_value)
    # detokenize_in: postprocessing renders NVIDIA's three steps; the ensemble's tensors are the same
    three = copy.deepcopy(deployment)
    three["models"]["ensemble"] = {"detokenize_in": "postprocessing"}
    rc.validate(three)
    nvidia = rc.render_default(three, ROOT)[C.ENSEMBLE]
    assert [s.model_name for s in nvidia.ensemble_scheduling.step] == [C.PREPROCESSING, C.TENSORRT_LLM,
                                                                     C.POSTPROCESSING]
    assert nvidia.ensemble_scheduling.step[2].output_map["OUTPUT"] == "text_output"
    assert (list(nvidia.input), list(nvidia.output)) == (list(ens.input), list(ens.output))
    names = {t.name for t in ens.input}
    assert {"text_input", "max_tokens", "stream", "temperature", "top_k", "top_p", "stop_words", "bad_words",
            "end_id", "pad_id"} <= names
    # the BLS takes NVIDIA's ensemble inputs, and ours on top (marked nvidia=False in the contract)
    bls = {t.name for t in configs[C.BLS].input}
    assert {t.name for t in ens.input} == bls - {t.name for t in C.BLS_INPUTS if not t.nvidia}


def _errors_after(configs, mutate) -> list[str]:
    broken = copy.deepcopy(configs)
    mutate(broken)
    return check_pipeline(broken)


def test_cross_check_catches_dtype_mismatch(configs):
    def mutate(c):
        c[C.ENSEMBLE].ensemble_scheduling.step[1].input_map["runtime_top_k"] = "temperature"  # FP32 -> INT32
    errors = _errors_after(configs, mutate)
    assert any("dtype mismatch" in e and "runtime_top_k" in e for e in errors), errors


def test_cross_check_catches_unknown_tensor_and_unmapped_required_input(configs):
    def mutate(c):
        step = c[C.ENSEMBLE].ensemble_scheduling.step[1]
        step.input_map["not_an_input"] = "top_k"
        del step.input_map["input_lengths"]
        step.input_map["request_output_len"] = "_NEVER_PRODUCED"
    errors = _errors_after(configs, mutate)
    assert any("'not_an_input' is not an input of tensorrt_llm" in e for e in errors), errors
    assert any("required input 'input_lengths'" in e for e in errors), errors
    assert any("'_NEVER_PRODUCED'" in e for e in errors), errors


def test_decoupled_mode_sets_tensorrt_llm_and_the_bls_and_nothing_else(deployment):
    """NVIDIA's decoupled_mode: a unary pipeline keeps its streaming inputs and still cross-checks."""
    unary = copy.deepcopy(deployment)
    unary["llm"]["decoupled_mode"] = False
    configs = rc.render_default(unary, ROOT)
    assert not rc.check_pipeline(configs)
    for name, cfg in configs.items():
        expected = name in (C.ROUTER, C.MODERATED)  # the routers keep their own setting
        assert cfg.model_transaction_policy.decoupled == expected, name
    assert "streaming" in {t.name for t in configs[C.TENSORRT_LLM].input}
    default = rc.render_default(deployment, ROOT)
    assert all(default[n].model_transaction_policy.decoupled for n in C.DECOUPLED_MODE_MODELS)
    unary["llm"]["decoupled_mode"] = "yes"
    with pytest.raises(rc.DeploymentError, match="decoupled_mode"):
        rc.validate(unary)
    per_model = copy.deepcopy(deployment)
    per_model["models"][C.BLS]["decoupled"] = False
    with pytest.raises(rc.DeploymentError, match="set llm.decoupled_mode instead"):
        rc.validate(per_model)


def test_unary_profile_flips_only_the_decoupled_mode_models(deployment):
    files = rc.render_files(deployment, ROOT)
    unary = {p.split("/")[-3]: text_format.Parse(t, mc.ModelConfig()) for p, t in files.items()
             if p.endswith("configs/unary.pbtxt")}
    assert set(unary) == set(C.DECOUPLED_MODE_MODELS)
    default = rc.render_default(deployment, ROOT)
    for name, cfg in unary.items():
        assert not cfg.model_transaction_policy.decoupled
        cfg.model_transaction_policy.decoupled = True
        assert cfg == default[name], name  # nothing else differs


def test_cross_check_catches_batch_size_and_placeholder(configs):
    def mutate(c):
        c[C.ENSEMBLE].max_batch_size = c[C.TENSORRT_LLM].max_batch_size + 1
        c[C.PREPROCESSING].parameters["tokenizer_dir"].string_value = "${tokenizer_dir}"
    errors = _errors_after(configs, mutate)
    assert any("exceeds the step's" in e for e in errors), errors
    assert any(e.startswith("preprocessing:") and "placeholder" in e for e in errors), errors


def test_render_refuses_a_broken_pipeline(deployment, monkeypatch):
    # A contract edit that breaks the wiring must stop the renderer before it writes anything.
    steps = list(C.ensemble_steps())
    name, inp, out = steps[2]
    steps[2] = (name, {**inp, "TOKENS_BATCH": "_SEQUENCE_LENGTH"}, out)  # rank 1 into rank 2
    monkeypatch.setattr(C, "ensemble_steps", lambda **_: tuple(steps))
    with pytest.raises(rc.DeploymentError, match="dims mismatch"):
        rc.render_files(deployment, ROOT)


def test_ensemble_settings_are_validated(deployment):
    for bad_spec, word in (({"detokenize_in": "client"}, "allowed"), ({"steps": 2}, "not a setting")):
        bad = copy.deepcopy(deployment)
        bad["models"]["ensemble"] = bad_spec
        with pytest.raises(rc.DeploymentError, match="models.ensemble") as err:
            rc.validate(bad)
        assert word in str(err.value)


@pytest.mark.parametrize("key, value, word", [
    ("engine_device", "tpu", "allowed"),
    ("max_num_tokens", 0, "must be >= 1"),
    ("kv_cache_free_gpu_mem_fraction", 1.5, "must be <= 1"),
    ("engine_dtype", "float64", "allowed: auto, float32, bfloat16, float16"),
    ("max_queue_size", "8", "must be int"),
])
def test_deployment_values_are_validated(deployment, key, value, word):
    bad = copy.deepcopy(deployment)
    bad["models"]["tensorrt_llm"]["parameters"][key] = value
    with pytest.raises(rc.DeploymentError, match=key) as err:
        rc.validate(bad)
    assert word in str(err.value)


def test_unknown_profile_is_refused(deployment):
    bad = copy.deepcopy(deployment)
    bad["profiles"] = {"no_such_profile": {}}
    with pytest.raises(rc.DeploymentError, match="no_such_profile"):
        rc.validate(bad)


def test_profile_hook_writes_configs_folder_and_is_cross_checked(deployment, tmp_path, monkeypatch):
    (tmp_path / "gpu.py").write_text(
        "import copy\n"
        "def render(deployment, settings, repo, defaults):\n"
        "    cfg = defaults['tensorrt_llm']\n"
        "    cfg.backend = settings['backend']\n"
        "    if settings.get('break_wiring'):\n"
        "        cfg.output.remove(next(o for o in cfg.output if o.name == 'text_output'))\n"
        "    return {'tensorrt_llm': cfg}\n")
    monkeypatch.setattr(rc, "PROFILES", rc.discover_profiles(tmp_path))
    with_profile = copy.deepcopy(deployment)
    with_profile["profiles"] = {"gpu": {"backend": "tensorrtllm"}}
    rc.validate(with_profile)
    files = rc.render_files(with_profile, ROOT)
    gpu = text_format.Parse(files["model_repository/tensorrt_llm/configs/gpu.pbtxt"], mc.ModelConfig())
    assert gpu.backend == "tensorrtllm"
    assert not any(p.startswith("model_repository/preprocessing/configs/") for p in files)
    with_profile["profiles"]["gpu"]["break_wiring"] = True
    with pytest.raises(rc.DeploymentError, match="cross-check failed for 'gpu'"):
        rc.render_files(with_profile, ROOT)


def test_engine_stream_keys_reach_postprocessing_and_nvidia_wiring_omits_them(configs):
    ens = rc.ensemble_model({"max_batch_size": configs[C.ENSEMBLE].max_batch_size}, steps=C.ensemble_steps())
    assert check_pipeline({**configs, C.ENSEMBLE: ens}) == []
    llm_step, post_step = ens.ensemble_scheduling.step[1], ens.ensemble_scheduling.step[2]
    assert llm_step.output_map["request_key"] == post_step.input_map["REQUEST_KEY"] == "_REQUEST_KEY"
    assert llm_step.output_map["is_final"] == post_step.input_map["IS_FINAL"] == "_IS_FINAL"
    post_inputs = {t.name: t for t in configs[C.POSTPROCESSING].input}
    assert post_inputs["REQUEST_KEY"].optional and post_inputs["IS_FINAL"].optional
    assert "request_key" not in {t.name for t in ens.output}  # internal only, never client-facing
    # The GPU profile's engine (NVIDIA's) emits neither: its wiring must still pass the cross-checks.
    nvidia = copy.deepcopy(configs)
    nvidia[C.ENSEMBLE] = rc.ensemble_model(
        {"max_batch_size": ens.max_batch_size}, steps=C.ensemble_steps(engine_stream_keys=False))
    del nvidia[C.TENSORRT_LLM].output[:]
    nvidia[C.TENSORRT_LLM].output.extend(rc.tensor_msg(t, mc.ModelOutput) for t in C.NVIDIA_TENSORRT_LLM_OUTPUTS)
    assert check_pipeline(nvidia) == []
    steps = nvidia[C.ENSEMBLE].ensemble_scheduling.step
    assert "request_key" not in steps[1].output_map and "REQUEST_KEY" not in steps[2].input_map


def test_the_knob_table_is_the_one_definition():
    """docs/engine.md's table is knobs.markdown_table(); EngineConfig's defaults are the knobs'; parsing
    the rendered config.pbtxt parameters gives the deployment.yaml values."""
    import dataclasses

    from tritonllm.engine import knobs
    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.config import engine_config_from_parameters

    doc = (ROOT / "docs" / "engine.md").read_text()
    assert doc.split("<!-- knobs:begin -->\n")[1].split("<!-- knobs:end -->")[0] == knobs.markdown_table()
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    assert all(defaults[k.field] == k.default for k in knobs.KNOBS if k.field)
    yaml_params = yaml.safe_load((ROOT / "deployment.yaml").read_text())["models"]["tensorrt_llm"]["parameters"]
    config, exclude = engine_config_from_parameters({k: rc.param_str(v) for k, v in yaml_params.items()
                                                     if k in knobs.BY_PARAM})
    for param, value in yaml_params.items():
        knob = knobs.BY_PARAM.get(param)
        if knob is not None and knob.field:
            assert getattr(config, knob.field) == value, param
    with pytest.raises(ValueError, match="engine_dtype"):
        engine_config_from_parameters({"engine_dtype": "float64"})


def test_an_empty_value_names_its_key_and_empty_lora_adapters_means_none(deployment):
    """`key:` with its value commented out: the error says which key; `lora_adapters:` with every entry commented
    out renders as no adapters."""
    bad = copy.deepcopy(deployment)
    bad["models"]["tensorrt_llm"]["parameters"]["max_queue_size"] = None
    with pytest.raises(rc.DeploymentError, match=r"models\.tensorrt_llm\.parameters\.max_queue_size is empty"):
        rc.render_default(bad, ROOT)
    none = copy.deepcopy(deployment)
    none["models"]["tensorrt_llm"]["parameters"]["lora_adapters"] = None
    configs = rc.render_default(none, ROOT)
    assert configs[C.TENSORRT_LLM].parameters["lora_adapters"].string_value == ""


def test_an_adapter_for_another_base_model_is_refused_at_render_time(deployment, tmp_path):
    """The two checkpoint paths changed with an adapter of the old model still listed: render says which adapter
    does not fit and how to drop it (the engine would say so only when the server loads), for an HF folder and
    a GGUF file; an adapter trained for the checkpoint renders."""
    from engine_helpers import make_checkpoint
    from gguf_helpers import write_gguf
    from lora_helpers import make_adapter

    base = make_checkpoint(tmp_path / "base", "llama")
    deeper = make_checkpoint(tmp_path / "deeper", "llama", num_hidden_layers=3)
    fits = make_adapter(base, str(tmp_path / "fits"), targets=["q_proj", "v_proj"])
    misfit = make_adapter(deeper, str(tmp_path / "misfit"), targets=["q_proj"])
    dep = copy.deepcopy(deployment)
    params = dep["models"]["tensorrt_llm"]["parameters"]
    for checkpoint in (base, write_gguf(tmp_path / "base.gguf", base)):
        dep["llm"]["gpt_model_path"] = dep["llm"]["tokenizer_dir"] = checkpoint
        params["lora_adapters"] = {1: fits}
        assert rc.render_default(dep, ROOT)[C.TENSORRT_LLM].parameters["lora_adapters"].string_value == f"1={fits}"
        params["lora_adapters"] = {1: fits, 7: misfit}
        with pytest.raises(rc.DeploymentError) as e:
            rc.render_default(dep, ROOT)
        message = str(e.value)
        assert f"lora_adapters[7] ({misfit}) does not fit llm.gpt_model_path ({checkpoint})" in message, message
        assert "targets layer 2, the model has 2" in message and "lora_adapters: {} for none" in message, message
