"""Read an HF checkpoint's config.json into the few facts the engine's model needs.

Parsing goes through transformers' own config classes (no remote code), so rope parameters in either the
old (`rope_theta` + `rope_scaling`) or the new (`rope_parameters`) layout are understood the same way HF
understands them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from .models import ARCHITECTURES, Architecture


class UnsupportedModelError(ValueError):
    """The checkpoint is not one of ``models.ARCHITECTURES`` or uses a feature the engine lacks."""


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_window: int | None
    torch_dtype: str
    eos_token_ids: tuple[int, ...]
    hf_config: Any  # the transformers PretrainedConfig, for rope initialisation
    activation: str = "silu"          # the gated MLP's: silu | gelu_tanh | gelu
    embed_scale: float | None = None  # embeddings are multiplied by it (Gemma: sqrt(hidden_size))
    norm_offset: float = 0.0          # RMSNorm weights are stored less this (Gemma: 1)
    rope_factors: tuple[float, ...] | None = None  # GGUF rope_freqs: each frequency divided by its factor

    @property
    def arch(self) -> Architecture:
        return ARCHITECTURES[self.architecture]


def load_spec(model_dir: str) -> ModelSpec:
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config.json in checkpoint directory {model_dir!r}")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    archs = raw.get("architectures") or []
    name = next((a for a in archs if a in ARCHITECTURES), None)
    if name is None:
        raise UnsupportedModelError(
            f"{path}: architectures {archs or raw.get('model_type')} not supported; "
            f"supported: {sorted(ARCHITECTURES)}")
    from transformers import AutoConfig  # local import: heavy, and only needed at load time

    cfg = AutoConfig.from_pretrained(model_dir, trust_remote_code=False, local_files_only=True)
    eos = raw.get("eos_token_id")
    gen_path = os.path.join(model_dir, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token_id", eos)
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    return spec_from_config(cfg, name, torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
                            eos_token_ids=eos_ids, where=path)


def spec_from_config(cfg: Any, name: str, *, torch_dtype: str, eos_token_ids: tuple[int, ...], where: str,
                     rope_factors: tuple[float, ...] | None = None) -> ModelSpec:
    """A transformers config of architecture ``name`` (an ``ARCHITECTURES`` key) -> ModelSpec, or
    UnsupportedModelError naming ``where`` (config.json, or a GGUF file)."""
    arch = ARCHITECTURES[name]
    rope = _rope_params(cfg)
    if rope.get("rope_type", "default") not in ("default", "linear", "llama3", "yarn", "longrope"):
        raise UnsupportedModelError(f"{where}: rope_type {rope.get('rope_type')!r} is not supported")
    refused = arch.check(cfg)
    if refused:
        raise UnsupportedModelError(f"{where}: {refused}")
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return ModelSpec(
        architecture=name,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate_size=cfg.intermediate_size,
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        attention_bias=arch.has_attention_bias(cfg),
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
        qk_norm=arch.qk_norm,
        sliding_window=arch.sliding_window(cfg),
        torch_dtype=torch_dtype,
        eos_token_ids=eos_token_ids,
        hf_config=cfg,
        activation=arch.activation(cfg),
        embed_scale=cfg.hidden_size ** 0.5 if arch.embed_scale else None,
        norm_offset=arch.norm_offset,
        rope_factors=rope_factors,
    )


def _rope_params(cfg: Any) -> dict:
    params = getattr(cfg, "rope_parameters", None)
    if params is None:
        params = getattr(cfg, "rope_scaling", None) or {}
    params = dict(params)
    if "rope_type" not in params and "type" in params:
        params["rope_type"] = params["type"]
    return params


def rope_inv_freq(spec: ModelSpec, device):
    """Inverse frequencies and attention scaling exactly as transformers computes them."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    import torch

    rope_type = _rope_params(spec.hf_config).get("rope_type", "default")
    if rope_type == "default":
        base = _rope_params(spec.hf_config).get("rope_theta", getattr(spec.hf_config, "rope_theta", 10000.0))
        dim = spec.head_dim
        inv, scale = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    else:
        inv, scale = ROPE_INIT_FUNCTIONS[rope_type](spec.hf_config, device)
    if spec.rope_factors is not None:  # llama.cpp's rope_freqs tensor (Llama 3.1's scaling, stored per frequency)
        inv = inv.to("cpu") / torch.tensor(spec.rope_factors, dtype=torch.float32)
    return inv.to(device), scale
