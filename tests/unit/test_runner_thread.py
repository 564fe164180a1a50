"""The engine's torch work stays on one thread: the runner that serves builds its engine on its own thread.

Why it matters (engine/runner.py): libgomp cuts barrier spinning to ~100 iterations once its threads outnumber
the CPUs, so an engine loaded on one thread and stepped on another sleeps and wakes through the kernel at every
barrier of every step (SmolLM2-135M on 2 cores: 14 ms a decode step instead of 7). The measurable sign is the
process's voluntary context switches while the runner thread runs parallel torch work: ~2 per parallel region
with two OpenMP teams, ~0 with one. Each check runs in a fresh interpreter: pytest's main thread has its team.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.runner import EngineRunner

REGIONS = 300  # parallel regions the probe runs on the runner thread

PROBE = textwrap.dedent("""
    import json, os, sys, threading
    import torch

    def switches():
        n = 0
        for t in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{t}/status") as f:
                n += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        return n

    def regions(_engine=None):
        x = torch.ones(1 << 20)
        for _ in range(REGIONS):
            x.add(1.0)  # one at::parallel_for over the team

    def on_runner(runner):
        runner.call(regions).result()  # the runner thread's team exists and is warm
        before = switches()
        runner.call(regions).result()
        return switches() - before
""").replace("REGIONS", str(REGIONS))


def _run(code: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(os.cpu_count())}  # two teams of them always outnumber the CPUs
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    out = subprocess.run([sys.executable, "-c", PROBE + textwrap.dedent(code)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _copy_into_checkout(ckpt: str, root) -> None:
    """A checkout whose tensorrt_llm model folder reads ../../build/model (paths are confined to the checkout)."""
    (root / "model_repository" / "tensorrt_llm").mkdir(parents=True)
    shutil.copytree(ckpt, root / "build" / "model")


def test_launch_builds_on_the_runner_thread_and_raises_what_build_raises(llama_ckpt):
    built_on = []

    def build():
        built_on.append(threading.current_thread())
        return LLMEngine(llama_ckpt, EngineConfig(block_size=4, max_kv_tokens=256, max_num_tokens=32))

    runner = EngineRunner.launch(build, lambda out: None)
    try:
        assert built_on == [runner._thread] and runner._thread is not threading.current_thread()
        assert runner.call(lambda engine: threading.current_thread()).result(30) is runner._thread
    finally:
        runner.shutdown(5)

    with pytest.raises(FileNotFoundError, match="nowhere"):
        EngineRunner.launch(lambda: LLMEngine("/nowhere", EngineConfig()), lambda out: None)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: no OpenMP team to speak of")
def test_served_engine_runs_its_barriers_spinning_not_sleeping(llama_ckpt, tmp_path):
    """build_engine_backend (the tensorrt_llm model's engine, a request with a wide embedding bias submitted from the
    main thread as Triton's execute thread does) and, for contrast, an engine built on the main thread after it ran
    parallel work and then stepped on a runner thread: the second pays ~2 switches a region."""
    _copy_into_checkout(llama_ckpt, tmp_path)
    args = {"model_repository": str(tmp_path / "model_repository" / "tensorrt_llm"), "model_config": "{}"}
    served = _run(f"""
        from tritonllm.serving.engine_backend import build_engine_backend
        backend = build_engine_backend({args!r}, {{"gpt_model_path": "../../build/model",
                                                   "max_tokens_in_paged_kv_cache": "65536"}}, lambda out: None)
        import numpy as np
        from tritonllm.engine.request import SamplingParams
        bias = torch.from_numpy(np.zeros(1 << 20, np.float32))  # as llm_io makes it: no torch op
        wide = SamplingParams(max_tokens=1, embedding_bias=bias)  # checked here, then refused
        try:
            backend.submit_all([("x", [1, 2], wide)])  # on this thread, as Triton's execute thread submits
        except ValueError:
            pass
        n = on_runner(backend.start().runner)
        backend.shutdown(5)
        print(json.dumps({{"switches": n}}))
    """)
    two_teams = _run(f"""
        from tritonllm.engine.config import EngineConfig
        from tritonllm.engine.engine import LLMEngine
        from tritonllm.engine.runner import EngineRunner
        regions()  # the main thread's own team, as a load on this thread would make
        runner = EngineRunner(LLMEngine({llama_ckpt!r}, EngineConfig(max_kv_tokens=256)), lambda out: None).start()
        n = on_runner(runner)
        runner.shutdown(5)
        print(json.dumps({{"switches": n}}))
    """)
    assert two_teams["switches"] >= REGIONS, two_teams  # the probe sees the fault when it is there
    assert served["switches"] < REGIONS // 10, (served, two_teams)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: no OpenMP team to speak of")
def test_a_run_time_lora_load_starts_no_second_openmp_team(llama_ckpt, tmp_path):
    """An adapter loaded at run time (lora_path) is read and converted on the loader thread: with numpy only, since
    a torch op there above the parallel grain (this adapter's matrices are 2048 x 48) would give that thread its own
    OpenMP team and make every later step's barriers sleep."""
    from lora_helpers import make_adapter

    make_adapter(llama_ckpt, str(tmp_path / "adapters" / "big"), r=2048, alpha=2048, targets=["q_proj", "up_proj"])
    served = _run(f"""
        import threading
        from tritonllm.engine.config import EngineConfig
        from tritonllm.engine.engine import LLMEngine
        from tritonllm.engine.lora_loader import LoraSource
        from tritonllm.engine.request import SamplingParams
        from tritonllm.engine.runner import EngineRunner
        done, errors = threading.Event(), []
        def on_output(out):
            if out.finished:
                errors.append(out.error)
                done.set()
        config = EngineConfig(max_kv_tokens=256, lora_root={str(tmp_path / "adapters")!r})
        runner = EngineRunner.launch(lambda: LLMEngine({llama_ckpt!r}, config), on_output)
        runner.submit("a", [1, 2], SamplingParams(max_tokens=2, lora_task_id=3, lora_source=LoraSource(path="big")))
        assert done.wait(60) and errors == [None], errors
        n = on_runner(runner)
        runner.shutdown(5)
        print(json.dumps({{"switches": n}}))
    """)
    assert served["switches"] < REGIONS // 10, served
