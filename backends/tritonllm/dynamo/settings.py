"""The Dynamo worker's engine settings, from the same ``deployment.yaml`` knobs ``make serve`` renders
into ``tensorrt_llm``'s config (``models.tensorrt_llm.parameters``, ``llm.gpt_model_path``): one source.
Paths there are repository-relative, as everywhere in the deployment."""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from ..engine.config import engine_config_from_parameters

REPO = Path(__file__).resolve().parents[3]


def _text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _repo_path(value: str) -> Path:
    """A deployment.yaml path: relative to the repository root, or absolute."""
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else REPO / path


def engine_settings(deployment: str | None, model_path: str | None, num_threads: int = 0):
    """(checkpoint folder, served model name, EngineConfig). LoRA adapters are not loaded: Dynamo serves
    an adapter as its own model name, which a custom engine registers itself (not done yet)."""
    path = Path(deployment) if deployment else REPO / "deployment.yaml"
    with open(path) as f:
        dep = yaml.safe_load(f) or {}
    params = {k: _text(v) for k, v in ((dep.get("models") or {}).get("tensorrt_llm", {}).get("parameters") or {}).items()
              if k != "lora_adapters" and v is not None}
    if num_threads:
        params["num_threads"] = str(num_threads)
    config, _ = engine_config_from_parameters(params, lambda _name, value: str(_repo_path(value)))
    model = _repo_path(model_path or dep["llm"]["gpt_model_path"])
    return str(model.resolve()), model.stem if model.is_file() else model.name, config  # a GGUF: its file's stem
