"""The fused decode (engine/fused_decode.py, csrc/decode_cpu.cpp): every layer of a decode step in one native call
gives bit for bit the per-layer path's tokens and log probs, for float, int8 and int4 weights with either activation
mode, biases (qwen2) and batched decodes; models or steps it does not cover take the per-layer path."""
from __future__ import annotations

import pytest
import torch

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.cpu_kernels import load
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.request import SamplingParams

from engine_helpers import make_checkpoint
from gguf_helpers import write_gguf

pytestmark = pytest.mark.skipif(load() is None, reason="native CPU kernels not available on this machine")
SHAPE = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
PROMPTS = [[5, 6, 7, 8], [100, 120, 140], [9] * 11]


def _run(engine: LLMEngine, fused: bool) -> dict:
    stack = engine.model.decode_stack
    if not fused:
        engine.model.decode_stack = None
    try:
        for i, p in enumerate(PROMPTS):
            engine.add_request(f"{fused}-{i}", p, SamplingParams(max_tokens=12, end_id=-1, return_log_probs=True))
        out = {}
        while engine.has_work():
            for o in engine.step():
                out.setdefault(o.request_id.split("-")[1], []).extend(zip(o.new_token_ids, o.new_logprobs))
        return out
    finally:
        engine.model.decode_stack = stack


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("quantization, activations", [("none", "none"), ("int8", "none"), ("int8", "int8"),
                                                       ("int4", "none"), ("int4", "int8")])
def test_fused_steps_equal_the_per_layer_path_bit_for_bit(tmp_path, arch, quantization, activations):
    path = make_checkpoint(tmp_path / arch, arch, seed=3, **SHAPE)
    engine = LLMEngine(path, EngineConfig(max_kv_tokens=1024, block_size=4, quantization=quantization,
                                          activation_quantization=activations))
    assert engine.model.decode_stack is not None
    fused, per_layer = _run(engine, True), _run(engine, False)
    assert fused == per_layer and all(len(v) == 12 for v in fused.values())
    assert engine.num_free_blocks == engine.kv_manager.num_blocks


@pytest.mark.parametrize("activations", ["int8", "none"])
def test_fused_steps_over_a_gguf_files_packed_codes_equal_the_per_layer_path(tmp_path, activations):
    """A GGUF file's Q5_0 and Q6_K tensors (5- and 6-bit codes, packed) next to Q4_K and Q8_0 ones, in one stack."""
    from tritonllm.engine.quant_nbit import IntNWeight

    wide = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    path = write_gguf(tmp_path / "mix.gguf", make_checkpoint(tmp_path / "hf", "llama", seed=5, **wide), "llama",
                      {"attn_v": "Q6_K", "ffn_down": "Q6_K", "attn_output": "Q8_0", "ffn_gate": "Q4_K", "": "Q5_0"})
    engine = LLMEngine(path, EngineConfig(max_kv_tokens=1024, block_size=4, activation_quantization=activations))
    layer = engine.model.layers[0]
    assert isinstance(layer.down, IntNWeight) and layer.down.bits == 6
    assert engine.model.decode_stack is not None
    fused, per_layer = _run(engine, True), _run(engine, False)
    assert fused == per_layer and all(len(v) == 12 for v in fused.values())


def test_models_the_stack_does_not_cover_take_the_per_layer_path(tmp_path):
    qk_norm = LLMEngine(make_checkpoint(tmp_path / "q3", "qwen3", **SHAPE), EngineConfig(max_kv_tokens=512))
    assert qk_norm.model.decode_stack is None  # Qwen3's per-head q / k norms
    fp8 = LLMEngine(make_checkpoint(tmp_path / "l", "llama", **SHAPE), EngineConfig(max_kv_tokens=512, quantization="fp8"))
    assert fp8.model.decode_stack is None
    torch_kernels = LLMEngine(make_checkpoint(tmp_path / "l2", "llama", **SHAPE),
                              EngineConfig(max_kv_tokens=512, cpu_kernels="torch"))
    assert torch_kernels.model.decode_stack is None
