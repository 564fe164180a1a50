"""build_trtllm_engine.py: exact quantize.py / trtllm-build command lines, version and GPU checks, --dry-run.

TensorRT-LLM is not installed here and there is no GPU: these tests pin the commands and the decisions
(what is refused, what is enabled) that a GPU host would execute.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

import build_trtllm_engine as b  # noqa: E402


def plan(**kw) -> b.BuildPlan:
    base = dict(checkpoint="/models/llama", quantized_dir="/tmp/ckpt", engine_dir="/repo/model_repository/tensorrt_llm/1")
    return b.BuildPlan(**{**base, **kw})


def test_commands_are_exactly_nvidias_fp8_flow():
    quantize, build = b.plan_commands(plan(tp_size=2, pp_size=2, max_batch_size=128, max_input_len=1024,
                                           max_seq_len=2048, max_num_tokens=4096, workers=2,
                                           calib_dataset="/data/calib", dtype="bfloat16"))
    assert quantize == [
        "python3", b.DEFAULT_QUANTIZE_SCRIPT, "--model_dir", "/models/llama", "--dtype", "bfloat16",
        "--qformat", "fp8", "--kv_cache_dtype", "fp8", "--calib_size", "512", "--calib_dataset", "/data/calib",
        "--tp_size", "2", "--pp_size", "2", "--output_dir", "/tmp/ckpt"]
    assert build == [
        "trtllm-build", "--checkpoint_dir", "/tmp/ckpt", "--output_dir", "/repo/model_repository/tensorrt_llm/1",
        "--gemm_plugin", "auto", "--use_paged_context_fmha", "enable", "--use_fp8_context_fmha", "enable",
        "--max_batch_size", "128", "--max_input_len", "1024", "--max_seq_len", "2048", "--max_num_tokens", "4096",
        "--max_beam_width", "1", "--workers", "2"]


def test_calib_dataset_omitted_when_unset_and_fmha_can_be_disabled():
    quantize, build = b.plan_commands(plan(fp8_context_fmha=False))
    assert "--calib_dataset" not in quantize
    i = build.index("--use_fp8_context_fmha")
    assert build[i + 1] == "disable"


@pytest.mark.parametrize("kw, msg", [
    (dict(tp_size=0), "tp_size"),
    (dict(max_input_len=5000, max_seq_len=4096), "exceeds max_seq_len"),
    (dict(workers=3, tp_size=2), "world size"),
])
def test_invalid_plans_are_refused(kw, msg):
    with pytest.raises(b.BuildError, match=msg):
        b.plan_commands(plan(**kw))


def test_compute_capability_parsing_and_fp8_gate():
    caps = b.parse_compute_caps("9.0\n9.0\n")
    assert caps == [(9, 0), (9, 0)]
    b.check_gpus(caps)                     # H100 / H200: fine
    b.check_gpus([(8, 9)])                 # L4 / L40S (Ada): FP8 GEMMs exist
    with pytest.raises(b.BuildError, match=r"SM 8\.0"):
        b.check_gpus([(8, 0)])             # A100: no FP8
    with pytest.raises(b.BuildError, match="no NVIDIA GPU"):
        b.check_gpus([])
    with pytest.raises(b.BuildError, match="mixed GPU architectures"):
        b.check_gpus([(9, 0), (8, 9)])
    with pytest.raises(b.BuildError, match="unexpected compute capability"):
        b.parse_compute_caps("[N/A]")


def test_fp8_context_fmha_auto_follows_the_architecture():
    assert b.resolve_fp8_context_fmha("auto", [(9, 0)]) == (True, None)
    assert b.resolve_fp8_context_fmha("auto", [(10, 0)]) == (True, None)
    enabled, note = b.resolve_fp8_context_fmha("auto", [(8, 9)])
    assert not enabled and "SM 8.9" in note
    enabled, note = b.resolve_fp8_context_fmha("auto", [])
    assert enabled and "no GPU" in note
    assert b.resolve_fp8_context_fmha("disable", [(9, 0)]) == (False, None)
    assert b.resolve_fp8_context_fmha("enable", [(8, 9)]) == (True, None)


def test_version_check():
    assert b.parse_version("0.17.0.post1") == (0, 17, 0)
    assert b.parse_version("1.0.0rc4") == (1, 0, 0)
    b.check_trtllm_version("0.11.0")
    b.check_trtllm_version("1.1.0")
    with pytest.raises(b.BuildError, match="too old"):
        b.check_trtllm_version("0.10.0")
    with pytest.raises(b.BuildError, match="not installed"):
        b.check_trtllm_version(None)
    with pytest.raises(b.BuildError, match="cannot parse"):
        b.check_trtllm_version("dev")


def test_dry_run_prints_the_commands_and_defaults_come_from_the_deployment(capsys):
    assert b.main(["--dry-run", "--fp8-context-fmha", "enable"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    quantize, build = (shlex.split(line) for line in lines)
    llm, settings = b.profile_settings(ROOT / "deployment.yaml")
    expected = b.plan_commands(b.BuildPlan(
        checkpoint=str(ROOT / settings["checkpoint_dir"]),
        quantized_dir=str(ROOT / "build/trtllm/checkpoint_fp8"), engine_dir=str(ROOT / settings["engine_dir"]),
        tp_size=settings["tp_size"], pp_size=settings["pp_size"], max_batch_size=settings["max_batch_size"],
        max_input_len=settings["max_input_len"], max_seq_len=settings["max_seq_len"],
        max_num_tokens=settings["max_num_tokens"], max_beam_width=settings["max_beam_width"],
        calib_size=settings["calib_size"]))
    assert [quantize, build] == expected


def test_dry_run_flags_override_and_a_real_build_stops_here(capsys):
    assert b.main(["--dry-run", "--checkpoint", "/abs/hf", "--tp-size", "2", "--output", "/engines/x",
                   "--fp8-context-fmha", "disable", "--python", "python3.12"]) == 0
    quantize, build = (shlex.split(line) for line in capsys.readouterr().out.strip().splitlines())
    assert quantize[:4] == ["python3.12", b.DEFAULT_QUANTIZE_SCRIPT, "--model_dir", "/abs/hf"]
    assert quantize[quantize.index("--tp_size") + 1] == "2"
    assert build[build.index("--output_dir") + 1] == "/engines/x"
    assert build[build.index("--use_fp8_context_fmha") + 1] == "disable"
    # Without --dry-run, this machine (no TensorRT-LLM, no GPU) is refused with a message, exit 2.
    assert b.main(["--checkpoint", "/abs/hf"]) == 2
    assert "build_trtllm_engine:" in capsys.readouterr().err


def test_engine_dir_check(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "rank0.engine").write_bytes(b"")
    b.check_engine_dir(tmp_path, 1)
    with pytest.raises(b.BuildError, match="rank1.engine"):
        b.check_engine_dir(tmp_path, 2)


@pytest.mark.parametrize("qformat, kv, fmha", [
    ("int4_awq", "auto", "disable"), ("w4a8_awq", "fp8", "enable"), ("int8_sq", "int8", "disable"),
])
def test_other_quantized_formats_use_nvidias_qformat_names(qformat, kv, fmha):
    quantize, build = b.plan_commands(plan(qformat=qformat, kv_cache_dtype=kv))
    assert quantize[quantize.index("--qformat") + 1] == qformat
    assert ("--kv_cache_dtype" in quantize) == (kv != "auto")
    if kv != "auto":
        assert quantize[quantize.index("--kv_cache_dtype") + 1] == kv
    # FP8 context attention reads an FP8 KV cache: off for every other cache dtype.
    assert build[build.index("--use_fp8_context_fmha") + 1] == fmha
    assert plan(qformat=qformat, kv_cache_dtype=kv).needs_fp8 == (qformat == "w4a8_awq" or kv == "fp8")


def test_integer_formats_build_on_ampere_but_fp8_does_not():
    b.check_gpus([(8, 0)], fp8=False)          # A100: INT4 AWQ / INT8 SQ fine
    with pytest.raises(b.BuildError, match=r"SM 8\.0"):
        b.check_gpus([(7, 5)], fp8=False)
    with pytest.raises(b.BuildError, match="int4_awq"):
        b.check_gpus([(8, 0)], fp8=True)        # the FP8 refusal names the alternative


def test_features_add_the_engine_flags_the_config_needs():
    cmds = b.plan_commands(plan(lora=True, max_lora_rank=16, gather_logits=True, guided_decoding=True))
    build = cmds[1]
    i = build.index("--lora_plugin")
    assert build[i:i + 7] == ["--lora_plugin", "auto", "--lora_target_modules", "attn_q", "attn_k", "attn_v",
                              "--max_lora_rank"] and build[i + 7] == "16"
    assert "--gather_context_logits" in build and "--gather_generation_logits" in build
    assert cmds[2] == ["python3", b.DEFAULT_XGRAMMAR_SCRIPT, "--model_dir", "/models/llama",
                       "--output_dir", "/repo/model_repository/tensorrt_llm/1"]
    build = b.plan_commands(plan(max_draft_len=4))[1]
    assert build[build.index("--speculative_decoding_mode"):][:4] == [
        "--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "4"]
    with pytest.raises(b.BuildError, match="gather_context_logits"):
        b.plan_commands(plan(max_draft_len=4, gather_logits=True))
    with pytest.raises(b.BuildError, match="qformat"):
        b.plan_commands(plan(qformat="nvfp4"))
    assert len(b.plan_commands(plan())) == 2 and "--lora_plugin" not in b.plan_commands(plan())[1]


def test_guided_engine_dir_must_hold_the_tokenizer_info(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "rank0.engine").write_bytes(b"")
    with pytest.raises(b.BuildError, match="xgrammar_tokenizer_info.json"):
        b.check_engine_dir(tmp_path, 1, guided_decoding=True)


def test_gpu_check_reports_both_profiles_for_an_architecture():
    """benchmarks/gpu_check.py step 4 runs without TensorRT-LLM and without a GPU (capability given)."""
    import gpu_check

    hopper, ampere = gpu_check.profiles_check((9, 0)), gpu_check.profiles_check((8, 0))
    assert hopper["trtllm_buildable_qformats"] == list(b.QFORMATS) and hopper["llmapi_fp8_kv_cache_ok"]
    assert ampere["trtllm_buildable_qformats"] == ["int4_awq", "int8_sq", "int8_wo", "int4_wo", "checkpoint"]
    assert not ampere["llmapi_fp8_kv_cache_ok"]
    assert hopper["profiles_rendered"] == ["ensembles/ensemble/configs/trtllm.pbtxt",
                                           "model_repository/llmapi/configs/trtllm.pbtxt",
                                           "model_repository/postprocessing/configs/trtllm.pbtxt",
                                           "model_repository/tensorrt_llm/configs/llmapi.pbtxt",
                                           "model_repository/tensorrt_llm/configs/trtllm.pbtxt",
                                           "model_repository/tensorrt_llm_bls/configs/trtllm.pbtxt"]
    assert hopper["tensorrt_llm"] is None  # not installable here


# ------------------------------------------------------------------ weight-only formats, pre-quantized checkpoints
AUTOGPTQ = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "quant_method": "gptq",
            "checkpoint_format": "gptq"}


def hf_folder(folder: Path, quantization_config=None) -> Path:
    folder.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("qformat", ["int8_wo", "int4_wo"])
def test_weight_only_formats_are_quantize_py_qformats_without_fp8(qformat):
    from tritonllm.trtllm import names as N

    assert qformat in b.QUANTIZE_QFORMATS and qformat in N.fields("qformat") and qformat not in b.FP8_QFORMATS
    quantize, build = b.plan_commands(plan(qformat=qformat, kv_cache_dtype="auto", calib_size=16))
    assert quantize == ["python3", b.DEFAULT_QUANTIZE_SCRIPT, "--model_dir", "/models/llama", "--dtype", "auto",
                        "--qformat", qformat, "--calib_size", "16", "--tp_size", "1", "--pp_size", "1",
                        "--output_dir", "/tmp/ckpt"]
    assert build[build.index("--use_fp8_context_fmha") + 1] == "disable"
    assert not plan(qformat=qformat, kv_cache_dtype="int8").needs_fp8
    b.check_gpus([(8, 0)], fp8=plan(qformat=qformat, kv_cache_dtype="int8").needs_fp8)  # A100: fine
    with pytest.raises(b.BuildError, match="weight-only"):
        b.check_gpus([(7, 5)], fp8=False)


def test_qformat_checkpoint_converts_with_nvidias_llama_script_then_builds():
    convert, build = b.plan_commands(plan(qformat="checkpoint", kv_cache_dtype="auto", tp_size=2, workers=2,
                                          dtype="float16", convert_script="/opt/trtllm/convert_checkpoint.py"))
    assert convert == ["python3", "/opt/trtllm/convert_checkpoint.py", "--model_dir", "/models/llama",
                       "--output_dir", "/tmp/ckpt", "--dtype", "float16", "--tp_size", "2", "--pp_size", "1"]
    assert build[:3] == ["trtllm-build", "--checkpoint_dir", "/tmp/ckpt"]
    assert build[build.index("--use_fp8_context_fmha") + 1] == "disable"
    assert b.DEFAULT_CONVERT_SCRIPT.endswith("examples/models/core/llama/convert_checkpoint.py")
    with pytest.raises(b.BuildError, match="model dtype"):
        b.plan_commands(plan(qformat="checkpoint", kv_cache_dtype="fp8"))


def test_the_checkpoint_folder_must_fit_the_qformat(tmp_path):
    gptq = hf_folder(tmp_path / "gptq", AUTOGPTQ)
    assert b.check_checkpoint(gptq, "checkpoint") == f"{gptq}: AutoGPTQ -> W4A16_GPTQ (group size 128)"
    with pytest.raises(b.BuildError, match=r"quantization_config\.quant_method: 'gptq': already quantized"):
        b.check_checkpoint(gptq, "fp8")
    with pytest.raises(b.BuildError, match=r"quantization_config\.desc_act"):
        b.check_checkpoint(hf_folder(tmp_path / "act-order", {**AUTOGPTQ, "desc_act": True}), "checkpoint")
    float_folder = hf_folder(tmp_path / "float")
    assert b.check_checkpoint(float_folder, "int4_wo") is None
    with pytest.raises(b.BuildError, match="quantization_config: missing"):
        b.check_checkpoint(float_folder, "checkpoint")


def test_dry_run_checks_a_local_checkpoint(tmp_path, capsys):
    gptq = hf_folder(tmp_path / "gptq", AUTOGPTQ)
    assert b.main(["--dry-run", "--checkpoint", str(gptq), "--qformat", "checkpoint", "--kv-cache-dtype", "auto",
                   "--convert-script", "/opt/convert_checkpoint.py"]) == 0
    out = capsys.readouterr()
    convert = shlex.split(out.out.splitlines()[0])
    assert convert[:4] == ["python3", "/opt/convert_checkpoint.py", "--model_dir", str(gptq)]
    assert "AutoGPTQ -> W4A16_GPTQ" in out.err
    assert b.main(["--dry-run", "--checkpoint", str(gptq), "--qformat", "fp8"]) == 2
    assert "already quantized" in capsys.readouterr().err
