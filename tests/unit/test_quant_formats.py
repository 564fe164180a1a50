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
from tritonllm.engine.quant import Int4Weight, Int8Weight
from tritonllm.engine import quant_writer
from tritonllm.engine.quant_formats import AWQ_ORDER, load_prequantized
from tritonllm.engine.quant_writer import contiguous_groups

from engine_helpers import engine_greedy, hf_greedy, make_checkpoint

SHAPE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
GROUP = 32
PROMPT = [5, 17, 33, 8, 90, 41, 7, 12, 150, 3]


def pack_awq(w: torch.Tensor) -> dict:
    cols = contiguous_groups(w.shape[1], GROUP)
    return quant_writer.pack_awq(*quant_writer.rtn(w, cols))


def pack_gptq(w: torch.Tensor, act_order: bool, seed: int = 0, bits: int = 4, v2: bool = False) -> dict:
    k = w.shape[1]
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed)) if act_order else torch.arange(k)
    cols = perm.reshape(-1, GROUP)
    return quant_writer.pack_gptq(*quant_writer.rtn(w, cols, bits), quant_writer.g_idx_of(cols), bits, v2)


def naive_dequant(t: dict, method: str, out: int, k: int, bits: int = 4, v2: bool = False) -> torch.Tensor:
    """Element by element from the packed ints, as the layouts are published."""
    per, mask = 32 // bits, (1 << bits) - 1
    field = lambda word, i: (int(word) >> (bits * i)) & mask  # noqa: E731
    w = torch.empty(out, k)
    inv = {o: i for i, o in enumerate(AWQ_ORDER)}
    for o in range(out):
        for i in range(k):
            if method == "awq":
                q = field(t["qweight"][i, o // 8], inv[o % 8])
                g = i // GROUP
                z = field(t["qzeros"][g, o // 8], inv[o % 8])
            else:
                q = field(t["qweight"][i // per, o], i % per)
                g = int(t["g_idx"][i])
                z = field(t["qzeros"][g, o // per], o % per) + (0 if v2 else 1)
            w[o, i] = (q - z) * float(t["scales"][g, o])
    return w


@pytest.mark.parametrize("method,act_order,bits,v2", [
    ("awq", False, 4, False), ("gptq", False, 4, False), ("gptq", True, 4, False), ("gptq", True, 4, True),
    ("gptq", False, 8, False), ("gptq", True, 8, True)])
def test_unpacked_weights_equal_the_naive_dequantizer(method, act_order, bits, v2):
    torch.manual_seed(3)
    w = torch.randn(24, 64) * 0.1
    t = pack_awq(w) if method == "awq" else pack_gptq(w, act_order, bits=bits, v2=v2)
    qcfg = {"quant_method": method, "bits": bits, "group_size": GROUP}
    if v2:
        qcfg["checkpoint_format"] = "gptq_v2"
    got = load_prequantized({f"m.q_proj.{n}": v for n, v in t.items()}, qcfg)["m.q_proj.weight"]
    assert type(got) is (Int8Weight if bits == 8 else Int4Weight)
    ref = naive_dequant(t, method, 24, 64, bits, v2)
    assert torch.allclose(got.dequant(), ref, rtol=0, atol=1e-7)
    step = float(t["scales"].float().max())
    assert (got.dequant() - w).abs().max() <= step / 2 + 1e-4              # and it is w, to half a step
    assert (got.perm is not None) == act_order
    x = torch.randn(3, 64)
    assert torch.allclose(got.matmul(x, None), x @ ref.t(), atol=1e-5)    # the float path (no native set)


def test_quantized_modules_are_the_architectures_projections():
    from tritonllm.engine.models import ARCHITECTURES
    phi3 = ARCHITECTURES["Phi3ForCausalLM"].projections()
    assert phi3 == ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    t = pack_gptq(torch.randn(24, 64) * 0.1, False)
    qcfg = {"quant_method": "gptq", "bits": 4, "group_size": GROUP}
    got = load_prequantized({f"m.qkv_proj.{n}": v for n, v in t.items()}, qcfg, phi3)
    assert type(got["m.qkv_proj.weight"]) is Int4Weight
    with pytest.raises(ValueError, match="m.qkv_proj: quantized module outside"):
        load_prequantized({f"m.qkv_proj.{n}": v for n, v in t.items()}, qcfg)   # Llama's names by default


def test_gptq_v1_cannot_store_a_zero_point_of_zero():
    w = torch.rand(8, 64)                                                   # all >= 0: every zero point is 0
    cols = contiguous_groups(64, GROUP)
    with pytest.raises(ValueError, match="gptq_v2"):
        quant_writer.pack_gptq(*quant_writer.rtn(w, cols), quant_writer.g_idx_of(cols))
    t = quant_writer.pack_gptq(*quant_writer.rtn(w, cols), quant_writer.g_idx_of(cols), v2=True)
    got = load_prequantized({f"m.q_proj.{n}": v for n, v in t.items()},
                            {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "checkpoint_format": "gptq_v2"})
    assert torch.allclose(got["m.q_proj.weight"].dequant(), naive_dequant(t, "gptq", 8, 64, 4, True), atol=1e-7)


@pytest.mark.parametrize("qcfg,field", [
    ({"quant_method": "bitsandbytes", "bits": 4}, "quant_method"),
    ({"quant_method": "gptq", "bits": 3}, "bits"),
    ({"quant_method": "awq", "bits": 8}, "bits"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "version"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "checkpoint_format"),
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
    assert engine_greedy(quant, PROMPT, 12) == hf_greedy(ref, PROMPT, 12)
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


def _compressed_tensors_checkpoint(src: str, dst: Path, symmetric: bool, bits: int = 4,
                                   group: int = GROUP) -> tuple[str, dict]:
    """A pack-quantized checkpoint written by compressed-tensors itself (its ModelCompressor packs and saves;
    the round-to-nearest scales are set here, where llm-compressor's observers would calibrate them), and
    the library's own fake-quantized (dequantized) weights of every projection. group -1: per channel."""
    import transformers as tf
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 QuantizationStatus, apply_quantization_config)
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    model = tf.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    strategy = dict(strategy="channel") if group == -1 else dict(strategy="group", group_size=group)
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, **strategy)
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)}, ignore=["lm_head"],
        quantization_status=QuantizationStatus.INITIALIZED))
    qmax, half = (1 << bits) - 1, 1 << (bits - 1)
    dequantized = {}
    for name, mod in model.named_modules():
        if not hasattr(mod, "weight_scale"):
            continue
        g = mod.weight.data.reshape(mod.weight.shape[0], -1, mod.weight.shape[1] if group == -1 else group)
        if symmetric:
            s, zp = (g.abs().amax(2) / (half - 1)).clamp(min=1e-8), torch.zeros(g.shape[:2])
        else:
            lo, hi = g.amin(2).clamp(max=0), g.amax(2).clamp(min=0)
            s = ((hi - lo) / qmax).clamp(min=1e-8)
            zp = torch.round(-lo / s).clamp(0, qmax) - half                 # signed domain, as the library's
        mod.weight_scale.data = s.reshape(mod.weight_scale.shape).to(mod.weight_scale.dtype)
        if hasattr(mod, "weight_zero_point"):
            mod.weight_zero_point.data = zp.reshape(mod.weight_zero_point.shape).to(mod.weight_zero_point.dtype)
        dequantized[f"{name}.weight"] = fake_quantize(mod.weight.data, mod.weight_scale.data,
                                                     getattr(mod, "weight_zero_point", None), args)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(str(dst))
    compressor.update_config(str(dst))
    return str(dst), dequantized


@pytest.mark.parametrize("symmetric,bits,group", [(False, 4, GROUP), (True, 4, GROUP), (True, 8, -1),
                                                  (False, 8, GROUP)])
def test_compressed_tensors_pack_quantized_as_the_library_writes_and_dequantizes_it(ckpt, tmp_path, symmetric,
                                                                                    bits, group):
    import compressed_tensors  # noqa: F401  (the test extra installs it)
    path, dequantized = _compressed_tensors_checkpoint(ckpt, tmp_path / "ct", symmetric, bits, group)
    cfg = json.loads((Path(path) / "config.json").read_text())["quantization_config"]
    assert (cfg["quant_method"], cfg["format"]) == ("compressed-tensors", "pack-quantized")
    weights = load_prequantized(load_file(str(Path(path) / "model.safetensors")), cfg)
    for name, ref in dequantized.items():
        assert type(weights[name]) is (Int8Weight if bits == 8 else Int4Weight)
        assert torch.allclose(weights[name].dequant(), ref, atol=1e-6), name
    if bits == 8:  # per channel symmetric keeps one scale a row; groups with zero points go per block
        assert weights[name].d.dim() == (1 if group == -1 else 2) and (weights[name].m is None) == symmetric
    # served as transformers serves the library's dequantized weights (and the engine's int8 LM head)
    ref_dir = tmp_path / "ref"
    shutil.copytree(ckpt, ref_dir)
    tensors = load_file(str(ref_dir / "model.safetensors"))
    tensors.update(dequantized)
    tensors["lm_head.weight"] = Int8Weight(tensors["lm_head.weight"]).dequant()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(ref_dir / "model.safetensors"))
    assert engine_greedy(path, PROMPT, 12) == hf_greedy(str(ref_dir), PROMPT, 12)


def test_compressed_tensors_layouts_we_do_not_read_are_refused():
    base = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32}}}}
    for change, field in ((("format", "float-quantized"), "format"),
                          (("num_bits", 2), "config_groups.g.weights.num_bits"),
                          (("actorder", "group"), "config_groups.g.weights.actorder")):
        cfg = json.loads(json.dumps(base))
        if change[0] == "format":
            cfg["format"] = change[1]
        else:
            cfg["config_groups"]["g"]["weights"][change[0]] = change[1]
        with pytest.raises(ValueError, match=f"quantization_config.{field}"):
            load_prequantized({}, cfg)
