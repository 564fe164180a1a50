"""GGUF checkpoints: every supported block type kept as it is and equal to gguf's own dequantization, greedy
output equal to transformers' GGUF loader token for token, refusals that name the tensor and its type.

Files are written by the `gguf` package from tiny random HF models (gguf_helpers.write_gguf, llama.cpp's converter
conventions: gguf's tensor names, q / k rows permuted for llama files)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tritonllm.engine import cpu_kernels
from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.gguf_blocks import SUPPORTED
from tritonllm.engine.gguf_checkpoint import read_gguf
from tritonllm.engine.hf_config import UnsupportedModelError
from tritonllm.engine.quant import Int4Weight, Int8Weight, RowStack
from tritonllm.engine.quant_nbit import IntNWeight
from tritonllm.engine.request import SamplingParams

from engine_helpers import hf_greedy, last_logits, make_checkpoint
from gguf_helpers import hf_gguf_greedy, write_gguf

native = pytest.mark.skipif(cpu_kernels.load() is None, reason="native CPU kernels unavailable here")
# K-quants need rows of 256: a model 256 wide (2 layers, 4 heads of 64, 2 KV heads).
WIDE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
QUANTIZED = [t for t in SUPPORTED if t not in ("F32", "F16", "BF16")]
K_M = {"attn_v": "Q6_K", "ffn_down": "Q6_K", "token_embd": "Q6_K", "": "Q4_K"}  # llama.cpp's Q4_K_M mix


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("wide"), "llama", seed=3, **WIDE)


def _reference(path: str) -> dict[str, np.ndarray]:
    """gguf.quants.dequantize of every tensor of the file, q / k rows back in HF order (as transformers does)."""
    import gguf

    from tritonllm.engine.gguf_checkpoint import _unpermute_rows

    reader = gguf.GGUFReader(path)
    heads = int(reader.fields["llama.attention.head_count"].contents())
    kv = int(reader.fields["llama.attention.head_count_kv"].contents())
    out = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        if ".attn_q." in t.name or ".attn_k." in t.name:
            w = _unpermute_rows(w, heads if ".attn_q." in t.name else kv)
        out[t.name] = w
    return out


GGUF_OF = {"embed_tokens": "token_embd", "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v",
           "o_proj": "attn_output", "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def _gguf_name(hf: str) -> str:
    parts = hf.split(".")
    if hf.startswith("model.embed_tokens"):
        return "token_embd.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    return f"blk.{parts[2]}.{GGUF_OF[parts[-2]]}.{parts[-1]}"


@pytest.mark.parametrize("type_name", [*QUANTIZED, "F16", "BF16"])
def test_every_type_dequantizes_bit_for_bit_as_gguf_does(wide_llama, tmp_path, type_name):
    path = write_gguf(tmp_path / f"m-{type_name}.gguf", wide_llama, "llama", type_name, seed=7)
    spec, weights = read_gguf(path)
    ref = _reference(path)
    ext = cpu_kernels.load()
    checked = 0
    for name, w in weights.items():
        if name.endswith("norm.weight"):
            continue
        expected = torch.from_numpy(np.ascontiguousarray(ref[_gguf_name(name)]))
        checked += 1
        if isinstance(w, torch.Tensor):
            assert torch.equal(w.float(), expected), name
            continue
        assert isinstance(w, (Int4Weight, Int8Weight, IntNWeight)), (name, type(w))
        assert torch.equal(w.dequant(), expected), name                      # torch's dequantization
        ids = torch.tensor([0, 5, w.shape[0] - 1, 7])
        assert torch.equal(w.rows(ids), expected[ids]), name                 # an embedding's lookup
        if ext is not None:                                                  # the native one (prefill)
            assert torch.equal(w.dequant_native(ext), expected), name
    assert checked == (1 if spec.tie_word_embeddings else 2) + spec.num_layers * 7


@pytest.mark.parametrize("type_name,ratio", [("Q4_0", 20 / 18), ("Q4_1", 1.0), ("Q8_0", 1.0), ("Q5_0", 1.0),
                                             ("Q6_K", 1.0), ("Q4_K", 148 / 144), ("Q5_K", 180 / 176)])
def test_quantized_weights_take_no_more_memory_than_the_file(wide_llama, tmp_path, type_name, ratio):
    """fp16 scales where the file's are (Q4_0 / Q4_1 / Q8_0 / Q5_0), the K-quants' factored as the file has them
    (int8 codes and a float16 per 256): the engine holds the file's bytes per block (Q4_0 adds its shift m = -8 d: 20
    bytes per 32 weights for the file's 18; Q4_K / Q5_K hold d and dmin per row of 256 inputs: 148 / 180 for 144 /
    176); Q5_x and Q6_K keep their 5- and 6-bit codes packed."""
    import gguf

    path = write_gguf(tmp_path / "m.gguf", wide_llama, "llama", type_name)
    _, weights = read_gguf(path)
    held = sum(w.nbytes for w in weights.values() if not isinstance(w, torch.Tensor))
    stored = sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if t.tensor_type.name == type_name)
    kept = [w for w in weights.values() if not isinstance(w, torch.Tensor)]
    assert all(w.dx.dtype == (torch.int8 if type_name.endswith("_K") else torch.float16) for w in kept)
    assert held <= stored * ratio * 1.015, (held, stored)  # + rows padded to groups of 8 (vocabulary 300 -> 304)


def _engine_greedy(path: str, prompt: list[int], n: int, **config) -> list[int]:
    eng = LLMEngine(path, EngineConfig(max_kv_tokens=256, **config))
    eng.add_request("r", prompt, SamplingParams(max_tokens=n, end_id=-1))
    out = []
    while eng.has_work():
        for o in eng.step():
            out += o.new_token_ids
    assert eng.pool.num_free == eng.pool.num_blocks  # every KV block back
    return out


CASES = [("llama", "llama", "Q8_0"), ("llama", "llama", "Q4_1"), ("llama", "llama", "Q4_0"), ("llama", "llama", K_M),
         ("llama", "llama", "F16"), ("qwen2", "qwen2", "Q5_0"), ("mistral", "llama", "Q5_K")]


@pytest.mark.parametrize("arch,gguf_arch,types", CASES, ids=lambda v: v if isinstance(v, str) else "Q4_K_M")
def test_engine_greedy_equals_transformers_gguf_loader(tmp_path, arch, gguf_arch, types):
    """The float path (cpu_kernels torch) and the native kernels with fp32 activations (activation_quantization
    none, the exact mode) both give transformers' greedy tokens on the same file, token for token. A Mistral
    converted by llama.cpp is a llama file (its usual name, "Mistral 7B Instruct", keeps it one for transformers
    too)."""
    src = make_checkpoint(tmp_path / "hf", arch, seed=11, **WIDE)
    name = "Mistral 7B Instruct" if arch == "mistral" else arch
    path = write_gguf(tmp_path / "m.gguf", src, gguf_arch, types, name=name, seed=5)
    spec, _ = read_gguf(path)
    assert spec.architecture == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[gguf_arch]
    prompt = [5, 17, 33, 8, 90, 41, 7, 12, 150, 3]
    ref = hf_gguf_greedy(path, prompt, 12)
    assert _engine_greedy(path, prompt, 12, cpu_kernels="torch") == ref
    if cpu_kernels.load() is not None:
        assert _engine_greedy(path, prompt, 12, activation_quantization="none") == ref


def test_a_llama_file_named_mistral_is_served_as_mistral(tmp_path):
    """transformers reads a llama file whose general.name is "mistral" as a Mistral (its own GGUF loader then fails
    on it with gguf 0.19); the engine serves it as MistralForCausalLM, equal to the original checkpoint (F32)."""
    src = make_checkpoint(tmp_path / "hf", "mistral", seed=11, **WIDE)
    path = write_gguf(tmp_path / "m.gguf", src, "llama", "F32", name="mistral")
    assert read_gguf(path)[0].architecture == "MistralForCausalLM"
    prompt = [5, 17, 33, 8, 90, 41, 7, 12, 150, 3]
    assert _engine_greedy(path, prompt, 12) == hf_greedy(src, prompt, 12)


@native
def test_int8_activations_stay_within_the_documented_bound(wide_llama, tmp_path):
    """activation_quantization int8 (llama.cpp's way; auto, the default, on a GGUF file's quantized tensors) differs
    from the float path by the activations' rounding only: logits within 10% of their scale (as for quantization at
    load, test_quant.py); none stays the float model. auto on an F32 file is none (nothing to quantize against)."""
    path = write_gguf(tmp_path / "m.gguf", wide_llama, "llama", "Q4_1")
    fast = LLMEngine(path, EngineConfig(max_kv_tokens=256))
    exact = LLMEngine(path, EngineConfig(max_kv_tokens=256, activation_quantization="none"))
    ref = LLMEngine(path, EngineConfig(max_kv_tokens=256, cpu_kernels="torch"))
    assert fast.model.activation_quantization == "int8" and exact.model.activation_quantization == "none"
    assert fast.model.layers[0].qkv.int8_activations and not exact.model.layers[0].qkv.int8_activations
    f32 = LLMEngine(write_gguf(tmp_path / "f.gguf", wide_llama, "llama", "F32"), EngineConfig(max_kv_tokens=64))
    assert f32.model.activation_quantization == "none"
    for seed in range(4):
        prompt = torch.randint(3, 300, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        a, e, b = (last_logits(x, prompt) for x in (fast, exact, ref))
        assert 0 < float((a - b).abs().max()) <= 0.1 * float(b.abs().max()), seed
        assert float((e - b).abs().max()) <= 1e-4 * float(b.abs().max()), seed  # fp32 activations: rounding only


def test_mixed_types_in_one_layer_fuse_into_a_row_stack(wide_llama, tmp_path):
    path = write_gguf(tmp_path / "km.gguf", wide_llama, "llama", K_M)
    eng = LLMEngine(path, EngineConfig(max_kv_tokens=64))
    layer = eng.model.layers[0]
    assert isinstance(layer.qkv, RowStack) and [type(p) for p in layer.qkv.parts] == [Int4Weight, IntNWeight]
    assert isinstance(layer.down, IntNWeight) and layer.down.bits == 6 and layer.down.zero == 32
    assert layer.down.d.shape[1] == 512 // 16                                               # Q6_K: 16-element scales
    assert isinstance(eng.model.embed, IntNWeight) and isinstance(eng.model.lm_head, Int4Weight)  # kept as stored


def test_unsupported_types_and_tensors_are_refused_by_name(wide_llama, tmp_path):
    path = write_gguf(tmp_path / "q2.gguf", wide_llama, "llama", {"ffn_up": "Q2_K", "": "Q8_0"})
    with pytest.raises(UnsupportedModelError, match=r"'blk\.0\.ffn_up\.weight' has type Q2_K"):
        read_gguf(path)
    with pytest.raises(ValueError, match="quantization must be none"):
        LLMEngine(write_gguf(tmp_path / "q8.gguf", wide_llama, "llama", "Q8_0"),
                  EngineConfig(max_kv_tokens=64, quantization="int8"))


def test_a_tensor_the_engine_would_not_read_is_refused(wide_llama, tmp_path):
    import gguf

    src = write_gguf(tmp_path / "m.gguf", wide_llama, "llama", "F32")
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(tmp_path / "extra.gguf"), "llama")
    for key, field in reader.fields.items():
        if key.startswith("llama.") or key.startswith("tokenizer.") or key == "general.name":
            value = field.contents()
            vtype = field.types[0]
            if vtype == gguf.GGUFValueType.ARRAY:
                writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
            else:
                writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data))
    writer.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((4, 256), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ffn_gate_exps\.weight \(F32\)"):
        read_gguf(str(tmp_path / "extra.gguf"))


def test_rope_freqs_divide_the_rotary_frequencies(wide_llama, tmp_path):
    """Llama 3.1 files carry llama3's rope scaling as a rope_freqs tensor: each frequency divided by its factor,
    as llama.cpp applies it."""
    import gguf

    src = write_gguf(tmp_path / "m.gguf", wide_llama, "llama", "F32")
    plain = LLMEngine(src, EngineConfig(max_kv_tokens=64)).model.inv_freq
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(tmp_path / "rf.gguf"), "llama")
    for key, field in reader.fields.items():
        if key.startswith("llama.") or key == "general.name":
            writer.add_key_value(key, field.contents(), field.types[0])
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data))
    factors = np.linspace(1.0, 8.0, plain.numel()).astype(np.float32)
    writer.add_tensor("rope_freqs.weight", factors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    scaled = LLMEngine(str(tmp_path / "rf.gguf"), EngineConfig(max_kv_tokens=64)).model.inv_freq
    assert torch.allclose(scaled, plain / torch.from_numpy(factors), rtol=1e-6)
