"""Native CPU kernels against torch: GEMM tiles and tails, RoPE + cache write, paged decode attention,
and greedy parity with HF through both engine paths."""
import pytest
import torch
import torch.nn.functional as F

from tritonllm.engine import cpu_kernels
from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.kv_cache import kv_layout
from tritonllm.engine.kv_quant import load, store
from tritonllm.engine.linear import linear as onednn_linear
from tritonllm.engine.model import rotate_half
from tritonllm.engine.request import SamplingParams

from engine_helpers import hf_greedy, make_checkpoint, random_prompts, run_staggered

ext = cpu_kernels.load()
needs_kernel = pytest.mark.skipif(ext is None, reason="AVX2 kernel not available on this machine")


@pytest.mark.skipif(not cpu_kernels.cpu_supported(), reason="not an x86 CPU with AVX2")
def test_kernels_build_where_the_cpu_supports_them():
    """A missing compiler or ninja must fail here, not silently fall back to torch (and skip the rest)."""
    assert ext is not None, "native CPU kernels failed to build: see the warning logged by cpu_kernels.load()"


@needs_kernel
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 12, 15, 16, 33, 96])
@pytest.mark.parametrize("n,k", [(48, 64), (37, 770), (19, 7), (1, 8)])
def test_kernel_matches_torch_for_every_tile_and_tail(m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w, b = (torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g))
    ref = x.double() @ w.double().T
    tol = 1e-5 * (k ** 0.5) * 4
    torch.testing.assert_close(ext.linear(x, w), ref.float(), rtol=0, atol=tol)
    torch.testing.assert_close(ext.linear(x, w, b), (ref + b.double()).float(), rtol=0, atol=tol)


@needs_kernel
def test_kernel_refuses_what_it_cannot_compute():
    with pytest.raises(RuntimeError, match="float32"):
        ext.linear(torch.randn(2, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="x \\[M, K\\]"):
        ext.linear(torch.randn(2, 8), torch.randn(4, 9))
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.linear(torch.randn(2, 8), torch.randn(8, 4).T)
    with pytest.raises(RuntimeError, match="bias"):
        ext.linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5))


@needs_kernel
def test_dispatch_uses_kernel_for_few_rows_and_onednn_beyond():
    lin = cpu_kernels.make_linear(ext)
    assert lin is not onednn_linear
    w = torch.randn(64, 32)
    for m in (1, cpu_kernels.MAX_ROWS, cpu_kernels.MAX_ROWS + 1, 300):
        x = torch.randn(m, 32)
        torch.testing.assert_close(lin(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)
    xt = torch.randn(32, 4).T                       # non-contiguous activations are copied, not refused
    torch.testing.assert_close(lin(xt, w), F.linear(xt, w), rtol=1e-5, atol=1e-4)


def test_modes():
    cpu = torch.device("cpu")
    assert cpu_kernels.select("torch", cpu, torch.float32) is None
    assert cpu_kernels.select("auto", cpu, torch.bfloat16) is None   # fp32 kernel only
    with pytest.raises(ValueError, match="cpu_kernels must be one of"):
        cpu_kernels.select("fast", cpu, torch.float32)
    with pytest.raises(ValueError, match="needs float32"):
        cpu_kernels.select("native", cpu, torch.bfloat16)


@needs_kernel
def test_rope_store_is_bitwise_torch_rope_and_writes_the_cache():
    T, H, KVH, D, S = 5, 6, 2, 16, 40
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(T, (H + 2 * KVH) * D, generator=g)
    cos, sin = torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)
    slots = torch.tensor([3, 17, 0, 39, 8])
    kc, vc = torch.zeros(S, KVH, D), torch.zeros(S, KVH, D)
    q, k, v = qkv.view(T, H + 2 * KVH, D).split([H, KVH, KVH], dim=1)
    c, s = cos[:, None], sin[:, None]
    want_q, want_k, want_v = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s, v.clone()
    ext.rope_store(qkv, cos, sin, slots, kc, vc, H, KVH)
    assert torch.equal(qkv.view(T, -1, D)[:, :H], want_q)
    assert torch.equal(kc[slots], want_k) and torch.equal(vc[slots], want_v)
    untouched = torch.ones(S, dtype=torch.bool)
    untouched[slots] = False
    assert not kc[untouched].any() and not vc[untouched].any()
    with pytest.raises(RuntimeError, match="slot out of range"):
        ext.rope_store(qkv, cos, sin, torch.tensor([0, 1, 2, 3, S]), kc, vc, H, KVH)


@needs_kernel
def test_decode_attention_matches_sdpa_over_key_ranges_with_gqa():
    H, KVH, D, S, L = 6, 2, 16, 64, 12
    g = torch.Generator().manual_seed(2)
    kc, vc = torch.randn(S, KVH, D, generator=g), torch.randn(S, KVH, D, generator=g)
    qkv = torch.randn(4, (H + 2 * KVH) * D, generator=g)
    rows = torch.tensor([3, 0, 2])
    slots = torch.randint(0, S, (3, L), generator=g)
    lo, hi = torch.tensor([0, 4, 11]), torch.tensor([12, 9, 12])
    out = torch.full((4, H * D), float("nan"))
    ext.decode_attention(qkv, kc, vc, rows, slots, lo, hi, D ** -0.5, H, out)
    for i, r in enumerate(rows.tolist()):
        s = slots[i, lo[i]:hi[i]]
        q = qkv[r, :H * D].view(1, H, 1, D)
        k, v = kc[s].transpose(0, 1)[None], vc[s].transpose(0, 1)[None]      # [1, KVH, n, D]
        want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).view(H * D)
        torch.testing.assert_close(out[r], want, rtol=1e-5, atol=1e-5)
    assert out[1].isnan().all()                                              # rows not decoded: untouched
    with pytest.raises(RuntimeError, match="bad key range"):
        ext.decode_attention(qkv, kc, vc, rows, slots, lo, torch.tensor([12, 4, 12]), 1.0, H, out)
    with pytest.raises(RuntimeError, match="shapes disagree"):
        ext.decode_attention(qkv[:3], kc, vc, rows, slots, lo, hi, 1.0, H, out)


@needs_kernel
@pytest.mark.parametrize("kv", ["fp16", "int8"])
def test_rope_store_writes_fp16_and_int8_rows_bitwise_as_kv_quant_stores_them(kv):
    T, H, KVH, D, S = 5, 6, 2, 64, 40
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(T, (H + 2 * KVH) * D, generator=g) * 3
    cos, sin = torch.randn(T, D, generator=g), torch.randn(T, D, generator=g)
    slots = torch.tensor([3, 17, 0, 39, 8])
    dtype, width = kv_layout(kv, torch.float32, D)
    _, k, v = qkv.view(T, H + 2 * KVH, D).split([H, KVH, KVH], dim=1)
    want_k, want_v = torch.zeros(S, KVH, width, dtype=dtype), torch.zeros(S, KVH, width, dtype=dtype)
    store(want_k, slots, k * cos[:, None] + rotate_half(k) * sin[:, None], 1.0)
    store(want_v, slots, v.clone(), 1.0)
    kc, vc = torch.zeros_like(want_k), torch.zeros_like(want_v)
    ext.rope_store(qkv, cos, sin, slots, kc, vc, H, KVH)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


@needs_kernel
@pytest.mark.parametrize("kv", ["auto", "fp16", "int8"])
@pytest.mark.parametrize("H,KVH,D", [(6, 2, 16), (9, 3, 64), (4, 2, 64), (8, 2, 64), (5, 5, 32), (10, 2, 64)])
def test_decode_attention_reads_every_cache_form_as_sdpa_on_its_rows(kv, H, KVH, D):
    """Each head group size (1, 2, 3, 4 grouped; 5 and D = 16 one head at a time) over fp32, fp16 and int8 rows:
    equal to SDPA on the rows kv_quant.load reads back, to fp32 rounding."""
    S, L = 64, 40
    g = torch.Generator().manual_seed(4)
    dtype, width = kv_layout(kv, torch.float32, D)
    kc, vc = torch.zeros(S, KVH, width, dtype=dtype), torch.zeros(S, KVH, width, dtype=dtype)
    store(kc, torch.arange(S), torch.randn(S, KVH, D, generator=g), 1.0)
    store(vc, torch.arange(S), torch.randn(S, KVH, D, generator=g), 1.0)
    qkv = torch.randn(3, (H + 2 * KVH) * D, generator=g)
    rows, slots = torch.tensor([2, 0, 1]), torch.randint(0, S, (3, L), generator=g)
    lo, hi = torch.tensor([0, 7, 38]), torch.tensor([40, 30, 39])
    out = torch.empty(3, H * D)
    ext.decode_attention(qkv, kc, vc, rows, slots, lo, hi, D ** -0.5, H, out)
    for i, r in enumerate(rows.tolist()):
        s = slots[i, lo[i]:hi[i]]
        k = load(kc, s, torch.float32, 1.0).transpose(0, 1)[None]
        v = load(vc, s, torch.float32, 1.0).transpose(0, 1)[None]
        want = F.scaled_dot_product_attention(qkv[r, :H * D].view(1, H, 1, D), k, v, enable_gqa=True).view(H * D)
        torch.testing.assert_close(out[r], want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("kv", ["fp16", "int8"])
def test_native_and_torch_paths_agree_over_fp16_and_int8_kv_caches(tmp_path, kv):
    """The native decode (fused stack and per-layer path) on a half or int8 cache generates what the torch path
    generates on the same cache form, and gives every block back; the native engine did run both native kernels
    (counted), so a silent fallback to torch fails here."""
    ckpt = make_checkpoint(tmp_path, "llama")
    prompts = random_prompts(4, 212, 10, 30)
    got = {}
    for mode in ("native", "torch"):
        engine = LLMEngine(ckpt, EngineConfig(block_size=4, max_kv_tokens=1024, max_num_tokens=32, cpu_kernels=mode,
                                              kv_cache_dtype=kv))
        assert engine.kv.k[0].dtype == kv_layout(kv, torch.float32, 1)[0]
        model = engine.model
        if mode == "native":
            model.native, model.decode_stack = _Counted(model.native), _Counted(model.decode_stack)
        results, _ = run_staggered(engine, prompts, lambda i: SamplingParams(max_tokens=10, end_id=-1), 1)
        got[mode] = [results[str(i)] for i in range(len(prompts))]
        assert engine.pool.num_free == engine.pool.num_blocks
        if mode == "native":
            assert model.native.calls["rope_store"] and model.native.calls["decode_attention"], model.native.calls
            assert model.decode_stack.calls["run"], "no step ran the fused decode stack"
    assert got["native"] == got["torch"]


class _Counted:
    """Delegates to `inner`, counting the calls of each of its methods."""

    def __init__(self, inner):
        self.inner, self.calls = inner, {}

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)
        return counted


@needs_kernel
@pytest.mark.parametrize("arch,overrides", [("llama", {}), ("qwen2", {}), ("qwen3", {}),
                                            ("mistral", {"sliding_window": 8}), ("phi3", {"sliding_window": 8}),
                                            ("gemma", {})])
def test_native_and_torch_paths_both_equal_hf_greedy(tmp_path, arch, overrides):
    """Sliding window 8 < prompt lengths, so windowed decode ranges are exercised (Mistral, Phi-3)."""
    ckpt = make_checkpoint(tmp_path, arch, **overrides)
    prompts = random_prompts(5, 211, 10, 30)
    want = [hf_greedy(ckpt, p, 10) for p in prompts]
    for mode in ("native", "torch"):
        engine = LLMEngine(ckpt, EngineConfig(block_size=4, max_kv_tokens=1024, max_num_tokens=32,
                                              cpu_kernels=mode))
        assert (engine.model.native is not None) == (mode == "native")
        results, _ = run_staggered(engine, prompts, lambda i: SamplingParams(max_tokens=10, end_id=-1), 1)
        assert [results[str(i)] for i in range(len(prompts))] == want, mode


@needs_kernel
@pytest.mark.parametrize("t,d", [(1, 768), (5, 20), (17, 64)])
def test_norms_and_silu_gate_match_torch(t, d):
    g = torch.Generator().manual_seed(t * d)
    x, delta, w = torch.randn(t, d, generator=g), torch.randn(t, d, generator=g), torch.randn(d, generator=g)
    want = F.rms_norm(x, (d,), w, 1e-6)
    torch.testing.assert_close(ext.rms_norm(x, w, 1e-6), want, rtol=2e-6, atol=2e-6)
    h = x.clone()
    torch.testing.assert_close(ext.add_rms_norm(h, delta, w, 1e-5), F.rms_norm(x + delta, (d,), w, 1e-5),
                               rtol=2e-6, atol=2e-6)
    assert torch.equal(h, x + delta)                                  # the residual is updated in place
    gu = torch.cat([torch.linspace(-100, 100, t * d).view(t, d), 3 * torch.randn(t, d, generator=g)], 1)
    want = F.silu(gu[:, :d]) * gu[:, d:]
    torch.testing.assert_close(ext.silu_mul(gu), want, rtol=3e-7, atol=1e-6)
    with pytest.raises(RuntimeError, match="weight"):
        ext.rms_norm(x, torch.randn(d + 1), 1e-6)
    with pytest.raises(RuntimeError, match="residual"):
        ext.add_rms_norm(h, delta[:, 1:].contiguous(), w, 1e-6)


def test_build_dir_is_named_by_source_hash_and_drops_stale_locks(tmp_path, monkeypatch):
    import os
    import time

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    path = cpu_kernels._build_dir()
    assert path.parent == tmp_path and path.name.startswith("tritonllm_cpu_kernels-")
    fresh = path / "lock"
    fresh.touch()
    cpu_kernels._build_dir()
    assert fresh.exists()                        # a build may be running: its lock stays
    old = time.time() - cpu_kernels.STALE_LOCK_S - 1
    os.utime(fresh, (old, old))
    assert cpu_kernels._build_dir() == path and not fresh.exists()
