"""LoRA adapters loaded at run time through the runner, as a request names them: a PEFT folder under lora_root
(lora_path) or TensorRT-LLM's in-request lora_weights / lora_config. Greedy output equals HF transformers with
the adapter merged; loads run on the loader thread; at most max_loras stay, least recently used idle one out
first; an id is replaced only when idle, and its old KV is never served to the new adapter; paths outside
lora_root (.., absolute, symlink) are refused before anything is opened."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tritonllm.engine import lora as lora_mod
from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.lora_loader import LoraSource, confine, from_nvidia
from tritonllm.engine.request import InvalidRequest, SamplingParams
from tritonllm.engine.runner import EngineRunner

from engine_helpers import hf_greedy, make_checkpoint, random_prompts
from lora_helpers import make_adapter, merged_checkpoint

NEW = 8
NVIDIA_ID = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "o_proj": 4, "gate_proj": 5, "down_proj": 6, "up_proj": 7}


def _fp16_exact(folder: str) -> str:
    """Rounds the adapter's weights to fp16 values, so NVIDIA's fp16 tensors carry it exactly (alpha = r: scale 1)."""
    file = os.path.join(folder, "adapter_model.safetensors")
    save_file({k: v.half().float().contiguous() for k, v in load_file(file).items()}, file)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora_rt")
    base = make_checkpoint(tmp / "base", "llama")
    root = tmp / "adapters"
    adapters = {"all": _fp16_exact(make_adapter(base, str(root / "all"), r=4, alpha=4, seed=1)),
                "qv": make_adapter(base, str(root / "team" / "qv"), r=2, alpha=16, targets=["q_proj", "v_proj"], seed=2),
                "mlp": make_adapter(base, str(root / "mlp"), r=3, alpha=3, targets=["gate_proj", "down_proj"], seed=3)}
    merged = {name: merged_checkpoint(base, path, str(tmp / f"merged-{name}")) for name, path in adapters.items()}
    (tmp / "secret").mkdir()
    return base, root, adapters, merged, tmp


class Served:
    """A runner over an engine; ``run`` submits requests and waits for their final outputs."""

    def __init__(self, base, **config):
        self.engine = LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=4096, **config))
        self.outputs: dict[str, list] = {}
        self.done: dict[str, threading.Event] = {}
        self.runner = EngineRunner(self.engine, self._on).start()
        self.n = 0

    def _on(self, out):
        self.outputs.setdefault(out.request_id, []).append(out)
        if out.finished:
            self.done[out.request_id].set()

    def submit(self, prompt, **params) -> str:
        self.n += 1
        rid = str(self.n)
        self.done[rid] = threading.Event()
        self.runner.submit(rid, prompt, SamplingParams(max_tokens=params.pop("max_tokens", NEW), end_id=-1, **params))
        return rid

    def result(self, rid):
        assert self.done[rid].wait(60), f"request {rid} never finished"
        outs = self.outputs[rid]
        return [t for o in outs for t in o.new_token_ids], outs[-1]

    def run(self, prompt, **params):
        return self.result(self.submit(prompt, **params))

    def close(self):
        self.runner.shutdown(5)


def test_adapters_by_path_equal_hf_merged_and_load_off_the_engine_thread(setup, monkeypatch):
    base, root, adapters, merged, _ = setup
    threads = []
    real = lora_mod.LoraAdapter.from_peft.__func__

    def spy(cls, *a, **kw):
        threads.append(threading.current_thread().name)
        return real(cls, *a, **kw)

    monkeypatch.setattr(lora_mod.LoraAdapter, "from_peft", classmethod(spy))
    s = Served(base, lora_root=str(root), max_loras=2)
    try:
        prompt = random_prompts(1, s.engine.spec.vocab_size, 9, 9, seed=3)[0]
        rids = {name: s.submit(prompt, lora_task_id=10 + i, lora_source=LoraSource(path=path))
                for i, (name, path) in enumerate((("all", "all"), ("qv", "team/qv")))}
        base_rid = s.submit(prompt)
        for name, rid in rids.items():
            ids, last = s.result(rid)
            assert last.error is None and ids == hf_greedy(merged[name], prompt, NEW), name
        assert s.result(base_rid)[0] == hf_greedy(base, prompt, NEW)
        assert threads and set(threads) == {"lora-load_0"}, threads  # never the engine thread
        # the id alone serves the loaded adapter, with no load
        assert s.run(prompt, lora_task_id=10)[0] == hf_greedy(merged["all"], prompt, NEW)
        assert len(threads) == 2
        # a third adapter evicts the least recently used idle one (11: 10 was used last)
        ids, _ = s.run(prompt, lora_task_id=12, lora_source=LoraSource(path="./mlp/"))
        assert ids == hf_greedy(merged["mlp"], prompt, NEW)
        assert list(s.engine.lora.loaded) == [10, 12]
        with pytest.raises(InvalidRequest, match="LoRA task 11 not found in cache. Please send LoRA weights"):
            s.submit(prompt, lora_task_id=11)  # evicted: refused at once, in NVIDIA's words
        assert s.run(prompt, lora_task_id=11, lora_source=LoraSource(path="team/qv"))[0] == hf_greedy(
            merged["qv"], prompt, NEW)
        assert list(s.engine.lora.loaded) == [12, 11]
        assert s.engine.num_free_blocks == s.engine.kv_manager.num_blocks
    finally:
        s.close()


def _nvidia(folder: str, spec) -> tuple[np.ndarray, np.ndarray]:
    """NVIDIA's hf_lora_convert.py layout, written here from its description: per (module, layer) a row of
    A [r, in] then B * alpha / r [out, r], flattened row-major, zero-padded; config rows (module id, layer, r)."""
    import json

    cfg = json.load(open(os.path.join(folder, "adapter_config.json")))
    scale = cfg["lora_alpha"] / cfg["r"]
    w = load_file(os.path.join(folder, "adapter_model.safetensors"))
    rows, conf = [], []
    for key in sorted(k for k in w if "lora_A" in k):
        layer = int(key.split("layers.")[1].split(".")[0])
        module = key.split(".lora_A")[0].rsplit(".", 1)[1]
        a, b = w[key], w[key.replace("lora_A", "lora_B")] * scale
        rows.append(torch.cat([a.reshape(-1), b.reshape(-1)]))
        conf.append([NVIDIA_ID[module], layer, a.shape[0]])
    width = max(r.numel() for r in rows)
    weights = torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows]).half().numpy()
    return weights, np.array(conf, np.int32)


def test_nvidia_in_request_weights_equal_hf_merged(setup):
    base, root, adapters, merged, _ = setup
    s = Served(base)  # no lora_root: in-request tensors need none
    try:
        prompt = random_prompts(1, s.engine.spec.vocab_size, 7, 7, seed=4)[0]
        weights, config = _nvidia(adapters["all"], s.engine.spec)
        ids, last = s.run(prompt, lora_task_id=3, lora_source=LoraSource(weights=weights, config=config))
        assert last.error is None and ids == hf_greedy(merged["all"], prompt, NEW)
        # TensorRT-LLM's cache semantics: weights sent again for a cached id are ignored; the id alone serves
        assert s.run(prompt, lora_task_id=3, lora_source=LoraSource(weights=weights * 0, config=config))[0] == ids
        assert s.run(prompt, lora_task_id=3)[0] == ids
        _, last = s.run(prompt, lora_task_id=4, lora_source=LoraSource(weights=weights[:, :5], config=config))
        assert last.error_code == "INVALID_ARG" and "lora_config row 0: rank 4" in last.error
        with pytest.raises(InvalidRequest, match="lora_path: adapters are not loaded by path on this server"):
            s.submit(prompt, lora_task_id=5, lora_source=LoraSource(path="all"))
        with pytest.raises(InvalidRequest, match="need lora_task_id"):
            s.submit(prompt, lora_source=LoraSource(weights=weights, config=config))
    finally:
        s.close()


def test_fused_qkv_module_is_q_k_v_with_one_in_weight(setup):
    base, *_ = setup
    spec = LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=64)).spec
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, h)), rng.standard_normal((q + 2 * kv, 2))
    fused = from_nvidia(1, np.concatenate([a.ravel(), b.ravel()])[None].astype(np.float16),
                        np.array([[0, 1, 2]], np.int32), spec)
    rows = [np.concatenate([a.ravel(), part.ravel()]) for part in (b[:q], b[q:q + kv], b[q + kv:])]
    width = max(len(r) for r in rows)
    split = from_nvidia(1, np.stack([np.pad(r, (0, width - len(r))) for r in rows]).astype(np.float16),
                        np.array([[1, 1, 2], [2, 1, 2], [3, 1, 2]], np.int32), spec)
    for x, y in zip(fused._host[1]["qkv"], split._host[1]["qkv"]):
        np.testing.assert_array_equal(x, y)
    assert fused.root == split.root


def test_an_id_is_replaced_only_when_idle_and_its_old_kv_is_never_served(setup):
    base, root, adapters, merged, _ = setup
    s = Served(base, lora_root=str(root), max_loras=1, enable_prefix_caching=True)
    try:
        prompt = random_prompts(1, s.engine.spec.vocab_size, 21, 21, seed=6)[0]
        long = s.submit(prompt, lora_task_id=5, lora_source=LoraSource(path="all"), max_tokens=400)
        s.result(s.submit(prompt[:3], lora_task_id=5, lora_source=LoraSource(path="all")))  # shares or reuses the load
        _, last = s.run(prompt, lora_task_id=5, lora_source=LoraSource(path="mlp"))
        assert last.error_code == "INVALID_ARG" and "serves all to requests in flight" in last.error
        _, last = s.run(prompt, lora_task_id=6, lora_source=LoraSource(path="mlp"))
        assert last.error_code == "UNAVAILABLE" and "max_loras" in last.error  # the one slot is busy
        assert s.result(long)[1].error is None
        hits = s.engine.scheduler.prefix_hits
        ids, last = s.run(prompt, lora_task_id=5, lora_source=LoraSource(path="mlp"))
        assert last.error is None and ids == hf_greedy(merged["mlp"], prompt, NEW)
        assert s.engine.scheduler.prefix_hits == hits  # the blocks `long` cached under the old adapter: not reused
        assert s.run(prompt, lora_task_id=5)[0] == ids and s.engine.scheduler.prefix_hits > hits  # its own: reused
    finally:
        s.close()


def test_an_evicted_or_replaced_adapters_cached_blocks_are_purged(setup):
    """Its blocks could never be matched again (their chain starts at its root): they leave the prefix cache at
    once, announced to KV event listeners (Dynamo's router), idle ones first in line for reuse."""
    base, root, *_ = setup
    s = Served(base, lora_root=str(root), max_loras=1, enable_prefix_caching=True)
    events = []
    s.engine.kv_manager.subscribe(events.append)
    try:
        pool = s.engine.kv_manager.pool
        prompt = random_prompts(1, s.engine.spec.vocab_size, 21, 21, seed=7)[0]
        assert s.run(prompt)[1].error is None  # the base model's blocks: never purged
        base_blocks = set(pool._hash_of)
        mine = []
        for tid, path in ((5, "all"), (5, "mlp"), (6, "team/qv")):  # a replacement, then an eviction
            assert s.run(prompt, lora_task_id=tid, lora_source=LoraSource(path=path))[1].error is None
            mine.append({b for b, r in pool._root_of.items() if r == s.engine.lora.get(tid).root})
            assert len(mine[-1]) == (len(prompt) + NEW - 1) // 4  # full blocks of prompt and output
            assert {pool._hash_of[b] for b in mine[-1]} <= {e[1] for e in events if e[0] == "stored"}
        assert len([e for e in events if e[0] == "removed"]) == len(mine[0]) + len(mine[1])  # (6, qv)'s stay
        assert set(pool._root_of) == mine[2] and set(pool._hash_of) == base_blocks | mine[2]
        assert mine[0] == mine[1] == mine[2]  # the purged blocks, idle, were the first taken
    finally:
        s.close()


def test_paths_outside_lora_root_are_refused_before_opening(setup):
    base, root, _, _, tmp = setup
    (root / "escape").symlink_to(tmp / "secret") if not (root / "escape").exists() else None
    for bad in ("../secret", str(tmp / "secret"), "escape", "team/../../secret", "", ".", "a\x00b"):
        with pytest.raises(InvalidRequest) as e:
            confine(str(root), bad)
        assert "lora_path" in str(e.value)
        assert bad == str(tmp / "secret") or str(tmp / "secret") not in str(e.value)  # never where a link leads
    assert confine(str(root), "team/qv") == os.path.realpath(root / "team" / "qv")
    assert confine(str(root), str(root / "all")) == os.path.realpath(root / "all")  # absolute, inside: allowed
    s = Served(base, lora_root=str(root))
    try:
        with pytest.raises(InvalidRequest, match="not a folder inside lora_root"):
            s.submit([1, 2, 3], lora_task_id=9, lora_source=LoraSource(path="../secret"))
        _, last = s.run([1, 2, 3], lora_task_id=9, lora_source=LoraSource(path="missing"))
        assert last.error_code == "INVALID_ARG" and "LoRA adapter folder 'missing' has no adapter_config.json" in last.error
        assert str(root) not in last.error  # the client's own path, not the server's
    finally:
        s.close()


def test_a_load_done_before_its_callback_is_registered_does_not_deadlock(setup):
    """A load that fails at once (a missing folder) may be done before submit registers its callback, which then
    runs on the submitting thread: it must not wait for the lock submit holds (it did: a hang)."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from tritonllm.engine.lora_loader import LoraLoader

    base, root, *_ = setup
    loader = LoraLoader(LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=64)).spec, str(root))
    done: Future = Future()
    done.set_exception(lora_mod.LoraError("gone"))
    loader._pool = SimpleNamespace(submit=lambda *a, **k: done)
    got = []
    t = threading.Thread(target=lambda: got.append(loader.submit(9, LoraSource(path="missing"))), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive() and got == [done] and not loader._loading
