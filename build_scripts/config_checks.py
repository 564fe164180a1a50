"""Cross-checks over a set of Triton model configs (``model_config_pb2.ModelConfig``), before any server runs.

``check_pipeline(configs)`` returns a list of human-readable errors (empty = consistent). It checks:
- every ensemble step names a model of the set; every ``input_map`` key is an input of that model and
  every ``output_map`` key one of its outputs;
- every mapped value is an ensemble input or an internal tensor produced by an *earlier* step (or an
  ensemble output); source and destination agree on dtype and on dims (-1 matches anything);
- every required input of a step is mapped; every ensemble input is consumed; every ensemble output is
  produced by exactly one step;
- streaming inputs are not checked against the transaction policy: as in NVIDIA's configs, a model
  that is not decoupled (``decoupled_mode: false``) keeps its ``streaming`` input and refuses
  ``streaming=true`` per request;
- batch sizes: an ensemble's ``max_batch_size`` is > 0 only if every step's is, and never exceeds them;
- no string anywhere still holds an unfilled ``${...}`` template placeholder;
- tensor names are unique within each model's inputs and within its outputs.
Library-free apart from protobuf: usable from tests with hand-built (broken) configs.
"""
from __future__ import annotations

from typing import Mapping

from tritonclient.grpc import model_config_pb2 as mc

def _dtype(t) -> str:
    return mc.DataType.Name(t.data_type)


def _dims_compatible(a, b) -> bool:
    a, b = list(a), list(b)
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _is_ensemble(cfg: mc.ModelConfig) -> bool:
    return cfg.platform == "ensemble"


def _check_names(name: str, cfg: mc.ModelConfig, errors: list[str]) -> None:
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        seen = set()
        for t in tensors:
            if t.name in seen:
                errors.append(f"{name}: duplicate {kind} '{t.name}'")
            seen.add(t.name)
    if "${" in str(cfg):
        errors.append(f"{name}: unfilled template placeholder '${{...}}' in config")


def _check_ensemble(name: str, cfg: mc.ModelConfig, configs: Mapping[str, mc.ModelConfig],
                    errors: list[str]) -> None:
    # Known tensors: name -> (dtype, dims, description) — ensemble inputs first, then step outputs.
    known = {t.name: (_dtype(t), list(t.dims), f"ensemble input '{t.name}'") for t in cfg.input}
    ens_inputs = {t.name for t in cfg.input}
    ens_outputs = {t.name: t for t in cfg.output}
    consumed: set[str] = set()
    produced: dict[str, str] = {}
    for i, step in enumerate(cfg.ensemble_scheduling.step):
        where = f"{name} step {i} ({step.model_name})"
        target = configs.get(step.model_name)
        if target is None:
            errors.append(f"{where}: no model named '{step.model_name}'")
            continue
        if cfg.max_batch_size > 0 and target.max_batch_size == 0:
            errors.append(f"{where}: ensemble batches (max_batch_size {cfg.max_batch_size}) "
                          f"but the step model does not (max_batch_size 0)")
        elif cfg.max_batch_size > target.max_batch_size > 0:
            errors.append(f"{where}: ensemble max_batch_size {cfg.max_batch_size} exceeds the "
                          f"step's {target.max_batch_size}")
        inputs = {t.name: t for t in target.input}
        outputs = {t.name: t for t in target.output}
        for key, value in step.input_map.items():
            dst = inputs.get(key)
            if dst is None:
                errors.append(f"{where}: input_map key '{key}' is not an input of {step.model_name}")
                continue
            src = known.get(value)
            if src is None:
                errors.append(f"{where}: input '{key}' maps from '{value}', which is neither an ensemble "
                              f"input nor produced by an earlier step")
                continue
            consumed.add(value)
            if src[0] != _dtype(dst):
                errors.append(f"{where}: dtype mismatch {src[2]} is {src[0]} but "
                              f"{step.model_name}.{key} is {_dtype(dst)}")
            elif not _dims_compatible(src[1], dst.dims):
                errors.append(f"{where}: dims mismatch {src[2]} {src[1]} vs "
                              f"{step.model_name}.{key} {list(dst.dims)}")
        for key, t in inputs.items():
            if not t.optional and key not in step.input_map:
                errors.append(f"{where}: required input '{key}' of {step.model_name} is not mapped")
        for key, value in step.output_map.items():
            src = outputs.get(key)
            if src is None:
                errors.append(f"{where}: output_map key '{key}' is not an output of {step.model_name}")
                continue
            if value in produced or value in ens_inputs:
                errors.append(f"{where}: tensor '{value}' is produced twice (or shadows an ensemble input)")
            produced[value] = step.model_name
            known[value] = (_dtype(src), list(src.dims), f"{step.model_name}.{key}")
            if value in ens_outputs:
                out = ens_outputs[value]
                if _dtype(out) != _dtype(src):
                    errors.append(f"{where}: ensemble output '{value}' is {_dtype(out)} but "
                                  f"{step.model_name}.{key} is {_dtype(src)}")
                elif not _dims_compatible(out.dims, src.dims):
                    errors.append(f"{where}: ensemble output '{value}' dims {list(out.dims)} vs "
                                  f"{step.model_name}.{key} {list(src.dims)}")
    for t in cfg.input:
        if t.name not in consumed:
            errors.append(f"{name}: ensemble input '{t.name}' is not consumed by any step")
    for out_name in ens_outputs:
        if out_name not in produced:
            errors.append(f"{name}: ensemble output '{out_name}' is not produced by any step")


def check_pipeline(configs: Mapping[str, mc.ModelConfig]) -> list[str]:
    """All consistency errors of ``configs`` (model name -> config); see the module docstring."""
    errors: list[str] = []
    for name, cfg in configs.items():
        if cfg.name and cfg.name != name:
            errors.append(f"{name}: config says name '{cfg.name}'")
        _check_names(name, cfg, errors)
        if _is_ensemble(cfg):
            _check_ensemble(name, cfg, configs, errors)
    return errors
