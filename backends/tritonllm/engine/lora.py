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
an adapter (``None`` = base model); adapters are immutable after load (a run-time id is replaced only while
no request uses it); a request's KV blocks are hashed from its adapter's ``root`` (id and weights), so the
prefix cache never shares KV between adapters, nor with an adapter that held the same id before.
Run-time loading (paths under ``lora_root``, NVIDIA's in-request weights) is ``lora_loader.py``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InvalidInput, QueueFull

from .linear import linear
from .hf_config import ModelSpec

_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)\.lora_([AB])\.weight$")


class LoraError(InvalidInput):
    """An adapter that cannot be served; the message names the folder or file (a request's: INVALID_ARG)."""


@dataclass
class LoraPair:
    a: torch.Tensor   # [R, in]
    b: torch.Tensor   # [out, R], scaling folded in


class LoraAdapter:
    """One adapter: per layer, a LoraPair for each fused projection it touches.

    ``parts`` maps (layer, the checkpoint's module name, e.g. "q_proj") to float32 arrays (A [r, in], B [out, r])
    with the scaling already folded into B; ``source`` names where it came from (errors, and a request that names
    the same id from elsewhere); ``root`` is the parent hash of its requests' first KV block: from the id and
    the weights' bytes, so KV cached under an adapter that was unloaded or replaced is never served to another
    one, and the same adapter loaded again (or on another engine: Dynamo's transfers) finds its blocks.
    Built with numpy only (adapters load off the engine thread, where a torch op above the parallel grain would
    start a second OpenMP team: runner.py); ``place`` makes the torch tensors, on the engine thread."""

    def __init__(self, task_id: int, source: str, parts: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]],
                 spec: ModelSpec) -> None:
        self.task_id = task_id
        self.source = self.path = source
        if not parts:
            raise LoraError(f"{source}: the adapter has no lora_A / lora_B weights")
        sizes = projection_sizes(spec)
        known = {n for names in spec.arch.lora_targets().values() for n in names}
        digest = hashlib.blake2b(b"lora:" + int(task_id).to_bytes(8, "little"), digest_size=16)
        for (layer, name), (a, b) in sorted(parts.items()):
            if name not in known:
                raise LoraError(f"{source}: {name} is not a projection of this model ({', '.join(sorted(known))})")
            if not 0 <= layer < spec.num_layers:
                raise LoraError(f"{source}: a weight targets layer {layer}, the model has {spec.num_layers}")
            out_n, in_n = sizes[name]
            if a.ndim != 2 or b.ndim != 2 or a.shape[1] != in_n or b.shape[0] != out_n or a.shape[0] != b.shape[1]:
                raise LoraError(f"{source}: layer {layer} {name} has lora_A {list(a.shape)} / lora_B "
                                f"{list(b.shape)}, the model needs [r, {in_n}] / [{out_n}, r]")
            digest.update(f"{layer}.{name}:".encode() + np.ascontiguousarray(a, np.float32).tobytes()
                          + np.ascontiguousarray(b, np.float32).tobytes())
        self.root = int.from_bytes(digest.digest(), "little")
        self._host: list[dict[str, tuple[np.ndarray, np.ndarray]]] = [{} for _ in range(spec.num_layers)]
        for layer in range(spec.num_layers):
            for fused, names in spec.arch.lora_targets().items():  # fused projection -> the checkpoint's names
                present = [n for n in names if (layer, n) in parts]
                if not present:
                    continue
                outs = [sizes[n][0] for n in names]
                ranks = [parts[(layer, n)][0].shape[0] for n in present]
                big_b = np.zeros((sum(outs), sum(ranks)), np.float32)  # block-diagonal over the fused parts
                col = 0
                for n, r in zip(present, ranks):
                    row = sum(outs[:names.index(n)])
                    big_b[row:row + outs[names.index(n)], col:col + r] = parts[(layer, n)][1]
                    col += r
                a = np.concatenate([parts[(layer, n)][0] for n in present], 0).astype(np.float32)
                self._host[layer][fused] = (a, big_b)
        self.layers: list[dict[str, LoraPair]] = []

    def place(self, device: torch.device, dtype: torch.dtype) -> "LoraAdapter":
        """The torch tensors the forward pass reads (engine thread); once."""
        if not self.layers:
            self.layers = [{f: LoraPair(_on(a, device, dtype), _on(b, device, dtype)) for f, (a, b) in layer.items()}
                           for layer in self._host]
            self._host = []
        return self

    @classmethod
    def from_peft(cls, task_id: int, path: str, spec: ModelSpec, label: str | None = None) -> "LoraAdapter":
        """A PEFT folder (adapter_config.json + adapter_model.safetensors), PEFT's scaling folded into B;
        ``label`` names it in errors instead of the path (a client's own path under lora_root)."""
        label = label or path
        known = {n for names in spec.arch.lora_targets().values() for n in names}
        cfg = _read_config(path, known, label)
        weights = _read_weights(path, label)
        rank = int(cfg.get("r", 0))
        if rank < 1:
            raise LoraError(f"{label}: adapter_config.json has no positive rank 'r'")
        alpha = float(cfg.get("lora_alpha", rank))
        scaling = alpha / (rank ** 0.5 if cfg.get("use_rslora") else rank)
        halves: dict[tuple[int, str], dict[str, np.ndarray]] = {}
        for key, t in weights.items():
            m = _KEY.search(key)
            if m is None or m.group(2) not in known:
                raise LoraError(f"{label}: unsupported adapter weight {key!r} (only {'/'.join(sorted(known))} "
                                "lora_A / lora_B of the decoder layers)")
            layer, proj, ab = int(m.group(1)), m.group(2), m.group(3)
            if layer >= spec.num_layers:
                raise LoraError(f"{label}: weight {key!r} targets layer {layer}, the model has {spec.num_layers}")
            halves.setdefault((layer, proj), {})[ab] = _float32(t)
        parts = {}
        for (layer, proj), ab in halves.items():
            if set(ab) != {"A", "B"}:
                raise LoraError(f"{label}: layer {layer} {proj} lacks lora_A or lora_B")
            parts[(layer, proj)] = (ab["A"], ab["B"] * np.float32(scaling))
        return cls(task_id, label, parts, spec)


def _float32(t: torch.Tensor) -> np.ndarray:
    """A loaded weight as float32 numpy without a torch kernel (bf16: its bits are float32's upper half)."""
    if t.dtype == torch.bfloat16:
        return (t.contiguous().view(torch.int16).numpy().astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return t.numpy().astype(np.float32)


def _on(a: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if (t.dtype == dtype and device.type == "cpu") else t.to(device=device, dtype=dtype).contiguous()


class LoraSet:
    """The adapters of one engine, by task id: pinned ones (the ``lora_adapters`` parameter, loaded at start,
    never evicted) and at most ``max_loras`` loaded at run time, least recently used evicted first among those
    no request in the engine uses. Engine thread only, once serving."""

    def __init__(self, adapters: dict[int, LoraAdapter] | None = None, max_loras: int = 0) -> None:
        self.pinned = dict(adapters or {})
        self.loaded: OrderedDict[int, LoraAdapter] = OrderedDict()  # least recently used first
        self.max_loras = max_loras

    @classmethod
    def load(cls, paths: dict[int, str], spec: ModelSpec, device: torch.device,
             dtype: torch.dtype, max_loras: int = 0) -> "LoraSet":
        for task_id in paths:
            if task_id <= 0:
                raise LoraError(f"lora task id must be a positive integer, got {task_id}")
        return cls({tid: LoraAdapter.from_peft(tid, p, spec).place(device, dtype) for tid, p in sorted(paths.items())},
                   max_loras)

    def __bool__(self) -> bool:
        return bool(self.pinned or self.loaded)

    def get(self, task_id: int) -> LoraAdapter | None:
        return self.pinned.get(task_id) or self.loaded.get(task_id)

    def ids(self) -> list[int]:
        return sorted([*self.pinned, *self.loaded])

    def root(self, task_id: int | None) -> int | None:
        """The KV hash root of the adapter's requests (None: the base model); the id must be loaded."""
        if task_id is None:
            return None
        adapter = self.get(task_id)
        if adapter is None:  # NVIDIA's clients look for TensorRT-LLM's sentence: they then send the weights
            raise ValueError(f"lora_task_id {task_id} is not a loaded adapter (loaded: {self.ids() or 'none'}): send "
                             f"lora_path or lora_weights + lora_config with it. LoRA task {task_id} not found in "
                             "cache. Please send LoRA weights with request")
        return adapter.root

    def validate(self, task_id: int | None) -> None:
        self.root(task_id)

    def touch(self, task_id: int | None) -> None:
        if task_id in self.loaded:
            self.loaded.move_to_end(task_id)

    def install(self, adapter: LoraAdapter, busy: set, device: torch.device, dtype: torch.dtype) -> list[LoraAdapter]:
        """Adds a run-time adapter (replacing an idle one of the same id), evicting least recently used idle
        ones past ``max_loras``; returns the adapters that left (their KV roots are dead). Raises ValueError
        naming the conflict when the id is pinned or busy with another adapter, QueueFull when every slot serves
        requests."""
        tid = adapter.task_id
        old = self.get(tid)
        if old is not None and old.root == adapter.root:
            self.touch(tid)
            return []
        if tid in self.pinned:
            raise ValueError(f"lora_task_id {tid} is the fixed adapter {self.pinned[tid].source} (lora_adapters): "
                             "choose another id for a run-time adapter")
        if old is not None and tid in busy:
            raise ValueError(f"lora_task_id {tid} serves {old.source} to requests in flight: it can be replaced by "
                             f"{adapter.source} once they end (or use another id)")
        left = [self.loaded.pop(tid)] if old is not None else []
        while len(self.loaded) >= self.max_loras:
            idle = next((t for t in self.loaded if t not in busy), None)
            if idle is None:
                raise QueueFull(f"all {self.max_loras} run-time LoRA slots (max_loras) serve requests in flight: "
                                f"lora_task_id {tid} cannot be loaded now, retry later")
            left.append(self.loaded.pop(idle))
        self.loaded[tid] = adapter.place(device, dtype)
        return left

    def segments(self, spans: dict[int, list[tuple[int, int]]], num_tokens: int, device: torch.device) -> list:
        """(adapter, token rows) per adapter in a step, from each adapter's (start, count) spans of the flat batch;
        rows None when one adapter has every token."""
        segments = []
        for task_id, parts in spans.items():
            adapter = self.get(task_id)
            if len(spans) == 1 and sum(n for _, n in parts) == num_tokens:
                segments.append((adapter, None))
            else:
                rows = torch.cat([torch.arange(s, s + n) for s, n in parts]).to(device)
                segments.append((adapter, rows))
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


def projection_sizes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    q = spec.num_heads * spec.head_dim
    kv = spec.num_kv_heads * spec.head_dim
    h, i = spec.hidden_size, spec.intermediate_size
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q), "gate_proj": (i, h),
            "up_proj": (i, h), "down_proj": (h, i), "qkv_proj": (q + 2 * kv, h), "gate_up_proj": (2 * i, h)}


def _read_config(path: str, known: set[str], label: str) -> dict:
    cfg_path = os.path.join(path, "adapter_config.json")
    cfg_label = os.path.join(label, "adapter_config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise LoraError(f"LoRA adapter folder {label!r} has no adapter_config.json") from None
    except (OSError, ValueError) as e:
        raise LoraError(f"cannot read {cfg_label}: {e.strerror if isinstance(e, OSError) else e}") from None
    if cfg.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"{cfg_label}: peft_type {cfg.get('peft_type')!r} is not LORA")
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
        raise LoraError(f"{cfg_label}: unsupported LoRA settings {unsupported}")
    return cfg


def _read_weights(path: str, label: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    file = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(file):
        raise LoraError(f"LoRA adapter folder {label!r} has no adapter_model.safetensors "
                        "(pickled adapter_model.bin is refused)")
    try:
        return load_file(file)
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise LoraError(f"cannot read safetensors file {os.path.join(label, 'adapter_model.safetensors')}: "
                        f"{e}") from None
