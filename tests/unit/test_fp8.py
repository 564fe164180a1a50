"""FP8 weights and KV cache: 1 byte per KV element, close to full precision (bounded logit error, high
greedy agreement), same block accounting, nothing leaked."""
import pytest
import torch

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.fp8 import FP8Weight, load, store
from tritonllm.engine.request import SamplingParams

from engine_helpers import make_checkpoint, random_prompts, run_staggered


def test_fp8_weight_roundtrip_is_per_channel():
    torch.manual_seed(0)
    w = torch.randn(64, 32) * torch.logspace(-3, 1, 64)[:, None]   # rows of very different ranges
    q = FP8Weight(w)
    rel = ((q.dequant(torch.float32) - w).abs().amax(1) / w.abs().amax(1))
    assert rel.max() < 0.07                                          # e4m3: 3 mantissa bits
    assert q.nbytes == 64 * 32 + 64 * 4


def test_fp8_kv_store_and_load():
    cache = torch.zeros(16, 2, 4, dtype=torch.uint8)
    x = torch.randn(3, 2, 4)
    store(cache, torch.tensor([1, 5, 7]), x, 1.0)
    back = load(cache, torch.tensor([5, 1]), torch.float32, 1.0)
    assert torch.allclose(back[0], x[1], rtol=0.07, atol=1e-2) and torch.allclose(back[1], x[0], rtol=0.07, atol=1e-2)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


def test_fp8_engine_agrees_with_full_precision(ckpt):
    prompts = random_prompts(4, 211, 5, 30, seed=21)
    params = lambda i: SamplingParams(max_tokens=16, end_id=-1)  # noqa: E731
    cfg = dict(block_size=4, max_kv_tokens=1024)
    full = LLMEngine(ckpt, EngineConfig(**cfg))
    fp8 = LLMEngine(ckpt, EngineConfig(quantization="fp8", kv_cache_dtype="fp8", **cfg))
    assert fp8.kv_bytes_per_token * 4 == full.kv_bytes_per_token  # fp32 -> fp8
    assert fp8.kv.k[0].element_size() == 1
    a, _ = run_staggered(full, prompts, params)
    b, _ = run_staggered(fp8, prompts, params)
    # A random tiny model is chaotic: once one near-tie flips, the rest of a greedy run differs. The first
    # token (same context for both) must mostly agree; benchmarks/bench_fp8.py measures the trained model.
    first = sum(a[i][0] == b[i][0] for i in a)
    assert first >= 3, (a, b)
    assert fp8.num_free_blocks == fp8.pool.num_blocks
