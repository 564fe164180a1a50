"""GPU profile ``trtllm``: NVIDIA's ``tensorrtllm`` backend over a TensorRT-LLM engine (not run here: no GPU).

Rendered by ``build_scripts/render_configs.py`` from ``deployment.yaml: profiles.trtllm`` into
``model_repository/tensorrt_llm/configs/trtllm.pbtxt`` and ``ensembles/ensemble/configs/trtllm.pbtxt``;
``tritonserver --model-config-name trtllm`` picks those two up and every other model keeps its
``config.pbtxt`` (preprocessing, postprocessing and the BLS are the same Python models on CPU and GPU).

Invariants:
- The ``tensorrt_llm`` config follows NVIDIA's ``triton_backend/all_models/inflight_batcher_llm/
  tensorrt_llm/config.pbtxt``: ``backend: "tensorrtllm"``, decoupled, ``dynamic_batching`` with
  ``preferred_batch_size [max_batch_size]`` and the queue bound, one instance of ``KIND_CPU`` (as NVIDIA
  writes it: the backend's executor places the engine on the GPUs itself, by MPI rank), and the
  parameters ``gpt_model_type`` / ``gpt_model_path`` / ``batch_scheduler_policy`` /
  ``kv_cache_free_gpu_mem_fraction`` / ``enable_kv_cache_reuse`` / ``enable_chunked_context`` /
  ``exclude_input_in_output`` / ``max_beam_width``.
- Its tensors are ``contract.TENSORRT_LLM_INPUTS`` and ``contract.TENSORRT_LLM_OUTPUTS`` minus
  ``NON_NVIDIA_OUTPUTS`` (our engine's ``request_key`` / ``is_final``, which NVIDIA's backend never emits);
  the ensemble variant is the default wiring with every mapping of those outputs pruned, and with any
  downstream *optional* input fed only by them dropped too. Filtering is by name, so it holds whether or
  not the contract declares them.
- ``gpt_model_path`` is written absolute: NVIDIA's configs always give the engine folder as an absolute
  path and the C++ backend is not documented to resolve it against the model directory (our Python
  adapters do). A repo-relative ``engine_dir`` is joined to ``container_repo_root``, where this
  repository is mounted on the GPU host (``docker run -v $PWD:/workspace/tritonllm``).
- Settings are validated here; a bad one raises ``ProfileError`` (a ValueError) naming the key.
"""
from __future__ import annotations

import posixpath
import sys
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "backends") not in sys.path:
    sys.path.insert(0, str(REPO / "backends"))

from tritonllm import contract as C  # noqa: E402

NON_NVIDIA_OUTPUTS = frozenset(t.name for t in C.TENSORRT_LLM_OUTPUTS if not t.nvidia)
NON_NVIDIA_INPUTS = frozenset(t.name for t in C.TENSORRT_LLM_INPUTS if not t.nvidia)
BACKEND = "tensorrtllm"
DEFAULTS = {
    "engine_dir": "model_repository/tensorrt_llm/1",
    "container_repo_root": "/workspace/tritonllm",
    "tp_size": 1,
    "pp_size": 1,
    "instance_count": 1,
    "max_queue_size": 0,                      # 0: Triton's default (unbounded) queue
    "max_beam_width": 1,
    "batch_scheduler_policy": "max_utilization",
    "kv_cache_free_gpu_mem_fraction": 0.9,
    "enable_kv_cache_reuse": True,
    "enable_chunked_context": True,
    "exclude_input_in_output": True,
}
POSITIVE_INTS = ("tp_size", "pp_size", "instance_count", "max_beam_width", "max_batch_size", "max_input_len",
                 "max_seq_len", "max_num_tokens", "calib_size", "max_tokens_in_paged_kv_cache")
BOOLS = ("enable_kv_cache_reuse", "enable_chunked_context", "exclude_input_in_output")
POLICIES = ("max_utilization", "guaranteed_no_evict")


class ProfileError(ValueError):
    """profiles.trtllm holds a value NVIDIA's backend or trtllm-build would refuse."""


def settings_with_defaults(settings: dict) -> dict:
    s = {**DEFAULTS, **(settings or {})}
    where = "deployment.yaml: profiles.trtllm"
    for key in POSITIVE_INTS:
        if key in s and s[key] is not None:
            v = s[key]
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ProfileError(f"{where}.{key} = {v!r}; must be a positive integer")
    if not isinstance(s["max_queue_size"], int) or s["max_queue_size"] < 0:
        raise ProfileError(f"{where}.max_queue_size = {s['max_queue_size']!r}; must be an integer >= 0")
    for key in BOOLS:
        if not isinstance(s[key], bool):
            raise ProfileError(f"{where}.{key} = {s[key]!r}; must be true or false")
    if s["batch_scheduler_policy"] not in POLICIES:
        raise ProfileError(f"{where}.batch_scheduler_policy = {s['batch_scheduler_policy']!r}; allowed: {POLICIES}")
    frac = s["kv_cache_free_gpu_mem_fraction"]
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        raise ProfileError(f"{where}.kv_cache_free_gpu_mem_fraction = {frac!r}; must be in (0, 1]")
    if not posixpath.isabs(str(s["container_repo_root"])):
        raise ProfileError(f"{where}.container_repo_root must be absolute (got {s['container_repo_root']!r})")
    if s.get("max_input_len") and s.get("max_seq_len") and s["max_input_len"] > s["max_seq_len"]:
        raise ProfileError(f"{where}: max_input_len exceeds max_seq_len")
    return s


def engine_path(s: dict) -> str:
    """The engine folder as the server will see it (absolute; see the module docstring)."""
    engine = str(s["engine_dir"])
    if posixpath.isabs(engine):
        return posixpath.normpath(engine)
    return posixpath.normpath(posixpath.join(str(s["container_repo_root"]), engine))


def _tensor(t: C.Tensor, cls):
    # Same mapping as render_configs.tensor_msg (a test compares the two configs' tensors).
    msg = cls(name=t.name, data_type=mc.DataType.Value(t.dtype), dims=list(t.dims))
    if isinstance(msg, mc.ModelInput):
        msg.optional = t.optional
        msg.allow_ragged_batch = t.ragged
    if t.reshape is not None:
        msg.reshape.shape.extend(t.reshape)
        msg.reshape.SetInParent()
    return msg


def _param(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def tensorrt_llm_config(deployment: dict, s: dict) -> mc.ModelConfig:
    llm = deployment["llm"]
    mbs = int(llm["max_batch_size"])
    cfg = mc.ModelConfig(name=C.TENSORRT_LLM, backend=BACKEND, max_batch_size=mbs)
    # NVIDIA's decoupled_mode: streaming (the ensemble's `stream`) needs it; unary clients need it off.
    cfg.model_transaction_policy.decoupled = bool(llm.get("decoupled_mode", True))
    cfg.dynamic_batching.preferred_batch_size.append(mbs)
    cfg.dynamic_batching.max_queue_delay_microseconds = int(llm.get("max_queue_delay_microseconds", 0))
    if s["max_queue_size"]:
        cfg.dynamic_batching.default_queue_policy.max_queue_size = int(s["max_queue_size"])
    cfg.input.extend(_tensor(t, mc.ModelInput) for t in C.TENSORRT_LLM_INPUTS if t.name not in NON_NVIDIA_INPUTS)
    cfg.output.extend(_tensor(t, mc.ModelOutput) for t in C.TENSORRT_LLM_OUTPUTS
                      if t.name not in NON_NVIDIA_OUTPUTS)
    cfg.instance_group.add(count=int(s["instance_count"]), kind=mc.ModelInstanceGroup.KIND_CPU)
    params = {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_path(s),
        "max_beam_width": s["max_beam_width"],
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "batch_scheduler_policy": s["batch_scheduler_policy"],
        "kv_cache_free_gpu_mem_fraction": s["kv_cache_free_gpu_mem_fraction"],
        "enable_kv_cache_reuse": s["enable_kv_cache_reuse"],
        "enable_chunked_context": s["enable_chunked_context"],
        "exclude_input_in_output": s["exclude_input_in_output"],
    }
    if s.get("max_tokens_in_paged_kv_cache"):  # optional cap on top of the memory fraction
        params["max_tokens_in_paged_kv_cache"] = s["max_tokens_in_paged_kv_cache"]
    for key, value in params.items():
        cfg.parameters[key].string_value = _param(value)
    return cfg


def _nvidia_steps():
    # The contract may offer NVIDIA's wiring directly; pruning below makes the result the same either way.
    if hasattr(C, "ensemble_steps"):
        return C.ensemble_steps(engine_stream_keys=False)
    return C.ENSEMBLE_STEPS


def ensemble_config(deployment: dict) -> mc.ModelConfig:
    """The default ensemble with every use of NON_NVIDIA_OUTPUTS pruned (see the module docstring)."""
    inputs, outputs = C.MODEL_TENSORS[C.ENSEMBLE]
    required = {name: {t.name for t in C.MODEL_TENSORS[name][0] if not t.optional} for name in C.MODEL_TENSORS}
    dropped: set[str] = set()  # internal tensors that no longer exist
    steps = []
    for model_name, input_map, output_map in _nvidia_steps():
        out = {k: v for k, v in output_map.items()
               if not (model_name == C.TENSORRT_LLM and k in NON_NVIDIA_OUTPUTS)}
        if model_name == C.TENSORRT_LLM:
            input_map = {k: v for k, v in input_map.items() if k not in NON_NVIDIA_INPUTS}
        dropped |= set(output_map.values()) - set(out.values())
        inp = {}
        for k, v in input_map.items():
            if v in dropped:
                if k in required.get(model_name, ()):
                    raise ProfileError(f"ensemble: required input {model_name}.{k} is fed only by {v}, "
                                       "which NVIDIA's tensorrtllm backend does not produce")
                continue
            inp[k] = v
        steps.append((model_name, inp, out))
    cfg = mc.ModelConfig(name=C.ENSEMBLE, platform="ensemble", max_batch_size=int(deployment["llm"]["max_batch_size"]))
    cfg.input.extend(_tensor(t, mc.ModelInput) for t in inputs)
    cfg.output.extend(_tensor(t, mc.ModelOutput) for t in outputs if t.name not in dropped)
    for model_name, inp, out in steps:
        step = cfg.ensemble_scheduling.step.add(model_name=model_name, model_version=-1)
        step.input_map.update(inp)
        step.output_map.update(out)
    return cfg


def postprocessing_config(default: mc.ModelConfig) -> mc.ModelConfig:
    """The default postprocessing, keying stream state by request id: NVIDIA's backend sends no REQUEST_KEY."""
    default.parameters["key_by_request_id"].string_value = "true"
    return default


def render(deployment: dict, settings: dict, repo: Path, defaults: dict) -> dict[str, mc.ModelConfig]:
    """Model name -> config for the models this profile overrides (the renderer's profile hook)."""
    s = settings_with_defaults(settings)
    return {C.TENSORRT_LLM: tensorrt_llm_config(deployment, s), C.ENSEMBLE: ensemble_config(deployment),
            C.POSTPROCESSING: postprocessing_config(defaults[C.POSTPROCESSING])}
