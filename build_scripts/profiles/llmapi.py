"""GPU profile ``llmapi``: the ``tensorrt_llm`` slot served by our Python adapter over TensorRT-LLM's LLM API.

Rendered by ``build_scripts/render_configs.py`` from ``deployment.yaml: profiles.llmapi`` into
``model_repository/tensorrt_llm/configs/llmapi.pbtxt``; ``tritonserver --model-config-name llmapi`` picks it
up and every other model keeps its ``config.pbtxt``. The backend is ``trtllm_llmapi``
(backends/trtllm_llmapi/model.py): ``tensorrt_llm.LLM`` with the PyTorch backend (inflight batching, paged KV
cache, FP8, KV reuse and chunked prefill inside TensorRT-LLM) behind the same Triton code as our engine
(``tritonllm.serving.llm_model``). Not run on the development machines (no GPU, no tensorrt_llm).

Invariants:
- The tensors, batching, decoupled mode (``llm.decoupled_mode``) and dynamic batching are those of the
  default ``tensorrt_llm`` config (our engine's tensor contract, ``request_key`` / ``is_final`` included), so
  the ensemble, the BLS, routing and every client run unchanged; only backend, instance group and
  parameters differ. One instance, ``KIND_CPU`` as NVIDIA's llmapi config writes it (TensorRT-LLM places
  the model on the GPUs itself; tp x pp > 1 spawns its MPI workers).
- ``llm_args`` (one JSON parameter) holds the ``LLM(...)`` keyword arguments other than the checkpoint;
  every key is in ``tritonllm.trtllm.names.TABLE`` (a test checks), deterministic (sorted keys).
- The checkpoint is ``gpt_model_path`` (written relative to the model's directory, resolved and confined
  by the adapter) or ``hf_model_id`` (a Hugging Face Hub name, downloaded by TensorRT-LLM).
- Quantization comes from the checkpoint: the PyTorch backend's ``LLM(...)`` has no ``quant_config`` argument
  (``TorchLlmArgs`` keeps it private, llm_args.py@0004396; a QuantConfig reaching the loader is ignored,
  llm_utils.py@0066b2a), so ``quantization`` accepts only ``checkpoint``. When ``model`` is a local folder,
  rendering reads its hf_quant_config.json / config.json ``quantization_config`` as TensorRT-LLM's loaders do
  (``_quant_checkpoint.llmapi_quant``) and refuses, naming the field, a format the PyTorch backend does not
  load (AutoAWQ ``awq``, AutoGPTQ ``gptq``, ModelOpt SmoothQuant, weight-only compressed-tensors, ...). A folder
  that is not there yet, or ``hf_model_id`` (never downloaded here), is not inspected; the rendered config
  never depends on the folder's contents. FP8 KV cache is ``kv_cache_config.dtype: fp8``.
- Settings are validated here; a bad one raises ``ProfileError`` (a ValueError) naming the key.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

REPO = Path(__file__).resolve().parents[2]
for _p in (REPO / "backends", Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from tritonllm import contract as C  # noqa: E402

import _quant_checkpoint as QC  # noqa: E402

BACKEND = "trtllm_llmapi"
MODEL_DIR = "model_repository/tensorrt_llm"  # render_configs.MODEL_DIRS[tensorrt_llm]
DEFAULTS = {
    "model": "build/models/demo",
    "hf_model_id": None,
    "quantization": "checkpoint",
    "kv_cache_dtype": "auto",
    "enable_kv_cache_reuse": True,
    "enable_chunked_prefill": True,
    "kv_cache_free_gpu_mem_fraction": 0.9,
    "max_tokens_in_paged_kv_cache": None,
    "tp_size": 1,
    "pp_size": 1,
    "max_batch_size": 64,
    "max_num_tokens": 8192,
    "max_seq_len": 4096,
    "max_queue_size": 256,
    "exclude_input_in_output": True,
    "stats_check_period_ms": 100,
    "cancellation_check_period_ms": 50,
    "cost_per_instance_hour_usd": 0.0,
}
KV_CACHE_DTYPES = ("auto", "fp8")  # KvCacheConfig.dtype values we render ('auto': the model dtype)
QUANTIZATION = ("checkpoint",)
POSITIVE_INTS = ("tp_size", "pp_size", "max_batch_size", "max_num_tokens", "max_seq_len",
                 "max_tokens_in_paged_kv_cache", "stats_check_period_ms", "cancellation_check_period_ms")
BOOLS = ("enable_kv_cache_reuse", "enable_chunked_prefill", "exclude_input_in_output")


class ProfileError(ValueError):
    """profiles.llmapi holds a value the LLM API would refuse, or one we cannot render."""


def settings_with_defaults(settings: dict) -> dict:
    s = {**DEFAULTS, **(settings or {})}
    where = "deployment.yaml: profiles.llmapi"
    unknown = sorted(set(s) - set(DEFAULTS))
    if unknown:
        raise ProfileError(f"{where}: unknown setting(s) {unknown} (known: {sorted(DEFAULTS)})")
    for key in POSITIVE_INTS:
        v = s[key]
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise ProfileError(f"{where}.{key} = {v!r}; must be a positive integer")
    q = s["max_queue_size"]
    if not isinstance(q, int) or isinstance(q, bool) or q < 0:
        raise ProfileError(f"{where}.max_queue_size = {q!r}; must be an integer >= 0")
    for key in BOOLS:
        if not isinstance(s[key], bool):
            raise ProfileError(f"{where}.{key} = {s[key]!r}; must be true or false")
    frac = s["kv_cache_free_gpu_mem_fraction"]
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        raise ProfileError(f"{where}.kv_cache_free_gpu_mem_fraction = {frac!r}; must be in (0, 1]")
    if s["kv_cache_dtype"] not in KV_CACHE_DTYPES:
        raise ProfileError(f"{where}.kv_cache_dtype = {s['kv_cache_dtype']!r}; allowed: {KV_CACHE_DTYPES}")
    if s["quantization"] not in QUANTIZATION:
        raise ProfileError(
            f"{where}.quantization = {s['quantization']!r}; allowed: {QUANTIZATION}. The LLM API's PyTorch backend "
            "takes no quant_config argument: serve a pre-quantized checkpoint (ModelOpt hf_quant_config.json, "
            "e.g. nvidia/Llama-3.1-8B-Instruct-FP8, or a quantization_config it reads; docs/quantization.md)")
    if not s["hf_model_id"] and not s["model"]:
        raise ProfileError(f"{where}: set model (a checkpoint folder) or hf_model_id (a Hugging Face Hub name)")
    if s["max_num_tokens"] > s["max_batch_size"] * s["max_seq_len"]:
        raise ProfileError(f"{where}.max_num_tokens exceeds max_batch_size x max_seq_len")
    cost = s["cost_per_instance_hour_usd"]
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
        raise ProfileError(f"{where}.cost_per_instance_hour_usd = {cost!r}; must be a number >= 0")
    return s


def model_folder(s: dict, repo: Path) -> Path | None:
    """The local checkpoint folder (None with hf_model_id: a Hub name is TensorRT-LLM's to download)."""
    if s["hf_model_id"]:
        return None
    model = Path(os.path.expanduser(str(s["model"])))
    return model if model.is_absolute() else repo / model


def checkpoint_quant(s: dict, repo: Path) -> QC.CheckpointQuant | None:
    """The QuantAlgo TensorRT-LLM would load from the local folder; None when there is none to read."""
    folder = model_folder(s, repo)
    if folder is None or not any((folder / f).is_file() for f in ("config.json", "hf_quant_config.json")):
        return None
    try:
        return QC.llmapi_quant(folder)
    except QC.CheckpointError as e:
        raise ProfileError(f"deployment.yaml: profiles.llmapi.model = {s['model']!r}: {e}") from None


def llm_args(s: dict) -> dict:
    """The ``tensorrt_llm.LLM(...)`` keyword arguments (all but the checkpoint)."""
    kv = {"dtype": s["kv_cache_dtype"], "enable_block_reuse": s["enable_kv_cache_reuse"],
          "free_gpu_memory_fraction": s["kv_cache_free_gpu_mem_fraction"]}
    if s["max_tokens_in_paged_kv_cache"]:
        kv["max_tokens"] = s["max_tokens_in_paged_kv_cache"]
    return {
        "backend": "pytorch",
        "tensor_parallel_size": s["tp_size"],
        "pipeline_parallel_size": s["pp_size"],
        "max_batch_size": s["max_batch_size"],
        "max_num_tokens": s["max_num_tokens"],
        "max_seq_len": s["max_seq_len"],
        "enable_chunked_prefill": s["enable_chunked_prefill"],
        "kv_cache_config": kv,
        "enable_iter_perf_stats": True,   # LLM.get_stats feeds NVIDIA's nv_trt_llm_* metrics
        "trust_remote_code": False,       # no checkpoint code runs (docs/security.md)
    }


def _param(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def tensorrt_llm_config(default: mc.ModelConfig, s: dict, repo: Path) -> mc.ModelConfig:
    cfg = default  # a copy of the default config: same tensors, batching, decoupled mode
    cfg.backend = BACKEND
    del cfg.instance_group[:]
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    # The two-step ensemble's text_output is decoded with the deployment's tokenizer, as preprocessing's
    # (also when the checkpoint is a Hub name): those two parameters stay.
    text = {k: cfg.parameters[k].string_value for k in ("tokenizer_dir", "skip_special_tokens") if k in cfg.parameters}
    cfg.parameters.clear()
    params = {"llm_args": json.dumps(llm_args(s), sort_keys=True, separators=(",", ":")), **text}
    if s["hf_model_id"]:
        params["hf_model_id"] = s["hf_model_id"]
    else:
        model = Path(os.path.expanduser(str(s["model"])))
        relative = os.path.relpath(repo / model, repo / MODEL_DIR)  # resolved back by tritonllm.paths
        params["gpt_model_path"] = str(model) if model.is_absolute() else relative
    for key in ("max_queue_size", "exclude_input_in_output", "stats_check_period_ms", "cancellation_check_period_ms",
                "cost_per_instance_hour_usd"):
        params[key] = s[key]
    for key, value in params.items():
        cfg.parameters[key].string_value = _param(value)
    return cfg


def render(deployment: dict, settings: dict, repo: Path, defaults: dict) -> dict[str, mc.ModelConfig]:
    """Model name -> config for the models this profile overrides (the renderer's profile hook)."""
    s = settings_with_defaults(settings)
    checkpoint_quant(s, repo)  # refuses a checkpoint the PyTorch backend would not load; renders nothing
    return {C.TENSORRT_LLM: tensorrt_llm_config(defaults[C.TENSORRT_LLM], s, repo)}
