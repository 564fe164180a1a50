"""Greedy tokens equal HF transformers `generate`, token for token, per architecture, under batching,
staggered arrival, chunked prefill and forced preemption. Free blocks return to their initial count."""
import pytest

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.request import SamplingParams

from engine_helpers import hf_greedy, make_checkpoint, random_prompts, run_staggered

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma"]


@pytest.fixture(scope="module", params=ARCHS)
def ckpt(request, tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp(request.param), request.param)


def _check(ckpt, config, n_prompts=6, new=12, lo=3, hi=40, arrive_every=1):
    engine = LLMEngine(ckpt, config)
    initial = engine.num_free_blocks
    prompts = random_prompts(n_prompts, engine.spec.vocab_size, lo, hi)
    results, reasons = run_staggered(engine, prompts, lambda i: SamplingParams(max_tokens=new, end_id=-1),
                                     arrive_every)
    for i, p in enumerate(prompts):
        assert results[str(i)] == hf_greedy(ckpt, p, new), f"prompt {i} diverged"
        assert reasons[str(i)] == "length"
    assert engine.num_free_blocks == initial
    return engine


def test_batched_staggered(ckpt):
    _check(ckpt, EngineConfig(block_size=4, max_kv_tokens=4096, max_num_tokens=256), arrive_every=2)


def test_chunked_prefill(ckpt):
    # budget 7 < prompt lengths: prompts are prefilled in chunks next to running decodes
    _check(ckpt, EngineConfig(block_size=4, max_kv_tokens=4096, max_num_tokens=7), n_prompts=4)


def test_preemption(ckpt):
    # 24 blocks of 4 tokens cannot hold 6 requests of up to 52 tokens: requests are preempted and recomputed
    engine = _check(ckpt, EngineConfig(block_size=4, max_kv_tokens=96, max_num_tokens=64), hi=40)
    assert engine.num_preemptions > 0


def test_an_architecture_feature_the_engine_lacks_is_refused(tmp_path):
    """Phi-4-mini's partial rotary embedding (rotary on part of each head) is refused by Phi-3's file,
    naming the field, rather than served wrong."""
    from tritonllm.engine.hf_config import UnsupportedModelError, load_spec

    ckpt = make_checkpoint(tmp_path, "phi3", partial_rotary_factor=0.75)
    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor 0.75"):
        load_spec(ckpt)
    assert load_spec(make_checkpoint(tmp_path / "ok", "phi3")).arch.qkv == ("qkv_proj",)
    with pytest.raises(UnsupportedModelError, match="hidden_act 'relu'"):  # was served as SiLU, silently
        load_spec(make_checkpoint(tmp_path / "relu", "llama", hidden_act="relu"))
    gemma = load_spec(make_checkpoint(tmp_path / "gemma", "gemma"))
    assert (gemma.activation, gemma.norm_offset, gemma.embed_scale) == ("gelu_tanh", 1.0, 48 ** 0.5)
