"""Which TensorRT-LLM ``QuantAlgo`` a local checkpoint folder carries, read as NVIDIA's loaders read it.

Not a profile (the leading underscore keeps ``render_configs.discover_profiles`` off it): the ``llmapi`` and
``trtllm`` profiles and ``build_trtllm_engine.py`` call it so a checkpoint TensorRT-LLM would refuse is refused
at render / build time, naming the field. Only local folders are read (config.json, hf_quant_config.json,
quant_cfg.json); nothing is downloaded. Every rule below was read from NVIDIA/TensorRT-LLM's source (the
citations are ``tritonllm.trtllm.names``' constants) and never run here: TensorRT-LLM cannot be installed on
the development machines. The table with commits is docs/quantization.md, section "GPU profiles: quantized
checkpoints".

LLM API / PyTorch backend (``llmapi_quant``), in the loaders' order:
1. ``hf_quant_config.json`` (ModelOpt): the legacy ``{"quantization": {...}}`` or flat
   ``{"quant_method": "modelopt*", ...}`` shape (modelopt_config.py); ``quant_algo`` must name a QuantAlgo the
   PyTorch ``Linear`` has a method for (linear.py ``get_quant_method``, which raises "unsupported quant mode"
   for the others); MIXED_PRECISION checks every ``quantized_layers`` entry (also from quant_cfg.json).
2. else config.json ``quantization_config``: a ModelOpt-marked one as in 1; else by ``quant_method``
   (model_config.py ``load_hf_quant_config``); any method outside ``names.fields("quant_method")``, AutoAWQ's
   ``awq`` and AutoGPTQ's ``gptq`` included, is what llm_utils.py answers with NotImplementedError
   ("Unsupported quantization_config").
3. neither: not pre-quantized (quant_algo None).

Legacy engine path (``legacy_quant``): LLaMA-family AutoAWQ / AutoGPTQ folders that NVIDIA's
``examples/models/core/llama/convert_checkpoint.py`` reads (``update_quant_config_from_hf``: both become
W4A16_GPTQ, AWQ with ``use_autoawq``; GPTQ with ``desc_act`` refused).

Refusals of ours, where the source would misread a checkpoint rather than refuse it (each says so): an 8-bit
*integer* compressed-tensors group (the 8-bit branches build FP8), ``quant_method: fp8`` without
``weight_block_size`` or static activations (model_config.py leaves it unquantized), and for the legacy converter
``bits`` other than 4, GPTQ ``checkpoint_format`` other than gptq (v1) and AWQ ``version`` other than gemm.
AutoGPTQ on the PyTorch backend is refused as the merged loaders do; PR #19442 (``names.GPTQ_PR_PY``, open when
read) adds W4A16 GPTQ there (4-bit, group 64 / 128, no act order) and would move ``gptq`` to the loaded side.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tritonllm.trtllm import names as N


class CheckpointError(ValueError):
    """The checkpoint's quantization is one TensorRT-LLM would refuse (or misread); ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class CheckpointQuant:
    quant_algo: str | None                 # a QuantAlgo name; None: not pre-quantized
    origin: str                            # the file and field it was read from
    group_size: int | None = None
    kv_cache_quant_algo: str | None = None
    note: str = ""


# QuantAlgo -> the PyTorch Linear method that loads it (LINEAR_PY get_quant_method; MXFP8: MODEL_CONFIG_PY maps
# quant_method mxfp8 to it; MIXED_PRECISION: per-layer configs, each checked against this table).
TORCH_LOADED = {
    "FP8": "FP8QDQLinearMethod", "FP8_PER_CHANNEL_PER_TOKEN": "FP8RowwiseLinearMethod",
    "FP8_BLOCK_SCALES": "FP8BlockScalesLinearMethod", "NVFP4": "NVFP4LinearMethod",
    "NVFP4_ARC": "NVFP4ARCLinearMethod", "W4A8_NVFP4_FP8": "W4A8NVFP4FP8LinearMethod",
    "W4A8_MXFP4_FP8": "W4A8MXFP4FP8LinearMethod", "W4A8_MXFP4_MXFP8": "W4A8MXFP4MXFP8LinearMethod",
    "W8A16": "WeightOnlyQuantLinearMethod", "W4A16": "WeightOnlyQuantLinearMethod",
    "W4A16_AWQ": "W4A16_AWQ_LinearMethod", "W4A8_AWQ": "W4A8_AWQ_LinearMethod", "MXFP8": "(model_config.py)",
    "MIXED_PRECISION": "per layer", "NO_QUANT": "UnquantizedLinearMethod",
}
_SQ = ("INT8 weights and activations: the PyTorch Linear has no SmoothQuant method; the legacy trtllm profile "
       "builds it from a float checkpoint (qformat int8_sq)")
TORCH_REFUSED = {
    **{name: _SQ for name in ("W8A8_SQ_PER_CHANNEL", "W8A8_SQ_PER_TENSOR_PLUGIN",
                              "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN",
                              "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN")},
    "W4A16_GPTQ": "no PyTorch Linear method for GPTQ (PR #19442 adds one; open when read)",
    "W8A16_GPTQ": "no PyTorch Linear method for 8-bit GPTQ",
    "W4A8_QSERVE_PER_GROUP": "no PyTorch Linear method for QServe",
    "W4A8_QSERVE_PER_CHANNEL": "no PyTorch Linear method for QServe",
    "W4A16_MXFP4": "no dense Linear method (MoE experts only, from quant_method mxfp4)",
    "INT8": "a KV-cache algorithm, not a weight one (mode.py QUANT_ALGO_LIST leaves it out)",
}
# The legacy profile's qformats (one table: profiles/trtllm.py and build_trtllm_engine.py take it from here):
# quantize.py --qformat values we build (of its nvfp4 fp8 fp8_pc_pt int8_sq int4_awq w4a8_awq int8_wo int4_wo
# full_prec, names.fields("qformat"); int8_wo / int4_wo export W8A16 / W4A16, quantize_by_modelopt.py@042c510d),
# plus checkpoint: a pre-quantized AWQ / GPTQ folder converted as is (legacy_check).
QUANTIZE_QFORMATS = ("fp8", "int4_awq", "w4a8_awq", "int8_sq", "int8_wo", "int4_wo")
QFORMATS = QUANTIZE_QFORMATS + ("checkpoint",)
FP8_QFORMATS = ("fp8", "w4a8_awq")  # compute in FP8: SM >= 8.9
KV_CACHE_ALGOS = ("FP8", "NVFP4", "INT8")  # mode.py KV_CACHE_QUANT_ALGO_LIST
_NO_KV = ("none", "null", "")              # llm_utils.py: spellings of "no KV-cache quantization"
_FP8_BLOCK = [128, 128]


def _load(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(path.name, f"cannot be read as JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(path.name, "is not a JSON object")
    return data


def _dict(value, field: str) -> dict:
    if not isinstance(value, dict):
        raise CheckpointError(field, f"must be an object (got {value!r})")
    return value


def is_modelopt(raw: dict) -> bool:
    """modelopt_config.py is_modelopt_quant_config: producer.name == modelopt or quant_method modelopt*."""
    return (str(raw.get("quant_method", "")).lower().startswith("modelopt")
            or (raw.get("producer") or {}).get("name") == "modelopt")


def _modelopt_inner(raw: dict, where: str) -> tuple[dict, str]:
    """(the legacy ``quantization`` dict, the prefix of its fields): both shapes of modelopt_config.py."""
    if "quantization" in raw:
        return _dict(raw["quantization"], f"{where}quantization"), f"{where}quantization."
    if is_modelopt(raw):
        inner = {k: v for k, v in raw.items() if k not in ("producer", "quant_method", "ignore", "config_groups")}
        scheme = raw.get("kv_cache_scheme")
        if isinstance(scheme, dict) and (scheme.get("type"), scheme.get("num_bits")) == ("float", 8):
            inner["kv_cache_quant_algo"] = "FP8"
        elif isinstance(scheme, str):
            inner["kv_cache_quant_algo"] = scheme.upper()
        inner.pop("kv_cache_scheme", None)
        return inner, where
    raise CheckpointError(where.rstrip(": ."),
                          "not a ModelOpt config (no 'quantization' object, no producer.name 'modelopt', "
                          "no quant_method 'modelopt')")


def _torch_algo(value, field: str) -> str:
    algo = "FP8_BLOCK_SCALES" if str(value).lower() == "fp8_pb_wo" else value  # modelopt_config.py alias
    if algo in TORCH_LOADED:
        return algo
    if algo in TORCH_REFUSED:
        raise CheckpointError(field, f"{algo}: {TORCH_REFUSED[algo]}")
    raise CheckpointError(field, f"{value!r} is not a QuantAlgo the PyTorch backend loads "
                                 f"(loaded: {sorted(TORCH_LOADED)})")


def _kv_algo(value, field: str) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NO_KV):
        return None
    if value not in KV_CACHE_ALGOS:
        raise CheckpointError(field, f"{value!r}: KV-cache algorithms are {KV_CACHE_ALGOS}")
    return value


def _modelopt(raw: dict, where: str, folder: Path, inline_fallback: dict | None) -> CheckpointQuant:
    inner, prefix = _modelopt_inner(raw, where)
    origin = where.split(":")[0] + " (ModelOpt)"
    kv = _kv_algo(inner.get("kv_cache_quant_algo"), f"{prefix}kv_cache_quant_algo")
    layers = dict(inner.get("quantized_layers") or {})
    algo = inner.get("quant_algo")
    if algo is None:
        # llm_utils.py: layers without a global algo take the global one from config.json's quantization_config
        if not layers:
            raise CheckpointError(f"{prefix}quant_algo", "missing (a pre-quantized checkpoint must have one)")
        if inline_fallback is None:
            raise CheckpointError(f"{prefix}quant_algo", "missing, and config.json has no quantization_config "
                                                         "to take the global algorithm from")
        fallback = _hf(inline_fallback, folder)
        _check_layers(layers, f"{prefix}quantized_layers")
        return CheckpointQuant(fallback.quant_algo, origin + " + config.json quantization_config",
                               fallback.group_size, kv or fallback.kv_cache_quant_algo, "per-layer overrides")
    algo = _torch_algo(algo, f"{prefix}quant_algo")
    if algo == "MIXED_PRECISION":
        extra = _load(folder / "quant_cfg.json") or {}
        layers.update(_dict(extra.get("quantized_layers") or {}, "quant_cfg.json: quantized_layers"))
        if not layers:  # model_config.py iterates quantized_layers: None would fail there
            raise CheckpointError(f"{prefix}quantized_layers", "MIXED_PRECISION needs per-layer algorithms "
                                                               "(hf_quant_config.json or quant_cfg.json)")
        _check_layers(layers, f"{prefix}quantized_layers")
    return CheckpointQuant(algo, origin, inner.get("group_size"), kv)


def _check_layers(layers: dict, field: str) -> None:
    for name, cfg in sorted(layers.items()):
        algo = _dict(cfg, f"{field}.{name}").get("quant_algo")
        if _torch_algo(algo, f"{field}.{name}.quant_algo") == "MIXED_PRECISION":
            raise CheckpointError(f"{field}.{name}.quant_algo", "a layer cannot be MIXED_PRECISION itself")


def _ct_group(group: dict, fmt, field: str) -> tuple[str, int | None]:
    """quant_config_utils.py _quant_config_from_config_group, plus one refusal of ours (integer 8-bit)."""
    weights = _dict(group.get("weights"), f"{field}.weights")
    bits, wtype, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
    acts = group.get("input_activations")
    if fmt == "mxfp4-pack-quantized" or (bits == 4 and wtype == "float" and strategy == "group" and acts is None):
        if weights.get("group_size") != 32:
            raise CheckpointError(f"{field}.weights.group_size", f"{weights.get('group_size')!r}: MXFP4 needs 32")
        return "W4A16_MXFP4", 32
    if acts is None:
        raise CheckpointError(f"{field}.input_activations",
                              f"null: weight-only {wtype} {bits}-bit (e.g. llm-compressor's W4A16 GPTQ/AWQ, format "
                              "pack-quantized) has no branch; only MXFP4 is read without input_activations")
    act_strategy = _dict(acts, f"{field}.input_activations").get("strategy")
    if bits == 8:
        if wtype != "float":  # the source's 8-bit branches build FP8 kernels without looking at the type
            raise CheckpointError(f"{field}.weights.type", f"{wtype!r}: the 8-bit branches are FP8 "
                                  "(FP8_PER_CHANNEL_PER_TOKEN, FP8_BLOCK_SCALES); INT8 W8A8 would be read as FP8")
        if strategy == "channel" and act_strategy == "token":
            return "FP8_PER_CHANNEL_PER_TOKEN", None
        if strategy == "block" and act_strategy == "group":
            if acts.get("group_size") != 128:
                raise CheckpointError(f"{field}.input_activations.group_size",
                                      f"{acts.get('group_size')!r}: FP8_BLOCK_SCALES needs 128")
            return "FP8_BLOCK_SCALES", 128
        raise CheckpointError(f"{field}.weights.strategy",
                              f"{strategy!r} with input_activations.strategy {act_strategy!r}: FP8 reads channel + "
                              "token or block + group")
    if bits == 4 and wtype == "float" and strategy == "tensor_group":
        if act_strategy != "tensor_group":
            raise CheckpointError(f"{field}.input_activations.strategy", f"{act_strategy!r}: NVFP4 needs "
                                                                         "tensor_group")
        if weights.get("group_size") != 16:
            raise CheckpointError(f"{field}.weights.group_size", f"{weights.get('group_size')!r}: NVFP4 needs 16")
        return "NVFP4", 16
    raise CheckpointError(f"{field}.weights.num_bits", f"{bits!r} ({wtype}, {strategy}): supported are 8-bit FP8 "
                                                       "and 4-bit float (NVFP4, MXFP4)")


def _compressed_tensors(qc: dict, field: str) -> CheckpointQuant:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError(f"{field}.config_groups", "missing or empty")
    kv = None
    scheme = qc.get("kv_cache_scheme")
    if scheme is not None:
        if not (isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float"):
            raise CheckpointError(f"{field}.kv_cache_scheme", f"{scheme!r}: only FP8 (8-bit float) is read")
        kv = "FP8"
    found = [_ct_group(_dict(g, f"{field}.config_groups.{name}"), g.get("format", qc.get("format")),
                       f"{field}.config_groups.{name}") for name, g in groups.items()]
    origin = "config.json quantization_config (compressed-tensors)"
    if len(found) > 1:
        return CheckpointQuant("MIXED_PRECISION", origin, None, kv, "config_groups targets are matched against "
                                                                     "the checkpoint's modules at load (not here)")
    return CheckpointQuant(found[0][0], origin, found[0][1], kv)


def _hf(qc: dict, folder: Path) -> CheckpointQuant:
    field = "config.json: quantization_config"
    qc = _dict(qc, field)
    if is_modelopt(qc):
        return _modelopt(qc, "config.json: quantization_config.", folder, None)
    method = qc.get("quant_method")
    origin = f"config.json quantization_config (quant_method {method})"
    if method is None:  # llm_utils.py: "not pre-quantized"
        return CheckpointQuant(None, "config.json quantization_config without quant_method")
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block is not None or qc.get("activation_scheme") == "static":
            if list(block or _FP8_BLOCK) != _FP8_BLOCK:  # model_config.py asserts (128, 128)
                raise CheckpointError(f"{field}.weight_block_size", f"{block!r}: FP8_BLOCK_SCALES needs [128, 128]")
            return CheckpointQuant("FP8_BLOCK_SCALES", origin, 128, note="" if block else
                                   "static activations, no block size: model_config.py builds FP8_BLOCK_SCALES "
                                   "(llm_utils.py reports FP8)")
        raise CheckpointError(f"{field}.weight_block_size", "missing, with activation_scheme "
                              f"{qc.get('activation_scheme')!r}: model_config.py maps quant_method fp8 only with "
                              "weight_block_size or static activations (otherwise it builds the model unquantized)")
    if method == "mxfp4":
        return CheckpointQuant("W4A16_MXFP4", origin, 32, note="SM 10.x+: W4A8_MXFP4_MXFP8 (W4A8_MXFP4_FP8 with "
                                                              "the TRITON MoE backend)")
    if method == "mxfp8":
        if list(qc.get("weight_block_size") or [1, 32]) != [1, 32]:
            raise CheckpointError(f"{field}.weight_block_size", "MXFP8 needs [1, 32]")
        return CheckpointQuant("MXFP8", origin, 32)
    if method == "nvfp4":
        if qc.get("group_size", 16) != 16:
            raise CheckpointError(f"{field}.group_size", f"{qc.get('group_size')!r}: NVFP4 needs 16")
        return CheckpointQuant("NVFP4", origin, 16)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, field)
    why = {"awq": "AutoAWQ checkpoints are not read by the PyTorch backend; a ModelOpt int4_awq export "
                  "(hf_quant_config.json, W4A16_AWQ) is",
           "gptq": "AutoGPTQ checkpoints are not read by the PyTorch backend (PR #19442 adds W4A16 GPTQ; open "
                   "when read)"}.get(method, "no loader branch for it")
    raise CheckpointError(f"{field}.quant_method", f"{method!r}: {why} (llm_utils.py raises NotImplementedError "
                          f"'Unsupported quantization_config'; read: {sorted(N.fields('quant_method'))})")


def llmapi_quant(folder: Path) -> CheckpointQuant:
    """What the LLM API's PyTorch backend would load from ``folder`` (see the module docstring)."""
    folder = Path(folder)
    config = _load(folder / "config.json")
    inline = (config or {}).get("quantization_config")
    hf_quant = _load(folder / "hf_quant_config.json")
    if hf_quant is not None:
        return _modelopt(hf_quant, "hf_quant_config.json: ", folder, inline)
    if inline is not None:
        return _hf(inline, folder)
    return CheckpointQuant(None, "config.json without quantization_config")


LEGACY_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")  # served by examples/models/core/llama


def legacy_quant(folder: Path) -> CheckpointQuant:
    """What ``convert_checkpoint.py`` (LLaMA family) makes of a pre-quantized AutoAWQ / AutoGPTQ folder."""
    folder = Path(folder)
    if (folder / "hf_quant_config.json").is_file():
        raise CheckpointError("hf_quant_config.json", "a ModelOpt export: serve it with the llmapi profile, or "
                                                      "build from the float checkpoint with a quantize.py qformat")
    config = _load(folder / "config.json")
    if config is None:
        raise CheckpointError("config.json", f"missing in {folder}")
    arch = (config.get("architectures") or [None])[0]
    if arch not in LEGACY_ARCHITECTURES:
        raise CheckpointError("config.json: architectures", f"{arch!r}: only the LLaMA example's converter is "
                              f"scripted here ({', '.join(LEGACY_ARCHITECTURES)})")
    field = "config.json: quantization_config"
    if config.get("quantization_config") is None:
        raise CheckpointError(field, "missing: a float checkpoint takes a quantize.py qformat, not checkpoint")
    qc = _dict(config["quantization_config"], field)
    method = qc.get("quant_method")
    group = qc.get("group_size", 128)
    if method == "gptq":
        if qc.get("desc_act"):
            raise CheckpointError(f"{field}.desc_act", "true: 'GPTQ with desc_act=True is not implemented!'")
        if qc.get("checkpoint_format", "gptq") != "gptq":  # the converter unpacks AutoGPTQ's v1 layout only
            raise CheckpointError(f"{field}.checkpoint_format", f"{qc['checkpoint_format']!r}: only gptq (v1)")
        algo, note = "W4A16_GPTQ", "AutoGPTQ"
    elif method == "awq":
        if str(qc.get("version", "gemm")).lower() != "gemm":  # unpacked with AutoAWQ's GEMM nibble order
            raise CheckpointError(f"{field}.version", f"{qc['version']!r}: only AutoAWQ GEMM packing")
        algo, note = "W4A16_GPTQ", "AutoAWQ (use_autoawq)"
    else:
        raise CheckpointError(f"{field}.quant_method", f"{method!r}: the converter reads awq and gptq "
                              "(fbgemm_fp8 too, not scripted here); float checkpoints take a quantize.py qformat")
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:  # every awq / gptq config becomes W4A16_GPTQ, whatever its bits
        raise CheckpointError(f"{field}.bits", f"{bits!r}: W4A16_GPTQ is 4-bit")
    return CheckpointQuant(algo, f"config.json quantization_config (quant_method {method})", group, None, note)


def legacy_check(folder: Path, qformat: str) -> CheckpointQuant | None:
    """The legacy profile's rule: qformat ``checkpoint`` converts a pre-quantized folder (``legacy_quant``); a
    quantize.py qformat needs float weights, since ModelOpt calibrates them."""
    folder = Path(folder)
    if qformat == "checkpoint":
        return legacy_quant(folder)
    why = ("already quantized: quantize.py calibrates float weights; use qformat checkpoint (LLaMA-family "
           "AutoAWQ / AutoGPTQ) or the llmapi profile")
    if (folder / "hf_quant_config.json").is_file():
        raise CheckpointError("hf_quant_config.json", f"a ModelOpt export, {why}")
    qc = (_load(folder / "config.json") or {}).get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method"):
        raise CheckpointError("config.json: quantization_config.quant_method", f"{qc['quant_method']!r}: {why}")
    return None
