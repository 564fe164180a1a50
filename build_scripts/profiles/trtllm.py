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
- Every key NVIDIA's backend reads without a fallback (``_tensorrtllm_params.REQUIRED``, from their
  source) is rendered; every rendered key is one the backend reads (a test checks both).
- Features the engine is built with (``FEATURES``: LoRA, logits, draft tokens, guided decoding; read by
  ``build_trtllm_engine.py`` from the same settings) decide which optional tensors the GPU config
  declares: a feature left off has its inputs and outputs removed from ``tensorrt_llm`` and from the
  ensemble (with every ensemble input no step consumes any more), so a request using it is refused by
  Triton naming the input instead of failing inside the engine.
- ``qformat`` is a quantize.py ``--qformat`` (ModelOpt PTQ of a float checkpoint; ``int8_wo`` / ``int4_wo`` are
  its weight-only W8A16 / W4A16) or ``checkpoint``: a pre-quantized LLaMA-family AutoAWQ / AutoGPTQ folder
  converted by NVIDIA's convert_checkpoint.py (W4A16_GPTQ; KV cache in the model dtype). When
  ``checkpoint_dir`` is a local folder, rendering checks it fits the qformat (``_quant_checkpoint``).
- Settings are validated here; a bad one raises ``ProfileError`` (a ValueError) naming the key.
"""
from __future__ import annotations

import posixpath
import sys
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

REPO = Path(__file__).resolve().parents[2]
for _p in (REPO / "backends", Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from tritonllm import contract as C  # noqa: E402

import _quant_checkpoint as QC  # noqa: E402
from _tensorrtllm_params import BY_KEY, TEMPLATE_ONLY  # noqa: E402,F401  (BY_KEY: tests and docs)

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
    "qformat": "fp8",
    "kv_cache_dtype": "fp8",
    "lora": False,
    "max_lora_rank": 64,
    "lora_target_modules": ["attn_q", "attn_k", "attn_v"],
    "lora_prefetch_dir": None,
    "gather_logits": False,
    "max_draft_len": 0,
    "guided_decoding": False,
}
# Feature setting -> (inputs, outputs) of tensorrt_llm that exist only when the engine is built with it.
FEATURES = {
    "lora": (("lora_task_id", "lora_weights", "lora_config"), ()),
    "gather_logits": (("return_context_logits", "return_generation_logits"), ("context_logits", "generation_logits")),
    "max_draft_len": (("draft_input_ids",), ()),
    "guided_decoding": (("guided_decoding_guide_type", "guided_decoding_guide"), ()),
}
QUANTIZE_QFORMATS, QFORMATS = QC.QUANTIZE_QFORMATS, QC.QFORMATS
KV_CACHE_DTYPES = ("fp8", "int8", "auto")                # auto: the model dtype (no --kv_cache_dtype)
XGRAMMAR_INFO_FILE = "xgrammar_tokenizer_info.json"      # NVIDIA's generate_xgrammar_tokenizer_info.py output
POSITIVE_INTS = ("tp_size", "pp_size", "instance_count", "max_beam_width", "max_batch_size", "max_input_len",
                 "max_seq_len", "max_num_tokens", "calib_size", "max_tokens_in_paged_kv_cache")
BOOLS = ("enable_kv_cache_reuse", "enable_chunked_context", "exclude_input_in_output", "lora", "gather_logits",
         "guided_decoding")
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
    if s["qformat"] not in QFORMATS:
        raise ProfileError(f"{where}.qformat = {s['qformat']!r}; allowed: {QFORMATS}")
    if s["kv_cache_dtype"] not in KV_CACHE_DTYPES:
        raise ProfileError(f"{where}.kv_cache_dtype = {s['kv_cache_dtype']!r}; allowed: {KV_CACHE_DTYPES}")
    if s["qformat"] == "checkpoint" and s["kv_cache_dtype"] != "auto":
        # convert_checkpoint.py's --int8_kv_cache calibrates the float model; its FP8 KV cache is not scripted here
        raise ProfileError(f"{where}.kv_cache_dtype = {s['kv_cache_dtype']!r}; qformat checkpoint needs auto")
    draft = s["max_draft_len"]
    if not isinstance(draft, int) or isinstance(draft, bool) or draft < 0:
        raise ProfileError(f"{where}.max_draft_len = {draft!r}; must be an integer >= 0 (0: no draft tokens)")
    if draft and s["gather_logits"]:  # trtllm-build refuses --gather_context_logits with --max_draft_len
        raise ProfileError(f"{where}: gather_logits and max_draft_len > 0 cannot be combined (trtllm-build refuses it)")
    if not isinstance(s["lora_target_modules"], list) or not s["lora_target_modules"]:
        raise ProfileError(f"{where}.lora_target_modules must be a non-empty list (e.g. [attn_q, attn_k, attn_v])")
    return s


def checkpoint_check(s: dict, repo: Path) -> QC.CheckpointQuant | None:
    """Refuse a local checkpoint_dir that does not fit the qformat; None when there is no folder to read."""
    value = s.get("checkpoint_dir")
    folder = Path(posixpath.expanduser(str(value))) if value else None
    if folder is not None and not folder.is_absolute():
        folder = repo / folder
    if folder is None or not folder.is_dir():
        return None
    try:
        return QC.legacy_check(folder, s["qformat"])
    except QC.CheckpointError as e:
        raise ProfileError(f"deployment.yaml: profiles.trtllm.checkpoint_dir = {value!r}: {e}") from None


def left_out(s: dict) -> tuple[frozenset, frozenset]:
    """(inputs, outputs) of tensorrt_llm the GPU config leaves out: ours, and those of features turned off."""
    inputs, outputs = set(NON_NVIDIA_INPUTS), set(NON_NVIDIA_OUTPUTS)
    for feature, (ins, outs) in FEATURES.items():
        if not s[feature]:
            inputs.update(ins)
            outputs.update(outs)
    return frozenset(inputs), frozenset(outputs)


def container_path(s: dict, value: str) -> str:
    """A deployment path as the server in the container sees it (see the module docstring)."""
    value = str(value)
    if posixpath.isabs(value):
        return posixpath.normpath(value)
    return posixpath.normpath(posixpath.join(str(s["container_repo_root"]), value))


def engine_path(s: dict) -> str:
    """The engine folder as the server will see it (absolute; see the module docstring)."""
    return container_path(s, s["engine_dir"])


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
    drop_in, drop_out = left_out(s)
    cfg = mc.ModelConfig(name=C.TENSORRT_LLM, backend=BACKEND, max_batch_size=mbs)
    # NVIDIA's decoupled_mode: streaming (the ensemble's `stream`) needs it; unary clients need it off.
    cfg.model_transaction_policy.decoupled = bool(llm.get("decoupled_mode", True))
    cfg.dynamic_batching.preferred_batch_size.append(mbs)
    cfg.dynamic_batching.max_queue_delay_microseconds = int(llm.get("max_queue_delay_microseconds", 0))
    if s["max_queue_size"]:
        cfg.dynamic_batching.default_queue_policy.max_queue_size = int(s["max_queue_size"])
    cfg.input.extend(_tensor(t, mc.ModelInput) for t in C.TENSORRT_LLM_INPUTS if t.name not in drop_in)
    cfg.output.extend(_tensor(t, mc.ModelOutput) for t in C.TENSORRT_LLM_OUTPUTS if t.name not in drop_out)
    cfg.instance_group.add(count=int(s["instance_count"]), kind=mc.ModelInstanceGroup.KIND_CPU)
    guided = s["guided_decoding"]
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
        # Read with no fallback (model_instance_state.cc:413-415): the keys must exist; "" = guided decoding off.
        # NVIDIA's backend reads an HF tokenizer folder: the checkpoint's (llm.tokenizer_dir may be a GGUF file).
        "tokenizer_dir": container_path(s, s.get("tokenizer_dir") or s.get("checkpoint_dir") or llm["tokenizer_dir"]),
        "xgrammar_tokenizer_info_path": posixpath.join(engine_path(s), XGRAMMAR_INFO_FILE) if guided else "",
        "guided_decoding_backend": "xgrammar" if guided else "",
    }
    if s.get("max_tokens_in_paged_kv_cache"):  # optional cap on top of the memory fraction
        params["max_tokens_in_paged_kv_cache"] = s["max_tokens_in_paged_kv_cache"]
    if s["lora"] and s.get("lora_prefetch_dir"):  # adapters loaded at start, by task id (NVIDIA's docs/lora.md)
        params["lora_prefetch_dir"] = container_path(s, s["lora_prefetch_dir"])
    for key, value in params.items():
        cfg.parameters[key].string_value = _param(value)
    return cfg


def _nvidia_steps():
    return C.ensemble_steps(engine_stream_keys=False)


def ensemble_config(deployment: dict, s: dict | None = None) -> mc.ModelConfig:
    """The default ensemble with every use of a left-out tensor pruned (see the module docstring)."""
    drop_in, drop_out = left_out(s or settings_with_defaults({}))
    inputs, outputs = C.MODEL_TENSORS[C.ENSEMBLE]
    required = {name: {t.name for t in C.MODEL_TENSORS[name][0] if not t.optional} for name in C.MODEL_TENSORS}
    dropped: set[str] = set()  # internal tensors that no longer exist
    steps = []
    for model_name, input_map, output_map in _nvidia_steps():
        out = {k: v for k, v in output_map.items() if not (model_name == C.TENSORRT_LLM and k in drop_out)}
        if model_name == C.TENSORRT_LLM:
            input_map = {k: v for k, v in input_map.items() if k not in drop_in}
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
    consumed = {v for _, inp, _ in steps for v in inp.values()}
    cfg = mc.ModelConfig(name=C.ENSEMBLE, platform="ensemble", max_batch_size=int(deployment["llm"]["max_batch_size"]))
    cfg.input.extend(_tensor(t, mc.ModelInput) for t in inputs if t.name in consumed)
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
    checkpoint_check(s, repo)  # refuses a checkpoint the build would; renders nothing
    bls = {}
    for name in (C.BLS, "llmapi"):  # NVIDIA's backend declares no finish_reason: the BLS must not ask for it
        if name in defaults:
            bls[name] = defaults[name]
            bls[name].parameters["engine_finish_reason"].string_value = "false"
    return {C.TENSORRT_LLM: tensorrt_llm_config(deployment, s), C.ENSEMBLE: ensemble_config(deployment, s),
            C.POSTPROCESSING: postprocessing_config(defaults[C.POSTPROCESSING]), **bls}
