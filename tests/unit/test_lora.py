"""Multi-LoRA: each request's greedy output equals HF transformers with its adapter merged (peft's
merge_and_unload), with base and several adapters mixed in one batch, through chunked prefill, prefix
caching and speculative decoding. Bad adapters and unknown ids are refused, naming what was wrong."""
import json
import os

import pytest

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.lora import LoraError, parse_adapter_list
from tritonllm.engine.request import InvalidRequest, SamplingParams

from engine_helpers import hf_greedy, make_checkpoint, random_prompts, run_staggered
from lora_helpers import make_adapter, merged_checkpoint

NEW = 10


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = make_checkpoint(root / "base", "llama")
    adapters = {
        1: make_adapter(base, str(root / "all"), r=4, alpha=8, seed=1),
        2: make_adapter(base, str(root / "qv"), r=2, alpha=16, targets=["q_proj", "v_proj"], seed=2),
        3: make_adapter(base, str(root / "mlp"), r=3, alpha=3, targets=["gate_proj", "down_proj"], seed=3,
                        rslora=True),
    }
    merged = {None: base}
    merged.update({tid: merged_checkpoint(base, p, str(root / f"merged{tid}")) for tid, p in adapters.items()})
    return base, adapters, merged


def _expected(merged, prompts, ids):
    return [hf_greedy(merged[tid], p, NEW) for p, tid in zip(prompts, ids)]


def _run(engine, prompts, ids, arrive_every=1, **kw):
    params = lambda i: SamplingParams(max_tokens=NEW, end_id=-1, lora_task_id=ids[i], **kw)  # noqa: E731
    results, _ = run_staggered(engine, prompts, params, arrive_every)
    return [results[str(i)] for i in range(len(prompts))]


def test_each_adapter_changes_hf_greedy_output(setup):
    base, adapters, merged = setup
    prompt = random_prompts(1, 211, 12, 12, seed=5)[0]
    outs = {tid: hf_greedy(path, prompt, NEW) for tid, path in merged.items()}
    assert len({tuple(o) for o in outs.values()}) == 4, "the adapters must actually change greedy output"


@pytest.mark.parametrize("budget", [256, 7])  # 7: prompts are prefilled in chunks next to decodes
def test_mixed_batch_equals_hf_merged(setup, budget):
    base, adapters, merged = setup
    engine = LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=4096, max_num_tokens=budget,
                                          lora_adapters=adapters))
    initial = engine.num_free_blocks
    prompts = random_prompts(8, engine.spec.vocab_size, 3, 30, seed=7)
    ids = [None, 1, 2, 3, 1, None, 3, 2]
    assert _run(engine, prompts, ids) == _expected(merged, prompts, ids)
    assert engine.num_free_blocks == initial


def test_prefix_cache_is_per_adapter(setup):
    """The same prompt under different adapters must not share KV blocks; the same adapter does."""
    base, adapters, merged = setup
    engine = LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=4096, enable_prefix_caching=True,
                                          lora_adapters=adapters))
    prompt = random_prompts(1, engine.spec.vocab_size, 25, 25, seed=9)[0]
    order = [None, 1, 2, 1, None]
    outs = [_run(engine, [prompt], [tid])[0] for tid in order]
    assert outs == _expected(merged, [prompt] * len(order), order)
    # hits only for the repeated (prompt, adapter) pairs: requests 4 and 5 reuse 6 full blocks each
    assert engine.scheduler.prefix_hits == 2 * 24


def test_speculative_decoding_with_adapters(setup):
    base, adapters, merged = setup
    engine = LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=4096, max_draft_len=4,
                                          lora_adapters=adapters))
    prompts = [p * 3 for p in random_prompts(4, engine.spec.vocab_size, 4, 6, seed=11)]  # n-gram matches
    ids = [1, 2, None, 3]
    assert _run(engine, prompts, ids) == _expected(merged, prompts, ids)
    assert engine.stats.draft_tokens > 0


def test_unknown_adapter_is_invalid(setup):
    base, adapters, _ = setup
    engine = LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=256, lora_adapters={1: adapters[1]}))
    with pytest.raises(InvalidRequest, match=r"lora_task_id 7 is not a loaded adapter \(loaded: \[1\]\)"):
        engine.add_request("x", [5, 6], SamplingParams(lora_task_id=7))
    no_lora = LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=256))
    with pytest.raises(InvalidRequest, match="loaded: none"):
        no_lora.add_request("x", [5, 6], SamplingParams(lora_task_id=1))


def _copy_adapter(src, dst, **cfg_changes):
    os.makedirs(dst)
    with open(os.path.join(src, "adapter_config.json")) as f:
        cfg = json.load(f)
    cfg.update(cfg_changes)
    with open(os.path.join(dst, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    return dst


@pytest.mark.parametrize("change, message", [
    (dict(use_dora=True), "unsupported LoRA settings.*use_dora"),
    (dict(target_modules=["q_proj", "lm_head"]), "unsupported LoRA settings.*lm_head"),
    (dict(peft_type="IA3"), "peft_type 'IA3' is not LORA"),
    (None, "has no adapter_model.safetensors"),
])
def test_bad_adapters_are_refused_naming_the_file(setup, tmp_path, change, message):
    base, adapters, _ = setup
    bad = _copy_adapter(adapters[1], str(tmp_path / "bad"), **(change or {}))
    if change is not None:
        with open(os.path.join(adapters[1], "adapter_model.safetensors"), "rb") as f, \
                open(os.path.join(bad, "adapter_model.safetensors"), "wb") as g:
            g.write(f.read())
    with pytest.raises(LoraError, match=message) as e:
        LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=256, lora_adapters={1: bad}))
    assert "bad" in str(e.value)


def test_adapter_for_another_model_is_refused(setup, tmp_path):
    base, _, _ = setup
    other = make_checkpoint(tmp_path / "other", "llama", hidden_size=32, num_attention_heads=4)
    adapter = make_adapter(other, str(tmp_path / "other-lora"), targets=["q_proj"])
    with pytest.raises(LoraError, match=r"q_proj has lora_A \[4, 32\].*needs \[r, 48\]"):
        LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=256, lora_adapters={1: adapter}))


def test_parse_adapter_list():
    assert parse_adapter_list(" 1=a/b, 22 = /abs/c ,") == {1: "a/b", 22: "/abs/c"}
    assert parse_adapter_list("") == {} and parse_adapter_list("${lora_adapters}") == {}
    for bad in ("1", "x=a", "0=a", "1=a,1=b", "1="):
        with pytest.raises(ValueError):
            parse_adapter_list(bad)


def test_phi3_adapters_target_its_fused_projections(tmp_path):
    """Phi-3 stores q/k/v as one qkv_proj and gate/up as one gate_up_proj: PEFT adapters name those, and the
    engine's output under the adapter equals HF's on the merged checkpoint."""
    base = make_checkpoint(tmp_path / "phi3", "phi3")
    adapter = make_adapter(base, str(tmp_path / "a"), targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    merged = merged_checkpoint(base, adapter, str(tmp_path / "m"))
    engine = LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=4096, lora_adapters={1: adapter}))
    prompts = random_prompts(3, engine.spec.vocab_size, 5, 20, seed=3)
    assert _run(engine, prompts, [1, None, 1]) == _expected({1: merged, None: base}, prompts, [1, None, 1])
    with pytest.raises(LoraError, match="q_proj"):  # a Llama-style adapter does not fit Phi-3's projections
        LLMEngine(base, EngineConfig(block_size=4, max_kv_tokens=4096, lora_adapters={2: make_adapter(
            make_checkpoint(tmp_path / "llama", "llama"), str(tmp_path / "b"))}))
