"""AWQ (AutoAWQ GEMM) and GPTQ (v1, with and without act order) checkpoints: written here by our own packer
after the formats' published layouts, read back by engine/quant_formats.py, checked element by element
against a second, naive dequantizer that follows the same published layout bit by bit, and served by the
engine token for token as transformers serves the dequantized weights."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.quant import Int8Weight
from tritonllm.engine.quant_formats import AWQ_ORDER, load_prequantized
from tritonllm.engine.request import SamplingParams

from engine_helpers import hf_greedy, make_checkpoint

SHAPE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
GROUP = 32
PROMPT = [5, 17, 33, 8, 90, 41, 7, 12, 150, 3]


def _serve(path: str, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of the engine on the dequantized float path (cpu_kernels torch); every block back."""
    eng = LLMEngine(path, EngineConfig(max_kv_tokens=256, cpu_kernels="torch"))
    eng.add_request("r", prompt, SamplingParams(max_tokens=n, end_id=-1))
    out = []
    while eng.has_work():
        for o in eng.step():
            out += o.new_token_ids
    assert eng.pool.num_free == eng.pool.num_blocks
    return out


def _rtn(w: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric round to nearest over groups of input columns `cols` [groups, GROUP]: codes [out, in]
    (at the model's input positions), scales and zero points [out, groups]."""
    out, k = w.shape
    g = w[:, cols]                                                          # [out, groups, GROUP]
    lo, hi = g.amin(dim=2).clamp(max=0), g.amax(dim=2).clamp(min=0)
    s = ((hi - lo) / 15).clamp(min=1e-8).half().float()                     # the checkpoints store fp16 scales
    z = torch.round(-lo / s).clamp(0, 15)
    q = torch.round(g / s[..., None] + z[..., None]).clamp(0, 15)
    codes = torch.empty(out, k)
    codes[:, cols.reshape(-1)] = q.reshape(out, -1)
    return codes.to(torch.int64), s, z


def _pack_cols(v: torch.Tensor, order=tuple(range(8))) -> torch.Tensor:
    """[rows, 8c] -> int32 [rows, c]: nibble i of column c holds v[:, 8c + order[i]]."""
    out = torch.zeros(v.shape[0], v.shape[1] // 8, dtype=torch.int64)
    for i, o in enumerate(order):
        out |= v[:, o::8] << (4 * i)
    return out.to(torch.int32)


def pack_awq(w: torch.Tensor) -> dict:
    cols = torch.arange(w.shape[1]).reshape(-1, GROUP)
    codes, s, z = _rtn(w, cols)
    return {"qweight": _pack_cols(codes.t(), AWQ_ORDER), "qzeros": _pack_cols(z.to(torch.int64).t(), AWQ_ORDER),
            "scales": s.t().half().contiguous()}


def pack_gptq(w: torch.Tensor, act_order: bool, seed: int = 0) -> dict:
    k = w.shape[1]
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed)) if act_order else torch.arange(k)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // GROUP).to(torch.int32)
    codes, s, z = _rtn(w, perm.reshape(-1, GROUP))
    rows = codes.t()                                                        # [in, out]
    qweight = torch.zeros(k // 8, w.shape[0], dtype=torch.int64)
    for j in range(8):
        qweight |= rows[j::8] << (4 * j)
    return {"qweight": qweight.to(torch.int32), "qzeros": _pack_cols((z - 1).to(torch.int64).t()),
            "scales": s.t().half().contiguous(), "g_idx": g_idx}


def naive_dequant(t: dict, method: str, out: int, k: int) -> torch.Tensor:
    """Element by element from the packed ints, as the layouts are published."""
    nib = lambda word, i: (int(word) >> (4 * i)) & 0xF  # noqa: E731
    w = torch.empty(out, k)
    inv = {o: i for i, o in enumerate(AWQ_ORDER)}
    for o in range(out):
        for i in range(k):
            if method == "awq":
                q = nib(t["qweight"][i, o // 8], inv[o % 8])
                g = i // GROUP
                z = nib(t["qzeros"][g, o // 8], inv[o % 8])
            else:
                q = nib(t["qweight"][i // 8, o], i % 8)
                g = int(t["g_idx"][i])
                z = nib(t["qzeros"][g, o // 8], o % 8) + 1
            w[o, i] = (q - z) * float(t["scales"][g, o])
    return w


@pytest.mark.parametrize("method,act_order", [("awq", False), ("gptq", False), ("gptq", True)])
def test_unpacked_weights_equal_the_naive_dequantizer(method, act_order):
    torch.manual_seed(3)
    w = torch.randn(24, 64) * 0.1
    t = pack_awq(w) if method == "awq" else pack_gptq(w, act_order)
    qcfg = {"quant_method": method, "bits": 4, "group_size": GROUP}
    got = load_prequantized({f"m.q_proj.{n}": v for n, v in t.items()}, qcfg)["m.q_proj.weight"]
    ref = naive_dequant(t, method, 24, 64)
    assert torch.equal(got.dequant(), ref)
    assert (got.dequant() - w).abs().max() <= got.d.max() / 2 + 1e-4       # and it is w, to half a step
    assert (got.perm is not None) == act_order
    x = torch.randn(3, 64)
    assert torch.allclose(got.matmul(x, None), x @ ref.t(), atol=1e-5)    # the float path (no native set)


@pytest.mark.parametrize("qcfg,field", [
    ({"quant_method": "bitsandbytes", "bits": 4}, "quant_method"),
    ({"quant_method": "gptq", "bits": 8}, "bits"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "version"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2"}, "checkpoint_format"),
])
def test_unknown_layouts_are_refused_by_field(qcfg, field):
    with pytest.raises(ValueError, match=f"quantization_config.{field}"):
        load_prequantized({}, qcfg)


def _write_quantized(src: str, dst: Path, method: str, act_order: bool) -> tuple[str, str]:
    """(quantized checkpoint, float checkpoint of the same dequantized weights)."""
    tensors = load_file(str(Path(src) / "model.safetensors"))
    quant, ref = {}, {}
    for name, t in tensors.items():
        if name.endswith("_proj.weight"):
            packed = pack_awq(t) if method == "awq" else pack_gptq(t, act_order, seed=len(name))
            base = name[: -len(".weight")]
            quant.update({f"{base}.{k}": v for k, v in packed.items()})
            one = load_prequantized({f"{base}.{k}": v for k, v in packed.items()},
                                    {"quant_method": method, "bits": 4, "group_size": GROUP})[name]
            ref[name] = one.dequant()
        else:
            quant[name] = t
            ref[name] = Int8Weight(t).dequant() if name == "lm_head.weight" else t  # the engine's int8 LM head
    out = {}
    for kind, tensors_out in (("quant", quant), ("ref", ref)):
        d = dst / kind
        d.mkdir(parents=True)
        for f in Path(src).iterdir():
            if f.name != "model.safetensors":
                shutil.copy(f, d / f.name)
        save_file(tensors_out, str(d / "model.safetensors"))
        out[kind] = str(d)
    cfg = json.loads((Path(out["quant"]) / "config.json").read_text())
    cfg["quantization_config"] = ({"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True,
                                   "version": "gemm"} if method == "awq" else
                                  {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": act_order,
                                   "sym": False, "checkpoint_format": "gptq"})
    (Path(out["quant"]) / "config.json").write_text(json.dumps(cfg))
    return out["quant"], out["ref"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama", **SHAPE)


@pytest.mark.parametrize("method,act_order", [("awq", False), ("gptq", True)])
def test_engine_serves_the_checkpoint_as_hf_serves_its_dequantized_weights(ckpt, tmp_path, method, act_order):
    quant, ref = _write_quantized(ckpt, tmp_path, method, act_order)
    assert _serve(quant, PROMPT, 12) == hf_greedy(ref, PROMPT, 12)
    with pytest.raises(ValueError, match="quantization must be none or int4"):
        LLMEngine(quant, EngineConfig(max_kv_tokens=256, quantization="int8"))


@pytest.mark.skipif(not __import__("tritonllm.engine.cpu_kernels", fromlist=["x"]).cpu_supported(),
                    reason="native CPU kernels need x86 AVX2")
def test_act_order_shared_by_fused_projections_runs_on_the_native_kernel(tmp_path):
    """GPTQ's act order comes from the layer input's statistics, so q/k/v (and gate/up) share it: they fuse
    into one Int4Weight whose activations are permuted before the int8 dot products."""
    torch.manual_seed(5)
    ws = [torch.randn(n, 64) * 0.1 for n in (32, 16, 16)]
    parts = [load_prequantized({f"m.{p}.{k}": v for k, v in pack_gptq(w, True, seed=9).items()},
                               {"quant_method": "gptq", "bits": 4, "group_size": GROUP})[f"m.{p}.weight"]
             for p, w in zip(("q_proj", "k_proj", "v_proj"), ws)]
    from tritonllm.engine import cpu_kernels
    from tritonllm.engine.quant import Int4Weight

    fused = Int4Weight.cat(parts)
    assert isinstance(fused, Int4Weight) and fused.perm is not None
    fused.native = cpu_kernels.load()
    x = torch.randn(2, 64)
    ref = x @ torch.cat([p.dequant() for p in parts]).t()
    y = fused.matmul(x, None)
    assert float((y - ref).abs().max()) <= 0.02 * float(ref.abs().max())   # int8 activations, as elsewhere


def _compressed_tensors_checkpoint(src: str, dst: Path, symmetric: bool) -> tuple[str, dict]:
    """A pack-quantized checkpoint written by compressed-tensors itself (its ModelCompressor packs and saves;
    the round-to-nearest scales are set here, where llm-compressor's observers would calibrate them), and
    the library's own fake-quantized (dequantized) weights of every projection."""
    import transformers as tf
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 QuantizationStatus, apply_quantization_config)
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    model = tf.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=GROUP)
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)}, ignore=["lm_head"],
        quantization_status=QuantizationStatus.INITIALIZED))
    dequantized = {}
    for name, mod in model.named_modules():
        if not hasattr(mod, "weight_scale"):
            continue
        g = mod.weight.data.reshape(mod.weight.shape[0], -1, GROUP)
        if symmetric:
            s, zp = (g.abs().amax(2) / 7).clamp(min=1e-8), torch.zeros(g.shape[:2])
        else:
            lo, hi = g.amin(2).clamp(max=0), g.amax(2).clamp(min=0)
            s = ((hi - lo) / 15).clamp(min=1e-8)
            zp = torch.round(-lo / s).clamp(0, 15) - 8                     # signed domain, as the library's
        mod.weight_scale.data = s.to(mod.weight_scale.dtype)
        if hasattr(mod, "weight_zero_point"):
            mod.weight_zero_point.data = zp.to(mod.weight_zero_point.dtype)
        dequantized[f"{name}.weight"] = fake_quantize(mod.weight.data, mod.weight_scale.data,
                                                     getattr(mod, "weight_zero_point", None), args)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(str(dst))
    compressor.update_config(str(dst))
    return str(dst), dequantized


@pytest.mark.parametrize("symmetric", [False, True])
def test_compressed_tensors_pack_quantized_as_the_library_writes_and_dequantizes_it(ckpt, tmp_path, symmetric):
    pytest.importorskip("compressed_tensors")
    path, dequantized = _compressed_tensors_checkpoint(ckpt, tmp_path / "ct", symmetric)
    cfg = json.loads((Path(path) / "config.json").read_text())["quantization_config"]
    assert (cfg["quant_method"], cfg["format"]) == ("compressed-tensors", "pack-quantized")
    weights = load_prequantized(load_file(str(Path(path) / "model.safetensors")), cfg)
    for name, ref in dequantized.items():
        assert torch.allclose(weights[name].dequant(), ref, atol=1e-6), name
    # served as transformers serves the library's dequantized weights (and the engine's int8 LM head)
    ref_dir = tmp_path / "ref"
    shutil.copytree(ckpt, ref_dir)
    tensors = load_file(str(ref_dir / "model.safetensors"))
    tensors.update(dequantized)
    tensors["lm_head.weight"] = Int8Weight(tensors["lm_head.weight"]).dequant()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(ref_dir / "model.safetensors"))
    assert _serve(path, PROMPT, 12) == hf_greedy(str(ref_dir), PROMPT, 12)


def test_compressed_tensors_layouts_we_do_not_read_are_refused():
    base = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}}}
    for change, field in ((("format", "float-quantized"), "format"),
                          (("num_bits", 8), "config_groups.g.weights.num_bits"),
                          (("actorder", "group"), "config_groups.g.weights.actorder")):
        cfg = json.loads(json.dumps(base))
        if change[0] == "format":
            cfg["format"] = change[1]
        else:
            cfg["config_groups"]["g"]["weights"][change[0]] = change[1]
        with pytest.raises(ValueError, match=f"quantization_config.{field}"):
            load_prequantized({}, cfg)
