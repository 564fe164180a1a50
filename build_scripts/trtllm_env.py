"""The GPU host's checks before a TensorRT-LLM engine build (build_trtllm_engine.py): TensorRT-LLM's
version, the GPUs' compute capabilities, the checkpoint's quantization. Each failure is a ``BuildError``
whose message says what to do. Nothing here runs TensorRT-LLM (it is not installable on these machines)."""
from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
from pathlib import Path

import _quant_checkpoint as QC

# 0.11 made `auto` the gemm_plugin default (older trtllm-build accepts only dtypes there) and already has
# --max_seq_len / --max_num_tokens / --use_fp8_context_fmha.
MIN_TRTLLM_VERSION = (0, 11, 0)
FP8_MIN_SM = (8, 9)
FP8_FMHA_MIN_SM = (9, 0)
INT_MIN_SM = (8, 0)


class BuildError(RuntimeError):
    """A precondition of the build is not met; the message says what to do."""


def parse_version(text: str) -> tuple[int, int, int]:
    """'0.17.0.post1' / '1.0.0rc4' -> (0, 17, 0); raises BuildError on anything else."""
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        raise BuildError(f"cannot parse TensorRT-LLM version {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def installed_trtllm_version() -> str | None:
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_trtllm_version(version: str | None) -> None:
    if version is None:
        raise BuildError("TensorRT-LLM is not installed. Build inside NVIDIA's container "
                         "(nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3, see docs/gpu_deployment.md) "
                         "or `pip install tensorrt_llm` on a CUDA host.")
    if parse_version(version) < MIN_TRTLLM_VERSION:
        need = ".".join(map(str, MIN_TRTLLM_VERSION))
        raise BuildError(f"TensorRT-LLM {version} is too old: need >= {need} (trtllm-build --gemm_plugin auto).")


def parse_compute_caps(text: str) -> list[tuple[int, int]]:
    """``nvidia-smi --query-gpu=compute_cap --format=csv,noheader`` output -> [(major, minor), ...]."""
    caps = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        m = re.fullmatch(r"(\d+)\.(\d+)", line)
        if not m:
            raise BuildError(f"unexpected compute capability from nvidia-smi: {line!r}")
        caps.append((int(m.group(1)), int(m.group(2))))
    return caps


def detect_compute_caps() -> list[tuple[int, int]]:
    """Compute capability of each visible GPU: nvidia-smi first, then torch.cuda; [] when neither sees one."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return parse_compute_caps(out.stdout)
        except (OSError, subprocess.TimeoutExpired):
            pass  # old drivers lack compute_cap: fall through to torch
    try:
        import torch  # optional: only consulted when nvidia-smi could not answer
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())]


def sm(cap: tuple[int, int]) -> str:
    return f"SM {cap[0]}.{cap[1]}"


def check_gpus(caps: list[tuple[int, int]], fp8: bool = True) -> None:
    """FP8 needs SM 8.9+ on every GPU the engine may run on (an engine is tied to one architecture);
    the integer formats SM 8.0+."""
    if not caps:
        raise BuildError("no NVIDIA GPU visible (nvidia-smi / torch.cuda): quantization and trtllm-build "
                         "need one. Use --dry-run to print the commands on a machine without a GPU.")
    need = FP8_MIN_SM if fp8 else INT_MIN_SM
    too_old = sorted({c for c in caps if c < need})
    if too_old and fp8:
        raise BuildError(f"FP8 needs compute capability >= {sm(FP8_MIN_SM)} (Ada, Hopper, Blackwell); found "
                         f"{', '.join(map(sm, too_old))} (e.g. A100 is SM 8.0). Use qformat int4_awq, "
                         "int8_sq, int8_wo or int4_wo with kv_cache_dtype int8 or auto there.")
    if too_old:
        raise BuildError(f"TensorRT-LLM's integer kernels (INT4 AWQ / GPTQ, INT8 SmoothQuant, INT8 / INT4 "
                         f"weight-only) need compute capability >= {sm(INT_MIN_SM)}; found "
                         f"{', '.join(map(sm, too_old))}.")
    if len(set(caps)) > 1:
        raise BuildError(f"mixed GPU architectures ({', '.join(map(sm, sorted(set(caps))))}): a TensorRT engine "
                         "runs only on the architecture it was built on; set CUDA_VISIBLE_DEVICES to one kind.")


def check_checkpoint(checkpoint: Path, qformat: str) -> str | None:
    """Refuse a folder that does not fit the qformat (``_quant_checkpoint.legacy_check``); a note on it."""
    try:
        q = QC.legacy_check(checkpoint, qformat)
    except QC.CheckpointError as e:
        raise BuildError(f"{checkpoint}: {e}") from None
    return q and f"{checkpoint}: {q.note} -> {q.quant_algo} (group size {q.group_size})"


def resolve_fp8_context_fmha(choice: str, caps: list[tuple[int, int]]) -> tuple[bool, str | None]:
    """(enable?, note). ``auto`` enables on SM 9.0+ and when the target is unknown (dry run, no GPU)."""
    if choice == "enable":
        return True, None
    if choice == "disable":
        return False, None
    if not caps:
        return True, f"no GPU seen: assuming a Hopper-class target ({sm(FP8_FMHA_MIN_SM)}+) for FP8 context FMHA"
    if min(caps) >= FP8_FMHA_MIN_SM:
        return True, None
    return False, (f"{sm(min(caps))}: FP8 context FMHA is documented for {sm(FP8_FMHA_MIN_SM)}+ only; "
                   "building with --use_fp8_context_fmha disable")
