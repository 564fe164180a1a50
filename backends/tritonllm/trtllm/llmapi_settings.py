"""Config parameters of the ``llmapi`` profile's ``tensorrt_llm`` -> an (unstarted) ``LLMAPIRunner``.

Parameters (rendered by build_scripts/profiles/llmapi.py from ``deployment.yaml: profiles.llmapi``):
- ``llm_args``: JSON object of ``tensorrt_llm.LLM(...)`` keyword arguments other than ``model`` (nested
  ``kv_cache_config``); every key must be in ``names.TABLE["LLM"]`` (and ``KvCacheConfig``), else the model
  does not load, naming the key;
- ``gpt_model_path``: the checkpoint folder (HF, or a ModelOpt pre-quantized FP8 checkpoint), relative to
  the model's directory and confined to the checkout like every path parameter (``paths.model_path_param``),
  or absolute; ``hf_model_id`` instead: a Hugging Face Hub name TensorRT-LLM downloads itself;
- ``max_queue_size`` (requests waiting beyond those running), ``exclude_input_in_output`` (the default when
  a request does not say), ``stats_check_period_ms`` (how often iteration stats are polled).
"""
from __future__ import annotations

import json

from ..paths import model_path_param
from . import names as N
from .llmapi_runner import LLMAPIRunner


def _bool(params: dict[str, str], name: str, default: bool) -> bool:
    v = (params.get(name) or "").strip().lower()
    if not v or v.startswith("${"):
        return default
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"parameter {name}={params[name]!r}: expected true or false")


def llm_args_from_parameters(params: dict[str, str]) -> dict:
    """The ``llm_args`` parameter, checked against the names table (model not included)."""
    try:
        args = json.loads(params.get("llm_args") or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"parameter llm_args is not JSON: {e}") from None
    if not isinstance(args, dict):
        raise ValueError("parameter llm_args must be a JSON object of LLM(...) arguments")
    if "model" in args:
        raise ValueError("parameter llm_args: give the checkpoint as gpt_model_path or hf_model_id, not as model")
    try:
        N.check("LLM", args)
        if isinstance(args.get("kv_cache_config"), dict):
            N.check("KvCacheConfig", args["kv_cache_config"])
    except N.UnknownName as e:
        raise ValueError(f"parameter llm_args: {e.args[0]}") from None
    return args


def build_llmapi_backend(args: dict, params: dict[str, str], on_output) -> LLMAPIRunner:
    """The runner of one model instance (``serving.generator.BackendBuilder``); LLM(...) is built by start()."""
    llm_args = llm_args_from_parameters(params)
    hub_id = (params.get("hf_model_id") or "").strip()
    model = hub_id if hub_id and not hub_id.startswith("${") else str(model_path_param(args, params, "gpt_model_path"))
    queue = int(params.get("max_queue_size") or 1024)
    if queue < 0:
        raise ValueError(f"parameter max_queue_size={queue}: must be >= 0")
    period = float(params.get("stats_check_period_ms") or 100) / 1000.0
    return LLMAPIRunner({**llm_args, "model": model}, on_output, max_queue_size=queue,
                        default_exclude_input=_bool(params, "exclude_input_in_output", True), stats_period=period)
