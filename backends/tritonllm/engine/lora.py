"""Multi-LoRA: PEFT-format adapters loaded once, chosen per request, mixed freely in one batch.

An adapter is a PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``) targeting any of
q/k/v/o/gate/up/down_proj. For each of our fused projections (qkv, o, gate_up, down) it becomes a pair
``A`` [sum of ranks, in] and ``B`` [out, sum of ranks], block-diagonal over the fused parts, with PEFT's
scaling (alpha / r, or alpha / sqrt(r) with rsLoRA) folded into ``B``; a module the adapter does not
target contributes no rows. The forward pass adds ``(x_rows A^T) B^T`` to the base output for the rows
(tokens) of each adapter present in the step -- a loop over adapters, not over requests, so requests with
different adapters share every base matmul (the idea of Punica / S-LoRA's segmented LoRA, done with
index_select / index_add_ on CPU).

Invariants: adapter ids are the request input ``lora_task_id`` (uint64, TensorRT-LLM's name); id 0 is never
an adapter (``None`` = base model); adapters are immutable after load; a request's KV blocks are hashed
with its adapter id, so the prefix cache never shares KV between adapters.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import torch

from .linear import linear
from .hf_config import ModelSpec

_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)\.lora_([AB])\.weight$")


class LoraError(ValueError):
    """An adapter that cannot be served; the message names the folder or file."""


@dataclass
class LoraPair:
    a: torch.Tensor   # [R, in]
    b: torch.Tensor   # [out, R], scaling folded in


class LoraAdapter:
    """One adapter: per layer, a LoraPair for each fused projection it touches."""

    def __init__(self, task_id: int, path: str, spec: ModelSpec, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.task_id = task_id
        self.path = path
        fused_targets = spec.arch.lora_targets()  # fused projection -> the checkpoint's module names
        known = {n for names in fused_targets.values() for n in names}
        cfg = _read_config(path, known)
        weights = _read_weights(path)
        self.rank = int(cfg.get("r", 0))
        alpha = float(cfg.get("lora_alpha", self.rank))
        if self.rank < 1:
            raise LoraError(f"{path}: adapter_config.json has no positive rank 'r'")
        scaling = alpha / (self.rank ** 0.5 if cfg.get("use_rslora") else self.rank)
        parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        for key, t in weights.items():
            m = _KEY.search(key)
            if m is None or m.group(2) not in known:
                raise LoraError(f"{path}: unsupported adapter weight {key!r} (only {'/'.join(sorted(known))} "
                                "lora_A / lora_B of the decoder layers)")
            layer, proj, ab = int(m.group(1)), m.group(2), m.group(3)
            if layer >= spec.num_layers:
                raise LoraError(f"{path}: weight {key!r} targets layer {layer}, the model has {spec.num_layers}")
            parts.setdefault((layer, proj), {})[ab] = t.float()
        sizes = _projection_sizes(spec)
        self.layers: list[dict[str, LoraPair]] = [{} for _ in range(spec.num_layers)]
        for layer in range(spec.num_layers):
            for fused, names in fused_targets.items():
                present = [n for n in names if (layer, n) in parts]
                if not present:
                    continue
                a_rows, b_cols, ranks = [], [], []
                for n in present:
                    ab = parts[(layer, n)]
                    if set(ab) != {"A", "B"}:
                        raise LoraError(f"{path}: layer {layer} {n} lacks lora_A or lora_B")
                    out_n, in_n = sizes[n]
                    a, b = ab["A"], ab["B"]
                    if a.shape[1] != in_n or b.shape[0] != out_n or a.shape[0] != b.shape[1]:
                        raise LoraError(f"{path}: layer {layer} {n} has lora_A {list(a.shape)} / lora_B "
                                        f"{list(b.shape)}, the model needs [r, {in_n}] / [{out_n}, r]")
                    a_rows.append(a)
                    ranks.append(a.shape[0])
                    b_cols.append((n, b * scaling))
                outs = [sizes[n][0] for n in names]
                big_b = torch.zeros(sum(outs), sum(ranks))
                col = 0
                for (n, b), r in zip(b_cols, ranks):
                    row = sum(outs[:names.index(n)])
                    big_b[row:row + b.shape[0], col:col + r] = b
                    col += r
                self.layers[layer][fused] = LoraPair(
                    torch.cat(a_rows, 0).to(device=device, dtype=dtype).contiguous(),
                    big_b.to(device=device, dtype=dtype).contiguous())
        if not any(self.layers):
            raise LoraError(f"{path}: the adapter has no lora_A / lora_B weights")


class LoraSet:
    """The adapters of one engine, by task id, plus the per-step segments built by the engine."""

    def __init__(self, adapters: dict[int, LoraAdapter] | None = None) -> None:
        self.adapters = dict(adapters or {})

    @classmethod
    def load(cls, paths: dict[int, str], spec: ModelSpec, device: torch.device,
             dtype: torch.dtype) -> "LoraSet":
        for task_id in paths:
            if task_id <= 0:
                raise LoraError(f"lora task id must be a positive integer, got {task_id}")
        return cls({tid: LoraAdapter(tid, p, spec, device, dtype) for tid, p in sorted(paths.items())})

    def __bool__(self) -> bool:
        return bool(self.adapters)

    def validate(self, task_id: int | None) -> None:
        if task_id is not None and task_id not in self.adapters:
            known = sorted(self.adapters) or "none"
            raise ValueError(f"lora_task_id {task_id} is not a loaded adapter (loaded: {known})")

    def segments(self, spans: dict[int, list[tuple[int, int]]], num_tokens: int, device: torch.device) -> list:
        """(adapter, token rows) per adapter in a step, from each adapter's (start, count) spans of the flat batch;
        rows None when one adapter has every token."""
        segments = []
        for task_id, parts in spans.items():
            if len(spans) == 1 and sum(n for _, n in parts) == num_tokens:
                segments.append((self.adapters[task_id], None))
            else:
                rows = torch.cat([torch.arange(s, s + n) for s, n in parts]).to(device)
                segments.append((self.adapters[task_id], rows))
        return segments

    @staticmethod
    def apply(out: torch.Tensor, x: torch.Tensor, segments, layer: int, fused: str) -> torch.Tensor:
        """out += LoRA deltas of `fused` in `layer` for each (adapter, rows) segment; rows None = all."""
        for adapter, rows in segments:
            pair = adapter.layers[layer].get(fused)
            if pair is None:
                continue
            if rows is None:
                out += linear(linear(x, pair.a), pair.b)
            else:
                out.index_add_(0, rows, linear(linear(x.index_select(0, rows), pair.a), pair.b))
        return out


def parse_adapter_list(value: str) -> dict[int, str]:
    """``"1=adapters/sql, 2=/abs/chat"`` -> {1: "adapters/sql", 2: "/abs/chat"} (paths not resolved)."""
    out: dict[int, str] = {}
    if value.strip().startswith("${"):  # an unfilled template: no adapters
        return out
    for item in filter(None, (s.strip() for s in value.split(","))):
        tid, sep, path = item.partition("=")
        if not sep or not path.strip():
            raise ValueError(f"expected <task id>=<adapter folder>, got {item!r}")
        try:
            task_id = int(tid)
        except ValueError:
            raise ValueError(f"lora task id must be an integer, got {tid!r}") from None
        if task_id <= 0 or task_id in out:
            raise ValueError(f"lora task id {task_id} is not positive or is repeated")
        out[task_id] = path.strip()
    return out


def _projection_sizes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    q = spec.num_heads * spec.head_dim
    kv = spec.num_kv_heads * spec.head_dim
    h, i = spec.hidden_size, spec.intermediate_size
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q), "gate_proj": (i, h),
            "up_proj": (i, h), "down_proj": (h, i), "qkv_proj": (q + 2 * kv, h), "gate_up_proj": (2 * i, h)}


def _read_config(path: str, known: set[str]) -> dict:
    cfg_path = os.path.join(path, "adapter_config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise LoraError(f"LoRA adapter folder {path!r} has no adapter_config.json") from None
    except (OSError, ValueError) as e:
        raise LoraError(f"cannot read {cfg_path}: {e}") from None
    if cfg.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r} is not LORA")
    unsupported = {k: cfg[k] for k in ("use_dora", "fan_in_fan_out") if cfg.get(k)}
    unsupported.update({k: cfg[k] for k in ("rank_pattern", "alpha_pattern", "modules_to_save")
                        if cfg.get(k)})
    if cfg.get("bias", "none") != "none":
        unsupported["bias"] = cfg["bias"]
    targets = cfg.get("target_modules") or []  # a string is a regex or "all-linear": the weights decide
    other = [] if isinstance(targets, str) else [t for t in targets if t not in known]
    if other:
        unsupported["target_modules"] = other
    if unsupported:
        raise LoraError(f"{cfg_path}: unsupported LoRA settings {unsupported}")
    return cfg


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    file = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(file):
        raise LoraError(f"LoRA adapter folder {path!r} has no adapter_model.safetensors "
                        "(pickled adapter_model.bin is refused)")
    try:
        return load_file(file)
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise LoraError(f"cannot read safetensors file {file}: {e}") from None
