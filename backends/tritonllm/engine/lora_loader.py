"""LoRA adapters loaded at run time, named by a request: a PEFT folder under ``lora_root`` (the request's
``lora_path``, as NVIDIA's LLM-API model and vLLM's ``/v1/load_lora_adapter`` take one) or TensorRT-LLM's
in-request tensors (``lora_weights`` + ``lora_config``). Files are read and converted on a loader thread, never
on the engine thread (which installs the result between steps: ``LoraSet.install``), with numpy only (a torch op
there would start a second OpenMP team: runner.py). No Triton imports.

Paths: relative to ``lora_root``; the folder, symlinks resolved, must lie inside it (no ``..``, no absolute path
elsewhere, no symlink out): refused before anything is opened, and the message never says what is outside.
Without ``lora_root`` a request's path is refused. Two requests naming the same adapter while it loads share one
load.

TensorRT-LLM's tensors (read from its source, not run: ``cpp/include/tensorrt_llm/runtime/loraModule.h``,
``tensorrt_llm/lora_manager.py``, ``triton_backend/.../docs/lora.md``): ``lora_config`` rows are
(module id, layer, rank r); the matching ``lora_weights`` row holds the module's in-weights [r, in] then its
out-weights [out, r], row-major, then padding; the converter folds PEFT's alpha / r into the out-weights. Module
ids to the checkpoint's names: ``NVIDIA_MODULES``.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .hf_config import ModelSpec
from .lora import LoraAdapter, LoraError, projection_sizes

# TensorRT-LLM's LoraModule::ModuleType ids -> the Llama-family checkpoint's module names, as its converter maps
# HF names (examples/hf_lora_convert.py: gate_proj is mlp_h_to_4h, up_proj is mlp_gate). 0 (attn_qkv, fused):
# its out-weights' rows are q, k, v in turn, each served with the same in-weights.
NVIDIA_MODULES: dict[int, str] = {0: "qkv", 1: "q_proj", 2: "k_proj", 3: "v_proj", 4: "o_proj", 5: "gate_proj",
                                  6: "down_proj", 7: "up_proj"}


@dataclass(eq=False)
class LoraSource:
    """Where a request's adapter comes from: ``path`` (relative to lora_root) or NVIDIA's two tensors."""

    path: str | None = None
    weights: np.ndarray | None = field(default=None, repr=False)  # [modules x layers, r*in + out*r (+ padding)]
    config: np.ndarray | None = field(default=None, repr=False)   # [modules x layers, 3]


def confine(root: str | None, value: str) -> str:
    """The real folder of ``value`` inside ``root``; InvalidRequest (LoraError) otherwise."""
    if not root:
        raise LoraError("lora_path: adapters are not loaded by path on this server (the lora_root parameter of "
                        "tensorrt_llm is unset)")
    raw = (value or "").strip()
    if not raw or "\x00" in raw:
        raise LoraError("lora_path is empty or holds a NUL character")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, raw))  # an absolute raw replaces the root: checked below
    if os.path.commonpath([real, real_root]) != real_root or real == real_root:
        raise LoraError(f"lora_path {raw!r} is not a folder inside lora_root (relative paths only; no '..' or "
                        "symlink leading out)")
    return real


def from_nvidia(task_id: int, weights: np.ndarray, config: np.ndarray, spec: ModelSpec) -> LoraAdapter:
    """An adapter from TensorRT-LLM's ``lora_weights`` / ``lora_config`` (the module docstring)."""
    w = np.asarray(weights)
    c = np.asarray(config)
    if c.ndim != 2 or c.shape[1] != 3 or c.shape[0] < 1:
        raise LoraError(f"lora_config must have shape [modules x layers, 3], got {list(c.shape)}")
    if w.ndim != 2 or w.shape[0] != c.shape[0]:
        raise LoraError(f"lora_weights must have shape [{c.shape[0]}, r*in + out*r] (one row per lora_config row), "
                        f"got {list(w.shape)}")
    sizes = projection_sizes(spec)
    parts = {}
    for row, (module, layer, rank) in enumerate(c.astype(np.int64).tolist()):
        name = NVIDIA_MODULES.get(module)
        if name is None:
            raise LoraError(f"lora_config row {row}: module id {module} is not one this engine serves "
                            f"({', '.join(f'{k} {v}' for k, v in NVIDIA_MODULES.items())})")
        if not 0 <= layer < spec.num_layers:
            raise LoraError(f"lora_config row {row}: layer {layer} is outside the model's {spec.num_layers}")
        split = ("q_proj", "k_proj", "v_proj") if name == "qkv" else (name,)
        outs = [sizes[n][0] for n in split]
        out_n, in_n = sum(outs), sizes[split[0]][1]
        if rank < 1 or rank * (in_n + out_n) > w.shape[1]:
            raise LoraError(f"lora_config row {row}: rank {rank} of {name} needs {max(rank, 1) * (in_n + out_n)} "
                            f"values, lora_weights rows hold {w.shape[1]}")
        if any((layer, n) in parts for n in split):
            raise LoraError(f"lora_config row {row}: layer {layer} {name} is given twice")
        flat = w[row].astype(np.float32)
        a, b = flat[:rank * in_n].reshape(rank, in_n), flat[rank * in_n:rank * (in_n + out_n)].reshape(out_n, rank)
        for n, start, size in zip(split, np.cumsum([0, *outs[:-1]]), outs):
            parts[(layer, n)] = (a, b[start:start + size])
    if any(not np.isfinite(a).all() or not np.isfinite(b).all() for a, b in parts.values()):
        raise LoraError("lora_weights holds NaN or infinite values")
    return LoraAdapter(task_id, f"lora_weights of task {task_id}", parts, spec)


class LoraLoader:
    """Loads adapters on one background thread; ``submit`` answers a Future of a LoraAdapter (not yet placed)."""

    def __init__(self, spec: ModelSpec, root: str | None) -> None:
        self.spec = spec
        self.root = root
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._loading: dict[tuple[int, str], Future] = {}

    def check(self, task_id: int | None, source: LoraSource) -> str:
        """The label of a request's source, refused at once (LoraError) when it cannot be served: no task id, a
        path outside lora_root, both a path and tensors, tensors without their pair."""
        if task_id is None:
            raise LoraError("lora_path / lora_weights need lora_task_id (the id the adapter is cached under)")
        if source.path is not None:
            if source.weights is not None or source.config is not None:
                raise LoraError("send lora_path or lora_weights + lora_config, not both")
            return os.path.relpath(confine(self.root, source.path), os.path.realpath(self.root))
        if source.weights is None or source.config is None:
            raise LoraError("lora_weights and lora_config come together")
        return f"lora_weights of task {task_id}"

    def submit(self, task_id: int, source: LoraSource) -> Future:
        label = self.check(task_id, source)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="lora-load")
            if source.path is None:
                return self._pool.submit(from_nvidia, task_id, source.weights, source.config, self.spec)
            key = (task_id, label)
            fut = self._loading.get(key)
            if fut is not None:
                return fut
            fut = self._pool.submit(LoraAdapter.from_peft, task_id, confine(self.root, source.path), self.spec, label)
            self._loading[key] = fut
        # outside the lock: a load already done runs the callback here, and it takes the lock
        fut.add_done_callback(lambda _f, key=key: self._forget(key))
        return fut

    def _forget(self, key) -> None:
        with self._lock:
            self._loading.pop(key, None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
