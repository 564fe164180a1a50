"""Load a checkpoint into a Transformer: an HF directory (config.json + safetensors, sharded or not, float or
AWQ / GPTQ / compressed-tensors) or a llama.cpp GGUF file (gguf_checkpoint: its blocks kept as they are)."""
from __future__ import annotations

import glob
import json
import os

import torch

from ..model_files import is_gguf
from .gguf_checkpoint import read_gguf, read_gguf_spec
from .hf_config import ModelSpec, load_spec
from .model import Transformer
from .quant import Int8Weight
from .quant_formats import load_prequantized

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"engine_device {name!r} requested but CUDA is not available")
    return dev


def cpu_has_fast_bf16() -> bool:
    """True when the CPU has bf16 dot-product instructions (AVX512-BF16 or AMX); without them torch
    emulates bf16 matmuls, measured 30x slower than fp32 on an AVX2-only EPYC."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, spec: ModelSpec, device: torch.device) -> torch.dtype:
    if name != "auto":
        if name not in _DTYPES:
            raise ValueError(f"engine_dtype {name!r} not in {sorted(_DTYPES)}")
        return _DTYPES[name]
    ckpt = _DTYPES.get(spec.torch_dtype.replace("torch.", ""), torch.float32)
    if device.type == "cpu" and ckpt != torch.float32:
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    return ckpt


def read_spec(path: str) -> ModelSpec:
    """The checkpoint's ModelSpec without its weights: an HF directory's config.json or a GGUF file's header."""
    return read_gguf_spec(path) if is_gguf(path) else load_spec(path)


def load_weights(model_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(model_dir, n) for n in names]
    if not files:
        raise FileNotFoundError(f"no *.safetensors in checkpoint directory {model_dir!r} (pickled .bin "
                                "checkpoints are refused: convert them to safetensors)")
    weights: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            weights.update(load_file(path))
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise ValueError(f"cannot read safetensors file {path}: {e}") from e
    return weights


def checkpoint_quantization(model_dir: str) -> dict | None:
    """config.json's quantization_config (AWQ / GPTQ checkpoints), or None for a float checkpoint."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f).get("quantization_config")


def activation_mode(knob: str, gguf_quantized: bool) -> str:
    """The activation_quantization a model runs: ``auto`` is int8 for a GGUF file's quantized tensors (llama.cpp
    computes them so; make eval measures the cost: docs/quantization.md) and none elsewhere (checkpoints' AWQ /
    GPTQ / FP8 codes and weights quantized at load keep the float model of their weights)."""
    if knob == "auto":
        return "int8" if gguf_quantized else "none"
    return knob


def load_model(model_dir: str, device: str = "auto", dtype: str = "auto",
               fp8_weights: bool = False, fp8_matmul: str = "auto", cpu_kernels: str = "auto",
               quantization: str = "none", quant_group_size: int = 32,
               activation_quantization: str = "auto") -> Transformer:
    kept = []
    if is_gguf(model_dir):
        spec, weights = read_gguf(model_dir)
        kept = sorted({type(w).__name__ for w in weights.values() if not isinstance(w, torch.Tensor)})
        if kept and (quantization != "none" or fp8_weights):
            raise ValueError(f"{model_dir} holds quantized GGUF tensors ({', '.join(kept)}), served as the file stores "
                             f"them: quantization must be none (it is {quantization!r}"
                             f"{', with fp8 weights' if fp8_weights else ''})")
        qcfg = None
    else:
        spec = load_spec(model_dir)
        weights = load_weights(model_dir)
        qcfg = checkpoint_quantization(model_dir)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, spec, dev)
    if qcfg is not None:
        weights = load_prequantized(weights, qcfg, spec.arch.projections())
        kind = "int8" if any(isinstance(w, Int8Weight) for w in weights.values()) else "int4"
        if quantization not in ("none", kind):
            raise ValueError(f"{model_dir} is a {qcfg.get('quant_method')} {kind} checkpoint: quantization must be "
                             f"none or {kind} (it is {quantization!r})")
        quantization = kind  # the checkpoint's codes are kept; the LM head goes to int8 as for int8 / int4
    missing = [k for k in ("model.embed_tokens.weight", "model.norm.weight") if k not in weights]
    if missing:
        raise ValueError(f"{model_dir}: the checkpoint lacks {missing}")
    try:
        model = Transformer(spec, weights, dev, dt, fp8_weights=fp8_weights, fp8_matmul=fp8_matmul,
                            cpu_kernels=cpu_kernels, quantization=quantization, quant_group_size=quant_group_size,
                            activation_quantization=activation_mode(activation_quantization, bool(kept)))
    except KeyError as e:
        raise ValueError(f"{model_dir}: missing weight {e.args[0]}") from e
    scales = [float(weights[k]) for k in weights if k.endswith(("self_attn.k_scale", "self_attn.v_scale"))]
    if scales:  # FP8 checkpoints carry KV scales; one scale for all layers keeps the cache layout simple
        model.kv_scale = max(scales)
    del weights
    _return_freed_memory()
    return model


def _return_freed_memory() -> None:
    """Give the loader's freed temporaries (decoded blocks, interleaving copies) back to the OS: glibc keeps freed
    heap pages mapped, which counted ~45 MB of a 98 MB GGUF model's resident size. No-op off glibc."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
