"""HF checkpoint -> quantized TensorRT-LLM engine for the GPU profile (``tensorrt_llm/configs/trtllm.pbtxt``).

Steps, all NVIDIA's own tools (flags read from their source, see ``QUANTIZE_SOURCE`` / ``BUILD_SOURCE``;
not run on the CPU machines of this project):

1. ``python examples/quantization/quantize.py --model_dir HF --qformat Q --kv_cache_dtype K ...``
   (TensorRT-LLM's ModelOpt post-training quantization; writes a TensorRT-LLM checkpoint, one
   ``rank<N>.safetensors`` per rank of ``--tp_size x --pp_size``). ``Q`` is ``profiles.trtllm.qformat``:
   ``fp8`` (default), ``int4_awq``, ``w4a8_awq``, ``int8_sq``, weight-only ``int8_wo`` / ``int4_wo``; ``K`` is
   ``fp8``, ``int8`` or ``auto`` (no flag: the model dtype). ``checkpoint`` instead runs the LLaMA example's
   ``convert_checkpoint.py --model_dir HF ...`` on a pre-quantized AutoAWQ / AutoGPTQ folder (W4A16_GPTQ; KV auto).
2. ``trtllm-build --checkpoint_dir CKPT --output_dir ENGINE --gemm_plugin auto
   --use_paged_context_fmha enable --use_fp8_context_fmha enable|disable --max_batch_size ... --max_num_tokens ...``
   (tp / pp come from the checkpoint: trtllm-build has no tp/pp flags of its own), plus what the profile's
   features ask for, so the engine serves every tensor the rendered config declares (``profiles/trtllm.py``
   ``FEATURES``): ``lora`` -> ``--lora_plugin auto --lora_target_modules ... --max_lora_rank R``;
   ``gather_logits`` -> ``--gather_context_logits --gather_generation_logits``; ``max_draft_len`` N > 0 ->
   ``--speculative_decoding_mode draft_tokens_external --max_draft_len N``.
3. ``guided_decoding`` only: ``python examples/generate_xgrammar_tokenizer_info.py --model_dir HF
   --output_dir ENGINE``, which writes the ``xgrammar_tokenizer_info.json`` the config names.

Usage:
    python build_scripts/build_trtllm_engine.py --checkpoint /models/Llama-3.1-8B-Instruct --dry-run
    python build_scripts/build_trtllm_engine.py --checkpoint /models/Llama-3.1-8B-Instruct --tp-size 2

Invariants:
- ``plan_commands`` is pure: the same ``BuildPlan`` gives the same argv lists (unit-tested exactly);
  ``--dry-run`` prints exactly those, shell-quoted, and runs nothing.
- Defaults come from ``deployment.yaml`` (``profiles.trtllm``; ``llm.gpt_model_path`` for the checkpoint),
  so the engine is built with the limits the rendered GPU config assumes; flags override.
- Before a real build: TensorRT-LLM >= ``MIN_TRTLLM_VERSION`` is installed, ``trtllm-build`` and the
  quantize script exist, and every visible GPU is SM >= 8.9 when the format computes in FP8 (``fp8``,
  ``w4a8_awq``, an FP8 KV cache: Ada, Hopper, Blackwell), SM >= 8.0 otherwise (Ampere, NVIDIA's oldest listed
  architecture: ``names.SUPPORT_MATRIX_MD``); the checkpoint folder fits the qformat
  (``_quant_checkpoint.legacy_check``). FP8 context FMHA needs an FP8 KV cache and is documented by NVIDIA for
  Hopper (SM 9.0+): ``--fp8-context-fmha auto`` disables it elsewhere. Every failure is one clear
  message and exit code 2; nothing is half-built silently.
- After a real build the engine folder holds ``config.json`` and one ``rank<N>.engine`` per rank.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(REPO / "backends"), str(REPO / "build_scripts" / "profiles")) if p not in sys.path]
import _quant_checkpoint as QC  # noqa: E402
# The host's checks (TensorRT-LLM version, GPUs, checkpoint) live beside; the names stay importable from here.
from trtllm_env import (FP8_FMHA_MIN_SM, FP8_MIN_SM, INT_MIN_SM, MIN_TRTLLM_VERSION, BuildError,  # noqa: E402,F401
                        check_checkpoint, check_gpus, check_trtllm_version, detect_compute_caps,
                        installed_trtllm_version, parse_compute_caps, parse_version, resolve_fp8_context_fmha, sm)
DEFAULT_ENGINE_DIR = "model_repository/tensorrt_llm/1"
DEFAULT_QUANTIZE_SCRIPT = "/app/tensorrt_llm/examples/quantization/quantize.py"
DEFAULT_XGRAMMAR_SCRIPT = "/app/tensorrt_llm/examples/generate_xgrammar_tokenizer_info.py"
DEFAULT_CONVERT_SCRIPT = "/app/tensorrt_llm/examples/models/core/llama/convert_checkpoint.py"  # LLAMA_CONVERT_PY
# Read from NVIDIA/TensorRT-LLM (not run): quantize.py --qformat choices (line 67) and --kv_cache_dtype
# (line 110) at c8c6df08bd0ead54cd47f7973e1e425c28a174cd; trtllm-build flags in tensorrt_llm/commands/build.py
# at 65f1d1533 (--gather_*_logits 245-254, --lora_* 263-284, --speculative_decoding_mode 291, --max_draft_len
# 299) and tensorrt_llm/plugin/plugin.py at c20322ff (--lora_plugin 153, --use_*_fmha 252-256).
QUANTIZE_SOURCE = "examples/quantization/quantize.py@c8c6df08bd0ead54cd47f7973e1e425c28a174cd"
BUILD_SOURCE = "tensorrt_llm/commands/build.py@65f1d1533, tensorrt_llm/plugin/plugin.py@c20322ff"
QUANTIZE_QFORMATS, QFORMATS, FP8_QFORMATS = QC.QUANTIZE_QFORMATS, QC.QFORMATS, QC.FP8_QFORMATS
KV_CACHE_DTYPES = ("fp8", "int8", "auto")


@dataclass(frozen=True)
class BuildPlan:
    checkpoint: str            # HF folder (config.json + *.safetensors)
    quantized_dir: str         # TensorRT-LLM checkpoint written by quantize.py
    engine_dir: str            # trtllm-build output: config.json + rank<N>.engine
    tp_size: int = 1
    pp_size: int = 1
    max_batch_size: int = 64
    max_input_len: int = 2048
    max_seq_len: int = 4096
    max_num_tokens: int = 8192
    max_beam_width: int = 1
    dtype: str = "auto"        # non-quantized parts (embedding, lm_head); quantize.py's --dtype
    calib_size: int = 512
    calib_dataset: str | None = None  # None: quantize.py's default (cnn_dailymail, from the HF hub)
    fp8_context_fmha: bool = True
    workers: int = 1
    python: str = "python3"
    quantize_script: str = DEFAULT_QUANTIZE_SCRIPT
    qformat: str = "fp8"
    kv_cache_dtype: str = "fp8"
    lora: bool = False
    max_lora_rank: int = 64
    lora_target_modules: tuple[str, ...] = ("attn_q", "attn_k", "attn_v")
    gather_logits: bool = False
    max_draft_len: int = 0
    guided_decoding: bool = False
    xgrammar_script: str = DEFAULT_XGRAMMAR_SCRIPT
    convert_script: str = DEFAULT_CONVERT_SCRIPT

    @property
    def needs_fp8(self) -> bool:
        return self.qformat in FP8_QFORMATS or self.kv_cache_dtype == "fp8"

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def validate(self) -> None:
        for name in ("tp_size", "pp_size", "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                     "max_beam_width", "calib_size", "workers"):
            if getattr(self, name) <= 0:
                raise BuildError(f"{name} must be > 0 (got {getattr(self, name)})")
        if self.max_input_len > self.max_seq_len:
            raise BuildError(f"max_input_len {self.max_input_len} exceeds max_seq_len {self.max_seq_len}")
        if self.workers > self.world_size:
            raise BuildError(f"workers {self.workers} exceeds the world size tp x pp = {self.world_size}")
        if self.qformat not in QFORMATS:
            raise BuildError(f"qformat {self.qformat!r}: choose one of {', '.join(QFORMATS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise BuildError(f"kv_cache_dtype {self.kv_cache_dtype!r}: choose one of {', '.join(KV_CACHE_DTYPES)}")
        if self.qformat == "checkpoint" and self.kv_cache_dtype != "auto":
            raise BuildError(f"kv_cache_dtype {self.kv_cache_dtype!r}: qformat checkpoint converts with the KV "
                             "cache in the model dtype (auto)")
        if self.max_draft_len < 0 or (self.max_draft_len and self.gather_logits):
            raise BuildError("max_draft_len must be >= 0, and trtllm-build refuses it with --gather_context_logits")
        if self.lora and (self.max_lora_rank <= 0 or not self.lora_target_modules):
            raise BuildError("lora needs max_lora_rank > 0 and lora_target_modules")


def plan_commands(plan: BuildPlan) -> list[list[str]]:
    """The argv of each step, in order (pure)."""
    plan.validate()
    if plan.qformat == "checkpoint":  # convert_checkpoint.py reads the quantization from the HF config itself
        return [[plan.python, plan.convert_script, "--model_dir", plan.checkpoint, "--output_dir", plan.quantized_dir,
                 "--dtype", plan.dtype, "--tp_size", str(plan.tp_size), "--pp_size", str(plan.pp_size)],
                *_build_and_after(plan)]
    quantize = [plan.python, plan.quantize_script,
                "--model_dir", plan.checkpoint,
                "--dtype", plan.dtype,
                "--qformat", plan.qformat]
    if plan.kv_cache_dtype != "auto":
        quantize += ["--kv_cache_dtype", plan.kv_cache_dtype]
    quantize += ["--calib_size", str(plan.calib_size)]
    if plan.calib_dataset:
        quantize += ["--calib_dataset", plan.calib_dataset]
    quantize += ["--tp_size", str(plan.tp_size),
                 "--pp_size", str(plan.pp_size),
                 "--output_dir", plan.quantized_dir]
    return [quantize] + _build_and_after(plan)


def _build_and_after(plan: BuildPlan) -> list[list[str]]:
    # Paged context FMHA is what enable_kv_cache_reuse and enable_chunked_context need at serving time.
    build = ["trtllm-build",
             "--checkpoint_dir", plan.quantized_dir,
             "--output_dir", plan.engine_dir,
             "--gemm_plugin", "auto",
             "--use_paged_context_fmha", "enable",
             "--use_fp8_context_fmha", "enable" if plan.fp8_context_fmha and plan.kv_cache_dtype == "fp8" else "disable",
             "--max_batch_size", str(plan.max_batch_size),
             "--max_input_len", str(plan.max_input_len),
             "--max_seq_len", str(plan.max_seq_len),
             "--max_num_tokens", str(plan.max_num_tokens),
             "--max_beam_width", str(plan.max_beam_width),
             "--workers", str(plan.workers)]
    if plan.lora:
        build += ["--lora_plugin", "auto", "--lora_target_modules", *plan.lora_target_modules,
                  "--max_lora_rank", str(plan.max_lora_rank)]
    if plan.gather_logits:
        build += ["--gather_context_logits", "--gather_generation_logits"]
    if plan.max_draft_len:
        build += ["--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", str(plan.max_draft_len)]
    commands = [build]
    if plan.guided_decoding:
        commands.append([plan.python, plan.xgrammar_script, "--model_dir", plan.checkpoint,
                         "--output_dir", plan.engine_dir])
    return commands


# --------------------------------------------------------------------------- CLI

def profile_settings(deployment_path: Path) -> tuple[dict, dict]:
    """(deployment's llm section, profiles.trtllm settings); empty dicts when absent."""
    if not deployment_path.exists():
        return {}, {}
    with open(deployment_path) as f:
        dep = yaml.safe_load(f) or {}
    return dep.get("llm") or {}, (dep.get("profiles") or {}).get("trtllm") or {}


def repo_path(value: str) -> str:
    """Deployment paths are repo-relative; commands get them absolute so any working directory works."""
    p = Path(os.path.expanduser(str(value)))
    return str(p if p.is_absolute() else REPO / p)


def build_parser(llm: dict, s: dict) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default=s.get("checkpoint_dir") or llm.get("gpt_model_path"),
                   help="HF checkpoint folder (default: profiles.trtllm.checkpoint_dir, else llm.gpt_model_path)")
    p.add_argument("--output", default=s.get("engine_dir", DEFAULT_ENGINE_DIR), help="engine folder")
    p.add_argument("--work-dir", default=None,
                   help="where quantize.py writes the TensorRT-LLM checkpoint (default build/trtllm/checkpoint_<qformat>)")
    for flag, key, default in (("--tp-size", "tp_size", 1), ("--pp-size", "pp_size", 1),
                               ("--max-batch-size", "max_batch_size", 64), ("--max-input-len", "max_input_len", 2048),
                               ("--max-seq-len", "max_seq_len", 4096), ("--max-num-tokens", "max_num_tokens", 8192),
                               ("--max-beam-width", "max_beam_width", 1), ("--calib-size", "calib_size", 512)):
        p.add_argument(flag, type=int, default=int(s.get(key, default)))
    p.add_argument("--workers", type=int, default=None, help="parallel build workers (default 1; one GPU each)")
    p.add_argument("--dtype", default=s.get("dtype", "auto"), choices=["auto", "float16", "bfloat16", "float32"])
    p.add_argument("--calib-dataset", default=s.get("calib_dataset"),
                   help="HF dataset name or local folder for calibration (quantize.py default: cnn_dailymail)")
    p.add_argument("--fp8-context-fmha", default="auto", choices=["auto", "enable", "disable"])
    p.add_argument("--qformat", default=s.get("qformat", "fp8"), choices=QFORMATS,
                   help="quantize.py --qformat, or checkpoint: convert a pre-quantized AWQ / GPTQ folder "
                        "(default: profiles.trtllm.qformat)")
    p.add_argument("--convert-script", default=os.environ.get("TRTLLM_CONVERT_SCRIPT", DEFAULT_CONVERT_SCRIPT),
                   help="TensorRT-LLM's examples/models/core/llama/convert_checkpoint.py (qformat checkpoint only)")
    p.add_argument("--kv-cache-dtype", default=s.get("kv_cache_dtype", "fp8"), choices=KV_CACHE_DTYPES)
    p.add_argument("--xgrammar-script", default=os.environ.get("TRTLLM_XGRAMMAR_SCRIPT", DEFAULT_XGRAMMAR_SCRIPT),
                   help="TensorRT-LLM's examples/generate_xgrammar_tokenizer_info.py (guided_decoding only)")
    p.add_argument("--quantize-script", default=os.environ.get("TRTLLM_QUANTIZE_SCRIPT", DEFAULT_QUANTIZE_SCRIPT),
                   help="TensorRT-LLM's examples/quantization/quantize.py (env TRTLLM_QUANTIZE_SCRIPT)")
    p.add_argument("--python", default="python3", help="interpreter that has tensorrt_llm")
    p.add_argument("--dry-run", action="store_true", help="print the commands; check and run nothing")
    p.add_argument("--deployment", type=Path, default=REPO / "deployment.yaml")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--deployment", type=Path, default=REPO / "deployment.yaml")
    llm, settings = profile_settings(pre.parse_known_args(argv)[0].deployment)
    args = build_parser(llm, settings).parse_args(argv)
    try:
        if not args.checkpoint:
            raise BuildError("--checkpoint is required (no llm.gpt_model_path in the deployment)")
        caps = detect_compute_caps()
        fp8 = args.qformat in FP8_QFORMATS or args.kv_cache_dtype == "fp8"
        for check in (lambda: check_trtllm_version(installed_trtllm_version()), lambda: check_gpus(caps, fp8)):
            try:
                check()
            except BuildError as e:
                if not args.dry_run:
                    raise
                print(f"# dry run; a real build would stop here: {e}", file=sys.stderr)
        fmha, note = resolve_fp8_context_fmha(args.fp8_context_fmha, caps)
        plan = BuildPlan(
            checkpoint=repo_path(args.checkpoint),
            quantized_dir=repo_path(args.work_dir or f"build/trtllm/checkpoint_{args.qformat}"),
            engine_dir=repo_path(args.output), tp_size=args.tp_size, pp_size=args.pp_size,
            max_batch_size=args.max_batch_size, max_input_len=args.max_input_len, max_seq_len=args.max_seq_len,
            max_num_tokens=args.max_num_tokens, max_beam_width=args.max_beam_width, dtype=args.dtype,
            calib_size=args.calib_size, calib_dataset=args.calib_dataset, fp8_context_fmha=fmha,
            workers=args.workers or 1, python=args.python, quantize_script=args.quantize_script,
            qformat=args.qformat, kv_cache_dtype=args.kv_cache_dtype, lora=bool(settings.get("lora", False)),
            max_lora_rank=int(settings.get("max_lora_rank", 64)),
            lora_target_modules=tuple(settings.get("lora_target_modules") or ("attn_q", "attn_k", "attn_v")),
            gather_logits=bool(settings.get("gather_logits", False)),
            max_draft_len=int(settings.get("max_draft_len", 0) or 0),
            guided_decoding=bool(settings.get("guided_decoding", False)), xgrammar_script=args.xgrammar_script,
            convert_script=args.convert_script)
        commands = plan_commands(plan)
        for line in (note, Path(plan.checkpoint).is_dir() and check_checkpoint(Path(plan.checkpoint), plan.qformat)):
            if line:
                print(f"# note: {line}", file=sys.stderr)
        if args.dry_run:
            for cmd in commands:
                print(shlex.join(cmd))
            return 0
        run_build(plan, commands)
    except BuildError as e:
        print(f"build_trtllm_engine: {e}", file=sys.stderr)
        return 2
    print(f"build_trtllm_engine: engine written to {plan.engine_dir} (world size {plan.world_size})")
    return 0


def run_build(plan: BuildPlan, commands: list[list[str]]) -> None:
    if plan.guided_decoding and not Path(plan.xgrammar_script).is_file():
        raise BuildError(f"tokenizer-info script not found: {plan.xgrammar_script} (TensorRT-LLM's "
                         "examples/generate_xgrammar_tokenizer_info.py; pass --xgrammar-script)")
    name, script = (("convert", plan.convert_script) if plan.qformat == "checkpoint"
                    else ("quantize", plan.quantize_script))
    if not Path(script).is_file():
        raise BuildError(f"{name} script not found: {script}. Clone TensorRT-LLM at the tag matching the "
                         f"installed version and pass --{name}-script (or TRTLLM_{name.upper()}_SCRIPT).")
    if shutil.which("trtllm-build") is None:
        raise BuildError("trtllm-build is not on PATH (it comes with the tensorrt_llm package)")
    if not (Path(plan.checkpoint) / "config.json").is_file():
        raise BuildError(f"{plan.checkpoint} is not a HF checkpoint folder (no config.json)")
    Path(plan.engine_dir).mkdir(parents=True, exist_ok=True)
    for cmd in commands:
        print(f"$ {shlex.join(cmd)}", flush=True)
        if subprocess.run(cmd).returncode != 0:
            raise BuildError(f"step failed: {cmd[0] if cmd[0] != plan.python else cmd[1]}")
    check_engine_dir(Path(plan.engine_dir), plan.world_size, plan.guided_decoding)


def check_engine_dir(engine_dir: Path, world_size: int, guided_decoding: bool = False) -> None:
    names = ["config.json"] + [f"rank{r}.engine" for r in range(world_size)]
    names += ["xgrammar_tokenizer_info.json"] if guided_decoding else []
    missing = [n for n in names if not (engine_dir / n).is_file()]
    if missing:
        raise BuildError(f"engine folder {engine_dir} is incomplete: missing {', '.join(missing)}")


if __name__ == "__main__":
    sys.exit(main())
