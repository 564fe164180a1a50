"""Our PyTorch engine as a generator backend (``generator.GeneratorBackend``) of the ``tensorrt_llm`` model.

``build_engine_backend(args, params, on_output)`` reads the config parameters (NVIDIA's names where they
exist, ``engine.config.engine_config_from_parameters``), resolves the path parameters against the model's
directory, confined to the checkout (``paths.model_path_param``), loads ``LLMEngine`` and wraps it in an
``EngineRunner`` built and started on its own thread (``EngineRunner.launch``: one thread for all of the engine's
torch work, see runner.py; admission, abort, shutdown and the one-final-output rule are
the runner's). Iteration stats are built from the engine's last step in NVIDIA's JSON keys
(``metrics.iteration_stats``), once per new step.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

from ..engine.config import engine_config_from_parameters
from ..metrics import iteration_stats
from ..paths import model_path_param, model_path_value
from .generator import OnOutput

if TYPE_CHECKING:  # the engine (torch) is imported when an instance builds it: Triton's model-level stub only
    from ..engine.runner import EngineRunner  # completes the config from this module, and is ~3 s quicker without


def _resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class EngineBackend:
    """LLMEngine + EngineRunner behind the GeneratorBackend interface."""

    def __init__(self, runner: EngineRunner, model_path: str, default_exclude_input: bool):
        self.runner, self.engine = runner, runner.engine
        self.model_path = model_path
        self.default_exclude_input = default_exclude_input
        self._last_iteration = -1
        self._idle_reported = False

    def start(self) -> "EngineBackend":
        return self  # the runner runs since it built the engine

    def submit_all(self, requests) -> None:
        self.runner.submit_all(requests)

    def abort(self, request_id: str) -> None:
        self.runner.abort(request_id)

    def shutdown(self, timeout: float = 30.0) -> None:
        self.runner.shutdown(timeout=timeout)

    def load(self) -> tuple[int, int, float]:
        """(running, waiting, KV usage): waiting counts every admitted request not yet running, those still compiling
        their grammar or loading their adapter beside the runner included (vLLM counts those as waiting too)."""
        running, waiting, used = self.engine.load()
        return running, max(waiting, self.runner.num_unfinished() - running), used

    @property
    def stats(self):
        return self.engine.stats

    def iteration_stats(self) -> dict[str, object] | None:
        """The newest step's stats, once; then, when the engine has gone idle, one idle reading. The last step
        counts the requests it finished as active and scheduled: left as the final reading, an idle replica would
        look busy to whatever routes on these gauges (the Gateway API Inference Extension)."""
        e = self.engine
        step = e.last_step
        if step.iteration == self._last_iteration:
            running, waiting, _ = e.load()
            if self._idle_reported or running or waiting:
                return None
            self._idle_reported = True
            step = dataclasses.replace(step, timestamp=time.time(), active_requests=0, scheduled_requests=0,
                                       context_requests=0, generation_requests=0, context_tokens=0,
                                       paused_requests=0, free_blocks=e.kv_manager.num_free)
        else:
            self._last_iteration, self._idle_reported = step.iteration, False
        gpu = 0
        if e.model.device.type == "cuda":
            import torch

            gpu = torch.cuda.memory_allocated(e.model.device)
        return iteration_stats(step, e.config.max_num_seqs, e.kv_manager.num_blocks, e.config.block_size,
                               e.stats.reused_blocks, _resident_bytes(), gpu)

    def describe(self) -> list[str]:
        e = self.engine
        return [self.model_path, f"device {e.model.device}", f"dtype {e.model.dtype}", f"{e.kv_manager.num_blocks} KV blocks"]


def build_engine_backend(args: dict, params: dict[str, str], on_output: OnOutput) -> EngineBackend:
    """The engine of one model instance from its config parameters (see the module docstring)."""
    from ..engine.engine import LLMEngine
    from ..engine.lora import parse_adapter_list
    from ..engine.runner import EngineRunner

    model_path = str(model_path_param(args, params, "gpt_model_path"))
    engine_config, default_exclude_input = engine_config_from_parameters(
        params, lambda name, value: str(model_path_value(args, value, name)))
    tokenizer_dir = params.get("tokenizer_dir", "")
    if tokenizer_dir and not tokenizer_dir.startswith("${"):
        engine_config.tokenizer_dir = str(model_path_param(args, params, "tokenizer_dir", must_exist=False))
    engine_config.lora_adapters = {  # "1=../../build/models/demo-lora/x, 2=..." confined like every path
        tid: str(model_path_value(args, p, f"lora_adapters[{tid}]"))
        for tid, p in parse_adapter_list(params.get("lora_adapters", "")).items()}
    runner = EngineRunner.launch(lambda: LLMEngine(model_path, engine_config), on_output)
    return EngineBackend(runner, model_path, default_exclude_input)
