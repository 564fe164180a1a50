"""GPU profile `llmapi`: the rendered tensorrt_llm config parses, passes the cross-checks, keeps our engine's
tensor contract (so the ensemble and every client are unchanged), selects the trtllm_llmapi adapter, and
renders only LLM(...) arguments that are in the names table."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "build_scripts"))
sys.path.insert(0, str(ROOT / "backends"))

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
    p = params_of(cfg)
    args = {"model_repository": str(ROOT / "model_repository" / "tensorrt_llm"), "model_config": "{}"}
    want = (ROOT / deployment["profiles"]["llmapi"]["model"]).resolve()
    assert model_path_param(args, p, "gpt_model_path", must_exist=False) == want
    if want.exists():  # the demo checkpoint is built by `make build`
        runner = build_llmapi_backend(args, p, print)
        assert runner.llm_args["model"] == str(want) and runner.max_queue_size == int(p["max_queue_size"])


def test_a_hub_model_id_is_rendered_instead_of_a_path(deployment):
    s = llmapi.settings_with_defaults({"hf_model_id": "nvidia/Llama-3.1-8B-Instruct-FP8", "kv_cache_dtype": "fp8"})
    default = rc.render_default(deployment, ROOT)[C.TENSORRT_LLM]
    p = params_of(llmapi.tensorrt_llm_config(default, s, ROOT))
    assert p["hf_model_id"] == "nvidia/Llama-3.1-8B-Instruct-FP8" and "gpt_model_path" not in p
    assert json.loads(p["llm_args"])["kv_cache_config"]["dtype"] == "fp8"


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
