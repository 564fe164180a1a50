"""GPU profile `trtllm`: rendered configs parse, pass the cross-checks, follow NVIDIA's tensorrtllm config,
drop our engine-only outputs (request_key / is_final) everywhere, and the MPI launch line is NVIDIA's."""
from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[2]

import render_configs as rc  # noqa: E402
import serve_trtllm_mpi as mpi  # noqa: E402
from config_checks import check_pipeline  # noqa: E402
from profiles import trtllm  # noqa: E402
from tritonllm import contract as C  # noqa: E402

GPU_FILES = ("model_repository/tensorrt_llm/configs/trtllm.pbtxt", "ensembles/ensemble/configs/trtllm.pbtxt")


@pytest.fixture(scope="module")
def deployment() -> dict:
    return rc.load_deployment(ROOT / "deployment.yaml")


@pytest.fixture(scope="module")
def files(deployment) -> dict[str, str]:
    return rc.render_files(deployment, ROOT)


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_gpu_files_are_rendered_parse_and_are_committed(files):
    for rel in GPU_FILES:
        assert rel in files
        assert parse(files[rel]).name in (C.TENSORRT_LLM, C.ENSEMBLE)
        assert (ROOT / rel).read_text() == files[rel], f"{rel} is stale: run build_scripts/render_configs.py"


def test_gpu_set_passes_the_cross_checks(deployment, files):
    gpu_set = rc.render_default(deployment, ROOT)
    gpu_set[C.TENSORRT_LLM] = parse(files[GPU_FILES[0]])
    gpu_set[C.ENSEMBLE] = parse(files[GPU_FILES[1]])
    assert check_pipeline(gpu_set) == []


def test_tensorrt_llm_gpu_config_is_nvidias(deployment, files):
    cfg = parse(files[GPU_FILES[0]])
    settings = deployment["profiles"]["trtllm"]
    assert cfg.backend == "tensorrtllm" and not cfg.platform
    assert cfg.model_transaction_policy.decoupled
    assert cfg.max_batch_size == deployment["llm"]["max_batch_size"]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [cfg.max_batch_size]
    assert cfg.dynamic_batching.default_queue_policy.max_queue_size == settings["max_queue_size"]
    # NVIDIA's config declares KIND_CPU: the backend's executor places the engine on the GPUs by MPI rank.
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(1, mc.ModelInstanceGroup.KIND_CPU)]
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == "/workspace/tritonllm/model_repository/tensorrt_llm/1"
    assert params["kv_cache_free_gpu_mem_fraction"] == str(settings["kv_cache_free_gpu_mem_fraction"])
    assert params["batch_scheduler_policy"] == settings["batch_scheduler_policy"]
    for key in ("enable_kv_cache_reuse", "enable_chunked_context", "exclude_input_in_output"):
        assert params[key] == ("true" if settings[key] else "false")
    assert params["max_beam_width"] == "1"
    assert not any("${" in v for v in params.values())


def test_gpu_tensors_equal_the_default_ones_minus_engine_only_outputs(deployment, files):
    gpu = parse(files[GPU_FILES[0]])
    cpu = rc.render_default(deployment, ROOT)[C.TENSORRT_LLM]
    # same tensor mapping as render_configs.tensor_msg, minus our marker input
    drop_in, drop_out = trtllm.left_out(trtllm.settings_with_defaults(deployment["profiles"]["trtllm"]))
    assert list(gpu.input) == [t for t in cpu.input if t.name not in drop_in]
    ours = {"ensemble_names", C.POOLING_INPUT.name, C.LORA_PATH_INPUT.name, *(t.name for t in C.ENGINE_REQUEST_INPUTS)}
    assert trtllm.NON_NVIDIA_INPUTS == ours and trtllm.NON_NVIDIA_INPUTS <= drop_in
    assert list(gpu.output) == [t for t in cpu.output if t.name not in drop_out]
    assert not {t.name for t in gpu.output} & {"request_key", "is_final"}


def test_gpu_ensemble_has_no_mapping_of_engine_only_outputs(deployment, files):
    ens = parse(files[GPU_FILES[1]])
    # NVIDIA's three steps: their backend cannot make text_output (the default two-step wiring's)
    default = rc.ensemble_model(deployment["llm"], steps=C.ensemble_steps())
    assert [s.model_name for s in ens.ensemble_scheduling.step] == [s.model_name for s in default.ensemble_scheduling.step]
    for step in ens.ensemble_scheduling.step:
        assert not set(step.output_map) & trtllm.NON_NVIDIA_OUTPUTS
        assert not any(v.lstrip("_").lower() in trtllm.NON_NVIDIA_OUTPUTS for v in step.input_map.values())
    # Everything else is the default wiring, unchanged.
    drop_in, drop_out = trtllm.left_out(trtllm.settings_with_defaults(deployment["profiles"]["trtllm"]))
    ours = {t.name for tensors in C.MODEL_TENSORS.values() for group in tensors for t in group if not t.nvidia}
    ours |= drop_out
    for gpu_step, cpu_step in zip(ens.ensemble_scheduling.step, default.ensemble_scheduling.step):
        cpu_out = {k: v for k, v in cpu_step.output_map.items() if k not in ours}
        assert dict(gpu_step.output_map) == cpu_out
        assert set(gpu_step.input_map.items()) <= set(cpu_step.input_map.items())
    gone = {t.name for t in default.input} - {t.name for t in ens.input}
    assert gone and gone <= drop_in  # only inputs of features the engine lacks, e.g. lora_task_id
    assert [t for t in default.input if t.name not in gone] == list(ens.input)
    # (the ensemble's text_output is postprocessing's here; tensorrt_llm's own, of the same name, is ours)
    kept = [t for t in default.output if t.name not in drop_out - {C.LLM_TEXT_OUTPUT.name}]
    assert sorted(kept, key=lambda t: t.name) == sorted(ens.output, key=lambda t: t.name)


def test_pruning_refuses_a_required_input_fed_only_by_an_engine_only_output(monkeypatch, deployment):
    steps = [list(s) for s in trtllm._nvidia_steps()]
    tl = next(s for s in steps if s[0] == C.TENSORRT_LLM)
    post = next(s for s in steps if s[0] == C.POSTPROCESSING)
    tl[2] = {**tl[2], "is_final": "_IS_FINAL"}
    post[1] = {**post[1], "SEQUENCE_LENGTH": "_IS_FINAL"}  # required input now fed by a pruned tensor
    monkeypatch.setattr(trtllm, "_nvidia_steps", lambda: tuple(tuple(s) for s in steps))
    with pytest.raises(trtllm.ProfileError, match="SEQUENCE_LENGTH"):
        trtllm.ensemble_config(deployment)


@pytest.mark.parametrize("key, value, msg", [
    ("tp_size", 0, "tp_size"),
    ("kv_cache_free_gpu_mem_fraction", 1.5, r"\(0, 1\]"),
    ("batch_scheduler_policy", "fifo", "batch_scheduler_policy"),
    ("enable_kv_cache_reuse", "yes", "true or false"),
    ("container_repo_root", "workspace", "absolute"),
    ("max_queue_size", -1, "max_queue_size"),
])
def test_bad_settings_are_refused(deployment, key, value, msg):
    dep = copy.deepcopy(deployment)
    dep["profiles"]["trtllm"][key] = value
    with pytest.raises(ValueError, match=msg):
        rc.render_files(dep, ROOT)


def test_absolute_engine_dir_is_kept_and_relative_joins_the_container_root(deployment):
    s = {**deployment["profiles"]["trtllm"], "engine_dir": "/engines/llama-fp8-tp2"}
    assert trtllm.engine_path(trtllm.settings_with_defaults(s)) == "/engines/llama-fp8-tp2"
    s = {**s, "engine_dir": "engines/x/../y", "container_repo_root": "/srv/repo"}
    assert trtllm.engine_path(trtllm.settings_with_defaults(s)) == "/srv/repo/engines/y"


def test_mpirun_command_is_nvidias_leader_mode_layout():
    cmd = mpi.mpirun_command(2, "/opt/tritonserver/bin/tritonserver", http_port=8000, grpc_port=8001,
                             metrics_port=8002, repositories=["/r/model_repository", "/r/ensembles"],
                             backend_dir="/r/build/backends")
    common = ["/opt/tritonserver/bin/tritonserver", "--model-repository=/r/model_repository",
              "--model-repository=/r/ensembles", "--backend-directory=/r/build/backends",
              "--model-config-name=trtllm", "--http-port=8000", "--grpc-port=8001", "--metrics-port=8002"]
    assert cmd == ["mpirun", "--allow-run-as-root",
                   "-n", "1", *common, "--disable-auto-complete-config",
                   "--backend-config=python,shm-region-prefix-name=prefix0_",
                   ":", "-n", "1", *common, "--model-control-mode=explicit", "--load-model=tensorrt_llm",
                   "--disable-auto-complete-config", "--backend-config=python,shm-region-prefix-name=prefix1_"]
    with pytest.raises(ValueError):
        mpi.mpirun_command(0, "x", http_port=1, grpc_port=2, metrics_port=3, repositories=[], backend_dir="b")


def test_mpi_dry_run_uses_tp_times_pp_from_the_deployment(capsys, deployment):
    assert mpi.main(["--dry-run", "--tritonserver", "/opt/tritonserver/bin/tritonserver"]) == 0
    cmd = shlex.split(capsys.readouterr().out)
    s = deployment["profiles"]["trtllm"]
    assert cmd.count("-n") == s["tp_size"] * s["pp_size"] == mpi.world_size(s)
    assert mpi.world_size(None) == 1 and mpi.world_size({"tp_size": 4, "pp_size": 2}) == 8
    with pytest.raises(ValueError, match="tp_size"):
        mpi.world_size({"tp_size": 0})
    assert f"--http-port={deployment['server']['http_port']}" in cmd
    assert mpi.main(["--dry-run", "--world-size", "4", "--tritonserver", "ts"]) == 0
    cmd = shlex.split(capsys.readouterr().out)
    assert cmd.count(":") == 3 and cmd.count("--load-model=tensorrt_llm") == 3


def test_every_key_nvidias_backend_requires_is_rendered_and_every_rendered_key_is_read(files):
    """The C++ backend throws "Cannot find parameter with name: ..." for REQUIRED keys (NVIDIA's
    model_instance_state.cc, see profiles/_tensorrtllm_params.py); a key it never reads would be a typo."""
    from profiles import _tensorrtllm_params as P

    params = parse(files[GPU_FILES[0]]).parameters
    assert set(P.REQUIRED) == {"gpt_model_type", "tokenizer_dir", "xgrammar_tokenizer_info_path",
                               "guided_decoding_backend"}
    assert set(P.REQUIRED) <= set(params)
    assert set(params) <= set(P.BY_KEY) | set(P.TEMPLATE_ONLY)
    assert params["tokenizer_dir"].string_value == "/workspace/tritonllm/build/models/SmolLM2-135M-Instruct"
    # guided decoding off: both empty, as the backend's "unset" (model_instance_state.cc:424-427)
    assert params["xgrammar_tokenizer_info_path"].string_value == params["guided_decoding_backend"].string_value == ""


FEATURE_ON = {"lora": True, "gather_logits": True, "max_draft_len": 4, "guided_decoding": True}


@pytest.mark.parametrize("feature", sorted(trtllm.FEATURES))
def test_a_feature_the_engine_is_built_with_brings_its_tensors_back(deployment, feature):
    dep = copy.deepcopy(deployment)
    dep["profiles"]["trtllm"][feature] = FEATURE_ON[feature]
    dep["profiles"]["trtllm"]["lora_prefetch_dir"] = "build/trtllm/lora"
    files = rc.render_files(dep, ROOT)  # passes the cross-checks
    llm, ens = parse(files[GPU_FILES[0]]), parse(files[GPU_FILES[1]])
    ins, outs = trtllm.FEATURES[feature]
    assert set(ins) <= {t.name for t in llm.input} and set(outs) <= {t.name for t in llm.output}
    off = rc.render_files(deployment, ROOT)
    off_llm = parse(off[GPU_FILES[0]])
    assert not (set(ins) & {t.name for t in off_llm.input}) and not (set(outs) & {t.name for t in off_llm.output})
    ens_in = {t.name for t in ens.input}
    assert ens_in - {t.name for t in parse(off[GPU_FILES[1]]).input} <= set(ins)
    params = {k: v.string_value for k, v in llm.parameters.items()}
    if feature == "guided_decoding":
        assert params["guided_decoding_backend"] == "xgrammar"
        assert params["xgrammar_tokenizer_info_path"] == \
            "/workspace/tritonllm/model_repository/tensorrt_llm/1/xgrammar_tokenizer_info.json"
    if feature == "lora":
        assert params["lora_prefetch_dir"] == "/workspace/tritonllm/build/trtllm/lora"
    else:
        assert "lora_prefetch_dir" not in params


@pytest.mark.parametrize("changes, msg", [
    ({"qformat": "int3"}, "qformat"),
    ({"kv_cache_dtype": "fp4"}, "kv_cache_dtype"),
    ({"max_draft_len": -1}, "max_draft_len"),
    ({"max_draft_len": 4, "gather_logits": True}, "cannot be combined"),
    ({"lora_target_modules": []}, "lora_target_modules"),
])
def test_bad_feature_settings_are_refused(deployment, changes, msg):
    dep = copy.deepcopy(deployment)
    dep["profiles"]["trtllm"].update(changes)
    with pytest.raises(ValueError, match=msg):
        rc.render_files(dep, ROOT)


# ------------------------------------------------------------------ quantized checkpoints and weight-only formats
import json  # noqa: E402

import _quant_checkpoint as QC  # noqa: E402  (build_scripts/profiles, put on sys.path by profiles.trtllm)
from tritonllm.trtllm import names as N  # noqa: E402

AUTOGPTQ = {"bits": 4, "checkpoint_format": "gptq", "damp_percent": 0.01, "desc_act": False, "group_size": 128,
            "quant_method": "gptq", "static_groups": False, "sym": True, "true_sequential": True}
AUTOAWQ = {"bits": 4, "group_size": 64, "modules_to_not_convert": None, "quant_method": "awq", "version": "gemm",
           "zero_point": True}


def hf_folder(folder: Path, quantization_config=None, architecture="LlamaForCausalLM") -> Path:
    folder.mkdir(parents=True)
    config = {"architectures": [architecture], "model_type": "llama"}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_qformats_are_quantize_py_choices_plus_checkpoint():
    assert trtllm.QUANTIZE_QFORMATS == ("fp8", "int4_awq", "w4a8_awq", "int8_sq", "int8_wo", "int4_wo")
    assert set(trtllm.QUANTIZE_QFORMATS) <= N.fields("qformat") and "checkpoint" not in N.fields("qformat")
    assert trtllm.QFORMATS == trtllm.QUANTIZE_QFORMATS + ("checkpoint",)


@pytest.mark.parametrize("qformat, kv", [("int8_wo", "auto"), ("int4_wo", "int8"), ("int4_wo", "fp8")])
def test_weight_only_formats_render(deployment, qformat, kv):
    dep = copy.deepcopy(deployment)
    dep["profiles"]["trtllm"].update(qformat=qformat, kv_cache_dtype=kv)
    files = rc.render_files(dep, ROOT)  # passes the cross-checks
    assert parse(files[GPU_FILES[0]]).backend == "tensorrtllm"


@pytest.mark.parametrize("quantization_config, want", [
    (AUTOGPTQ, ("W4A16_GPTQ", 128, "AutoGPTQ")),
    (AUTOAWQ, ("W4A16_GPTQ", 64, "AutoAWQ (use_autoawq)")),  # convert_checkpoint.py: awq -> W4A16_GPTQ
])
def test_qformat_checkpoint_reads_autoawq_and_autogptq_as_the_llama_converter_does(tmp_path, quantization_config,
                                                                                    want):
    folder = hf_folder(tmp_path / "ckpt", quantization_config)
    s = trtllm.settings_with_defaults({"qformat": "checkpoint", "kv_cache_dtype": "auto",
                                       "checkpoint_dir": str(folder)})
    got = trtllm.checkpoint_check(s, ROOT)
    assert (got.quant_algo, got.group_size, got.note) == want


@pytest.mark.parametrize("qformat, quantization_config, arch, field", [
    ("checkpoint", {**AUTOGPTQ, "desc_act": True}, "LlamaForCausalLM", "quantization_config.desc_act"),
    ("checkpoint", {**AUTOGPTQ, "bits": 8}, "LlamaForCausalLM", "quantization_config.bits"),
    ("checkpoint", {**AUTOGPTQ, "checkpoint_format": "gptq_v2"}, "LlamaForCausalLM",
     "quantization_config.checkpoint_format"),
    ("checkpoint", {**AUTOAWQ, "version": "gemv"}, "LlamaForCausalLM", "quantization_config.version"),
    ("checkpoint", {"quant_method": "compressed-tensors"}, "LlamaForCausalLM", "quantization_config.quant_method"),
    ("checkpoint", None, "LlamaForCausalLM", "config.json: quantization_config: missing"),
    ("checkpoint", AUTOGPTQ, "Qwen2ForCausalLM", "config.json: architectures"),
    ("fp8", AUTOGPTQ, "LlamaForCausalLM", "quantization_config.quant_method: 'gptq': already quantized"),
    ("int4_wo", AUTOAWQ, "LlamaForCausalLM", "quantization_config.quant_method: 'awq': already quantized"),
])
def test_a_checkpoint_dir_that_does_not_fit_the_qformat_is_refused_naming_the_field(deployment, tmp_path, qformat,
                                                                                    quantization_config, arch, field):
    folder = hf_folder(tmp_path / "ckpt", quantization_config, arch)
    dep = copy.deepcopy(deployment)
    dep["profiles"]["trtllm"].update(qformat=qformat, kv_cache_dtype="auto", checkpoint_dir=str(folder))
    with pytest.raises(ValueError, match=r"profiles\.trtllm\.checkpoint_dir = .*" + re.escape(field)):
        rc.render_files(dep, ROOT)


def test_a_modelopt_export_is_for_the_llmapi_profile_and_a_float_folder_for_quantize_py(tmp_path):
    folder = hf_folder(tmp_path / "ckpt")
    assert trtllm.checkpoint_check(trtllm.settings_with_defaults({"checkpoint_dir": str(folder)}), ROOT) is None
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    for qformat in ("fp8", "checkpoint"):
        s = trtllm.settings_with_defaults({"qformat": qformat, "kv_cache_dtype": "auto", "checkpoint_dir": str(folder)})
        with pytest.raises(trtllm.ProfileError, match="hf_quant_config.json: a ModelOpt export"):
            trtllm.checkpoint_check(s, ROOT)
    absent = trtllm.settings_with_defaults({"qformat": "checkpoint", "kv_cache_dtype": "auto",
                                            "checkpoint_dir": "build/no/such/folder"})
    assert trtllm.checkpoint_check(absent, ROOT) is None  # nothing to read yet: the build checks it again
    with pytest.raises(QC.CheckpointError):
        QC.legacy_quant(folder)


def test_qformat_checkpoint_keeps_the_kv_cache_in_the_model_dtype(deployment):
    dep = copy.deepcopy(deployment)
    dep["profiles"]["trtllm"].update(qformat="checkpoint", kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="qformat checkpoint needs auto"):
        rc.render_files(dep, ROOT)
