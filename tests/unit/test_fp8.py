"""FP8 weights and KV cache: 1 byte per KV element, close to full precision (bounded logit error, high
greedy agreement), same block accounting, nothing leaked."""
import pytest
import torch

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.fp8 import FP8Weight
from tritonllm.engine.kv_quant import load, store
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


def test_scaled_fp8_matmul_matches_dequant_within_fp8_error():
    """The Hopper path (activations quantized per token, torch._scaled_mm with row-wise scales), run on
    torch's CPU kernel: within FP8 rounding of the full-precision product; bias added; falls back to
    dequantizing on shapes the kernel refuses."""
    from tritonllm.engine.fp8 import scaled_linear, wants_scaled_mm
    from tritonllm.engine.linear import linear

    torch.manual_seed(0)
    w = torch.randn(48, 64) * torch.logspace(-2, 0, 48)[:, None]
    x = torch.randn(5, 64) * 3
    b = torch.randn(48)
    ref = x @ w.t() + b
    q = FP8Weight(w, scaled_mm=True)
    y = linear(x, q, b)
    assert q.scaled_mm                                  # stayed on the scaled path
    err = (y - ref).abs() / (x.abs() @ w.abs().t())     # relative to the magnitude of the dot products
    assert err.max() < 0.1 and err.mean() < 0.02
    assert torch.allclose(y, scaled_linear(x, q, b))
    assert not wants_scaled_mm("auto", torch.device("cpu")) and wants_scaled_mm("scaled", torch.device("cpu"))
    with pytest.raises(ValueError, match="fp8_matmul"):
        wants_scaled_mm("fast", torch.device("cpu"))


def test_scaled_fp8_matmul_model_stays_close_to_full_precision(ckpt):
    """Teacher-forced logits of a 30-token prompt: FP8 weights with the scaled matmul (activations rounded
    to FP8 too) stay close to fp32, a little further than FP8 weights with dequantized matmuls (measured on
    this chaotic random model: cosine 0.989 vs 0.995, argmax agreement 83% vs 87%)."""
    from tritonllm.engine.batch_layout import attention_meta
    from tritonllm.engine.kv_cache import KVCache
    from tritonllm.engine.loader import load_model

    prompt = random_prompts(1, 211, 30, 30, seed=3)[0]

    def logits(**kw):
        m = load_model(ckpt, "cpu", "float32", **kw)
        s = m.spec
        kv = KVCache(s.num_layers, 16, 4, s.num_kv_heads, s.head_dim, torch.float32, m.device)
        meta = attention_meta([(list(range(8)), 0, len(prompt))], 4, m.device)
        pos = torch.arange(len(prompt))
        return m, m.forward(torch.tensor(prompt), pos, meta, kv.k, kv.v, pos)[0]

    _, full = logits()
    model, scaled = logits(fp8_weights=True, fp8_matmul="scaled")
    assert model.layers[0].qkv.scaled_mm and model.layers[-1].down.scaled_mm
    cos = torch.nn.functional.cosine_similarity(scaled, full, dim=-1)
    assert cos.mean() > 0.98 and cos.min() > 0.95
    assert (scaled.argmax(-1) == full.argmax(-1)).float().mean() >= 0.7
