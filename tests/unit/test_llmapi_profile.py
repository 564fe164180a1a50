"""GPU profile `llmapi`: the rendered tensorrt_llm config parses, passes the cross-checks, keeps our engine's
tensor contract (so the ensemble and every client are unchanged), selects the trtllm_llmapi adapter, and
renders only LLM(...) arguments that are in the names table."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[2]

import render_configs as rc  # noqa: E402
from config_checks import check_pipeline  # noqa: E402
from profiles import llmapi  # noqa: E402
from tritonllm import contract as C  # noqa: E402
from tritonllm.paths import model_path_param  # noqa: E402
from tritonllm.trtllm import names as N  # noqa: E402
from tritonllm.trtllm.llmapi_settings import build_llmapi_backend, llm_args_from_parameters  # noqa: E402

FILE = "model_repository/tensorrt_llm/configs/llmapi.pbtxt"


@pytest.fixture(scope="module")
def deployment() -> dict:
    return rc.load_deployment(ROOT / "deployment.yaml")


@pytest.fixture(scope="module")
def files(deployment) -> dict[str, str]:
    return rc.render_files(deployment, ROOT)  # raises if the llmapi set fails check_pipeline


@pytest.fixture(scope="module")
def cfg(files) -> mc.ModelConfig:
    return text_format.Parse(files[FILE], mc.ModelConfig())


def params_of(cfg: mc.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in cfg.parameters.items()}


def test_the_profile_renders_only_tensorrt_llm_and_the_file_is_committed(files):
    mine = [p for p in files if p.endswith("configs/llmapi.pbtxt")]
    assert mine == [FILE]  # the ensemble keeps its default wiring: request_key / is_final are still emitted
    assert (ROOT / FILE).read_text() == files[FILE], f"{FILE} is stale: run build_scripts/render_configs.py"


def test_the_llmapi_set_passes_the_cross_checks(deployment, cfg):
    configs = rc.render_default(deployment, ROOT)
    configs[C.TENSORRT_LLM] = cfg
    assert check_pipeline(configs) == []


def test_it_holds_our_tensorrt_llm_tensor_contract(deployment, cfg):
    default = rc.render_default(deployment, ROOT)[C.TENSORRT_LLM]
    assert list(cfg.input) == list(default.input) and list(cfg.output) == list(default.output)
    assert [t.name for t in cfg.input] == [t.name for t in C.TENSORRT_LLM_INPUTS]
    assert [t.name for t in cfg.output] == [t.name for t in C.TENSORRT_LLM_OUTPUTS]
    assert {"request_key", "is_final", "stop", "streaming"} <= {t.name for t in (*cfg.input, *cfg.output)}
    assert cfg.max_batch_size == default.max_batch_size == deployment["llm"]["max_batch_size"]
    assert cfg.model_transaction_policy.decoupled == deployment["llm"].get("decoupled_mode", True)
    assert cfg.dynamic_batching == default.dynamic_batching


def test_it_selects_the_llmapi_adapter_on_one_cpu_instance(cfg):
    assert cfg.backend == llmapi.BACKEND == "trtllm_llmapi" and not cfg.platform
    assert (ROOT / "backends" / cfg.backend / "model.py").is_file()
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(1, mc.ModelInstanceGroup.KIND_CPU)]


def test_rendered_llm_args_are_in_the_names_table_and_follow_the_settings(deployment, cfg):
    s = deployment["profiles"]["llmapi"]
    p = params_of(cfg)
    args = json.loads(p["llm_args"])
    assert set(args) <= N.fields("LLM") and set(args["kv_cache_config"]) <= N.fields("KvCacheConfig")
    assert llm_args_from_parameters(p) == args  # what the adapter accepts
    assert args["backend"] == "pytorch" and args["trust_remote_code"] is False and args["enable_iter_perf_stats"]
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (s["tp_size"], s["pp_size"])
    for key in ("max_batch_size", "max_num_tokens", "max_seq_len", "enable_chunked_prefill"):
        assert args[key] == s[key], key
    assert args["kv_cache_config"] == {"dtype": s["kv_cache_dtype"], "enable_block_reuse": s["enable_kv_cache_reuse"],
                                       "free_gpu_memory_fraction": s["kv_cache_free_gpu_mem_fraction"]}
    assert "quant_config" not in args  # not an LLM(...) argument of the PyTorch backend (names.py)
    assert p["max_queue_size"] == str(s["max_queue_size"]) and p["exclude_input_in_output"] == "true"
    assert not any("${" in v for v in p.values())


def test_the_checkpoint_path_resolves_like_every_path_parameter(deployment, cfg):
    settings = deployment["profiles"]["llmapi"]
    if settings.get("hf_model_id"):  # the default: the default model's HF weights by Hub name
        assert params_of(cfg)["hf_model_id"] == settings["hf_model_id"] and "gpt_model_path" not in params_of(cfg)
        default = rc.render_default(deployment, ROOT)[C.TENSORRT_LLM]
        cfg = llmapi.render(deployment, {"model": "build/models/some-hf-folder"}, ROOT,
                            {C.TENSORRT_LLM: copy.deepcopy(default)})[C.TENSORRT_LLM]
        settings = {"model": "build/models/some-hf-folder"}
    p = params_of(cfg)
    args = {"model_repository": str(ROOT / "model_repository" / "tensorrt_llm"), "model_config": "{}"}
    want = (ROOT / settings["model"]).resolve()
    assert model_path_param(args, p, "gpt_model_path", must_exist=False) == want
    if want.exists():  # the demo checkpoint is built by `make build`
        runner = build_llmapi_backend(args, p, print)
        assert runner.llm_args["model"] == str(want) and runner.max_queue_size == int(p["max_queue_size"])


def test_a_hub_model_id_is_rendered_instead_of_a_path(deployment):
    s = llmapi.settings_with_defaults({"hf_model_id": "nvidia/Llama-3.1-8B-Instruct-FP8", "kv_cache_dtype": "fp8"})
    default = rc.render_default(deployment, ROOT)[C.TENSORRT_LLM]
    text = {k: default.parameters[k].string_value for k in ("tokenizer_dir", "skip_special_tokens")}
    assert text["tokenizer_dir"].endswith(deployment["llm"]["tokenizer_dir"])
    p = params_of(llmapi.tensorrt_llm_config(default, s, ROOT))
    assert p["hf_model_id"] == "nvidia/Llama-3.1-8B-Instruct-FP8" and "gpt_model_path" not in p
    assert json.loads(p["llm_args"])["kv_cache_config"]["dtype"] == "fp8"
    # the two-step ensemble's text is decoded with the deployment's tokenizer, whatever the checkpoint
    assert {k: p[k] for k in text} == text


def test_the_kv_cap_is_rendered_as_kv_cache_config_max_tokens():
    args = llmapi.llm_args(llmapi.settings_with_defaults({"max_tokens_in_paged_kv_cache": 65536}))
    assert args["kv_cache_config"]["max_tokens"] == 65536 and set(args["kv_cache_config"]) <= N.fields("KvCacheConfig")


@pytest.mark.parametrize("key, value, msg", [
    ("quantization", "FP8", "quant_config"),
    ("kv_cache_dtype", "int8", "kv_cache_dtype"),
    ("tp_size", 0, "tp_size"),
    ("max_queue_size", -1, "max_queue_size"),
    ("enable_kv_cache_reuse", "yes", "enable_kv_cache_reuse"),
    ("kv_cache_free_gpu_mem_fraction", 1.5, "kv_cache_free_gpu_mem_fraction"),
    ("max_batch_sise", 8, "unknown setting"),
])
def test_bad_settings_name_the_key(deployment, key, value, msg):
    bad = copy.deepcopy(deployment)
    bad["profiles"]["llmapi"][key] = value
    with pytest.raises(llmapi.ProfileError, match=msg):
        llmapi.settings_with_defaults(bad["profiles"]["llmapi"])
    with pytest.raises(ValueError, match=msg):  # the renderer loads the profile as a module of its own
        rc.render_files(bad, ROOT)


# ------------------------------------------------------------------ quantized checkpoints (_quant_checkpoint)
# Folders as the producers write them: config.json's quantization_config (transformers' AwqConfig / GPTQConfig
# for AutoAWQ / AutoGPTQ, llm-compressor's compressed-tensors), ModelOpt's hf_quant_config.json (+ quant_cfg.json).
# The expected QuantAlgo is what TensorRT-LLM's loaders make of them, read from NVIDIA's source (names.py
# LLM_UTILS_PY, MODEL_CONFIG_PY, QUANT_CONFIG_UTILS_PY, MODELOPT_CONFIG_PY, LINEAR_PY); not run here.
import _quant_checkpoint as QC  # noqa: E402  (build_scripts/profiles is on sys.path once llmapi is imported)

MODELOPT = {"name": "modelopt", "version": "0.19.0"}
AUTOAWQ = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq", "version": "gemm",
           "zero_point": True}
AUTOGPTQ = {"bits": 4, "checkpoint_format": "gptq", "damp_percent": 0.01, "desc_act": False, "group_size": 128,
            "modules_in_block_to_quantize": None, "quant_method": "gptq", "static_groups": False, "sym": True,
            "true_sequential": True, "use_exllama": True}


def ct(weights: dict, acts: dict | None, fmt: str, **top) -> dict:
    """A single-group compressed-tensors quantization_config as llm-compressor saves it."""
    group = {"targets": ["Linear"], "weights": {"dynamic": False, "symmetric": True, "observer": "minmax", **weights},
             "input_activations": acts, "output_activations": None}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "quantization_status": "compressed", **top}


W4A16_CT = ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "actorder": None}, None,
              "pack-quantized")
FP8_DYNAMIC_CT = ct({"num_bits": 8, "type": "float", "strategy": "channel"},
                    {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}, "float-quantized")
FP8_BLOCK_CT = ct({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]},
                  {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": True},
                  "float-quantized")
NVFP4_CT = ct({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
              {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": "local"},
              "nvfp4-pack-quantized")
MXFP4_CT = ct({"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}, None, "mxfp4-pack-quantized")
W8A8_INT8_CT = ct({"num_bits": 8, "type": "int", "strategy": "channel"},
                  {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}, "int-quantized")
FP8_STATIC_CT = ct({"num_bits": 8, "type": "float", "strategy": "tensor"},
                   {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}, "float-quantized")


def write_checkpoint(folder: Path, quantization_config=None, **files) -> Path:
    """config.json (a Llama, with ``quantization_config`` when given) plus any ``name=json`` file."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    for name, content in files.items():
        (folder / name.replace("__", ".")).write_text(content if isinstance(content, str) else json.dumps(content))
    return folder


@pytest.mark.parametrize("qc, files, want", [
    (None, {}, (None, None, None)),
    ({"bits": 4}, {}, (None, None, None)),  # quantization_config without quant_method: not pre-quantized
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "FP8",
                                                                             "kv_cache_quant_algo": "FP8"}}},
     ("FP8", None, "FP8")),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {
        "quant_algo": "W4A16_AWQ", "group_size": 128, "has_zero_point": False, "pre_quant_scale": True,
        "exclude_modules": ["lm_head"], "kv_cache_quant_algo": None}}}, ("W4A16_AWQ", 128, None)),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "W4A8_AWQ",
                                                                             "group_size": 128}}},
     ("W4A8_AWQ", 128, None)),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "fp8_pb_wo",
                                                                             "kv_cache_quant_algo": "none"}}},
     ("FP8_BLOCK_SCALES", None, None)),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "W8A16"}}},
     ("W8A16", None, None)),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "producer": MODELOPT,
      "kv_cache_scheme": {"type": "float", "num_bits": 8}, "ignore": ["lm_head"]}, {}, ("NVFP4", 16, "FP8")),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "MIXED_PRECISION",
                                                                             "kv_cache_quant_algo": "FP8"}},
            "quant_cfg__json": {"quantized_layers": {"model.layers.0.mlp.down_proj": {"quant_algo": "FP8"},
                                                     "model.layers.1.mlp.down_proj": {"quant_algo": "W4A16_AWQ",
                                                                                      "group_size": 128}}}},
     ("MIXED_PRECISION", None, "FP8")),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}, {},
     ("FP8_BLOCK_SCALES", 128, None)),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}, {}, ("W4A16_MXFP4", 32, None)),
    ({"quant_method": "mxfp8", "weight_block_size": [1, 32]}, {}, ("MXFP8", 32, None)),
    ({"quant_method": "nvfp4", "group_size": 16}, {}, ("NVFP4", 16, None)),
    (FP8_DYNAMIC_CT, {}, ("FP8_PER_CHANNEL_PER_TOKEN", None, None)),
    (FP8_BLOCK_CT, {}, ("FP8_BLOCK_SCALES", 128, None)),
    (NVFP4_CT, {}, ("NVFP4", 16, None)),
    (MXFP4_CT, {}, ("W4A16_MXFP4", 32, None)),
    ({**FP8_DYNAMIC_CT, "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}, {},
     ("FP8_PER_CHANNEL_PER_TOKEN", None, "FP8")),
    ({**FP8_DYNAMIC_CT, "config_groups": {**FP8_DYNAMIC_CT["config_groups"],
                                          "group_1": NVFP4_CT["config_groups"]["group_0"]}}, {},
     ("MIXED_PRECISION", None, None)),
], ids=["float", "no-quant_method", "modelopt-fp8", "modelopt-w4a16-awq", "modelopt-w4a8-awq", "modelopt-fp8_pb_wo",
        "modelopt-w8a16", "modelopt-flat-nvfp4", "modelopt-mixed", "hf-fp8-block", "hf-mxfp4", "hf-mxfp8", "hf-nvfp4",
        "ct-fp8-dynamic", "ct-fp8-block", "ct-nvfp4", "ct-mxfp4", "ct-fp8-kv", "ct-two-groups"])
def test_checkpoints_the_pytorch_backend_loads_map_to_their_quant_algo(tmp_path, qc, files, want):
    got = QC.llmapi_quant(write_checkpoint(tmp_path / "ckpt", qc, **files))
    assert (got.quant_algo, got.group_size, got.kv_cache_quant_algo) == want
    assert got.quant_algo is None or got.quant_algo in N.fields("QuantAlgo")


@pytest.mark.parametrize("qc, files, field, msg", [
    (AUTOAWQ, {}, "config.json: quantization_config.quant_method", "'awq'"),
    (AUTOGPTQ, {}, "config.json: quantization_config.quant_method", "'gptq'"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, {}, "config.json: quantization_config.quant_method",
     "NotImplementedError"),
    (W4A16_CT, {}, "config.json: quantization_config.config_groups.group_0.input_activations", "weight-only int"),
    (W8A8_INT8_CT, {}, "config.json: quantization_config.config_groups.group_0.weights.type", "INT8 W8A8"),
    (FP8_STATIC_CT, {}, "config.json: quantization_config.config_groups.group_0.weights.strategy", "'tensor'"),
    ({**FP8_DYNAMIC_CT, "kv_cache_scheme": {"num_bits": 8, "type": "int"}}, {},
     "config.json: quantization_config.kv_cache_scheme", "FP8"),
    ({**FP8_DYNAMIC_CT, "config_groups": {}}, {}, "config.json: quantization_config.config_groups", "empty"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, {}, "config.json: quantization_config.weight_block_size",
     "unquantized"),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, {}, "config.json: quantization_config.weight_block_size",
     r"\[128, 128\]"),
    ({"quant_method": "nvfp4", "group_size": 32}, {}, "config.json: quantization_config.group_size", "16"),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "W8A8_SQ_PER_CHANNEL"}}},
     "hf_quant_config.json: quantization.quant_algo", "SmoothQuant"),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "W4A16_GPTQ"}}},
     "hf_quant_config.json: quantization.quant_algo", "GPTQ"),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "INT3"}}},
     "hf_quant_config.json: quantization.quant_algo", "not a QuantAlgo"),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"kv_cache_quant_algo": "FP8"}}},
     "hf_quant_config.json: quantization.quant_algo", "missing"),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "FP8",
                                                                             "kv_cache_quant_algo": "INT4"}}},
     "hf_quant_config.json: quantization.kv_cache_quant_algo", "INT4"),
    (None, {"hf_quant_config__json": {"quant_method": "awq", "bits": 4}}, "hf_quant_config.json", "not a ModelOpt"),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "MIXED_PRECISION"}}},
     "hf_quant_config.json: quantization.quantized_layers", "per-layer"),
    (None, {"hf_quant_config__json": {"producer": MODELOPT, "quantization": {"quant_algo": "MIXED_PRECISION"}},
            "quant_cfg__json": {"quantized_layers": {
                "model.layers.0.mlp.down_proj": {"quant_algo": "FP8"},
                "model.layers.1.mlp.down_proj": {"quant_algo": "W8A8_SQ_PER_CHANNEL"}}}},
     "hf_quant_config.json: quantization.quantized_layers.model.layers.1.mlp.down_proj.quant_algo", "SmoothQuant"),
    (None, {"hf_quant_config__json": "{not json"}, "hf_quant_config.json", "JSON"),
], ids=["autoawq", "autogptq", "bitsandbytes", "ct-w4a16", "ct-int8-w8a8", "ct-fp8-per-tensor", "ct-int8-kv",
        "ct-no-groups", "hf-fp8-per-tensor-dynamic", "hf-fp8-block-64", "hf-nvfp4-group-32", "modelopt-smoothquant",
        "modelopt-gptq", "modelopt-unknown", "modelopt-no-algo", "modelopt-int4-kv", "not-modelopt",
        "mixed-no-layers", "mixed-bad-layer", "bad-json"])
def test_checkpoints_the_pytorch_backend_refuses_are_refused_naming_the_field(tmp_path, qc, files, field, msg):
    with pytest.raises(QC.CheckpointError, match=msg) as e:
        QC.llmapi_quant(write_checkpoint(tmp_path / "ckpt", qc, **files))
    assert e.value.field == field and str(e.value).startswith(field + ": ")


def test_every_quant_algo_and_method_the_checker_names_is_in_the_names_table():
    assert set(QC.TORCH_LOADED) | set(QC.TORCH_REFUSED) <= N.fields("QuantAlgo")
    assert not set(QC.TORCH_LOADED) & set(QC.TORCH_REFUSED)
    assert set(QC.KV_CACHE_ALGOS) <= N.fields("QuantAlgo")
    for kind in ("QuantAlgo", "quant_method", "qformat"):
        assert "@" in N.source(kind) and "NVIDIA/TensorRT-LLM" in N.source(kind)


def test_rendering_refuses_a_local_checkpoint_the_pytorch_backend_would_not_load(deployment, tmp_path):
    gptq = write_checkpoint(tmp_path / "llama-gptq", AUTOGPTQ)
    defaults = {C.TENSORRT_LLM: rc.render_default(deployment, ROOT)[C.TENSORRT_LLM]}
    with pytest.raises(llmapi.ProfileError, match=r"profiles\.llmapi\.model = .*quantization_config\.quant_method"):
        llmapi.render(deployment, {"model": str(gptq)}, ROOT, copy.deepcopy(defaults))
    bad = copy.deepcopy(deployment)
    bad["profiles"]["llmapi"].pop("hf_model_id", None)
    bad["profiles"]["llmapi"]["model"] = str(gptq)
    with pytest.raises(ValueError, match="'gptq'"):  # through the renderer, which loads the profile itself
        rc.render_files(bad, ROOT)


def test_a_loadable_checkpoint_renders_exactly_as_an_absent_one(deployment, tmp_path):
    """The rendered config never depends on the folder's contents: only the check does."""
    awq = write_checkpoint(tmp_path / "llama-awq", None, hf_quant_config__json={
        "producer": MODELOPT, "quantization": {"quant_algo": "W4A16_AWQ", "group_size": 128}})
    s = llmapi.settings_with_defaults({"model": str(awq)})
    assert llmapi.checkpoint_quant(s, ROOT) == QC.CheckpointQuant("W4A16_AWQ", "hf_quant_config.json (ModelOpt)", 128)
    default = rc.render_default(deployment, ROOT)[C.TENSORRT_LLM]
    rendered = llmapi.render(deployment, {"model": str(awq)}, ROOT, {C.TENSORRT_LLM: copy.deepcopy(default)})
    absent = llmapi.render(deployment, {"model": str(tmp_path / "not-there")}, ROOT,
                           {C.TENSORRT_LLM: copy.deepcopy(default)})
    assert params_of(rendered[C.TENSORRT_LLM])["llm_args"] == params_of(absent[C.TENSORRT_LLM])["llm_args"]
    assert llmapi.checkpoint_quant(llmapi.settings_with_defaults({"model": str(tmp_path / "not-there")}), ROOT) is None


def test_a_hub_model_id_is_not_inspected(tmp_path):
    s = llmapi.settings_with_defaults({"hf_model_id": "TheBloke/Llama-2-7B-GPTQ", "model": None})
    assert llmapi.model_folder(s, ROOT) is None and llmapi.checkpoint_quant(s, ROOT) is None
    rel = llmapi.settings_with_defaults({"model": "build/models/demo"})
    assert llmapi.model_folder(rel, tmp_path) == tmp_path / "build/models/demo"
