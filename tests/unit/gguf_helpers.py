"""GGUF files written by the `gguf` package itself, the way llama.cpp's converter writes them (shared by GGUF tests).

``write_gguf`` takes a tiny random HF model (engine_helpers.make_checkpoint), renames its tensors with gguf's
TensorNameMap, permutes q / k rows of llama files as convert_hf_to_gguf.py's ``LlamaModel.permute`` does, and
stores every matrix in one GGML type: quantized by ``gguf.quants.quantize`` where the package can (Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, BF16, F16), else as random blocks with moderate scales (the K-quants and IQ4: the package only
dequantizes those; their dequantized values are the model both transformers and the engine then serve).
"""
from __future__ import annotations

import numpy as np
import torch

QK_K = 256


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (HF rows -> llama.cpp's rotary order)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _f16(value: np.ndarray) -> np.ndarray:
    return np.asarray(value, dtype=np.float16).reshape(-1, 1).view(np.uint8)


def random_blocks(type_name: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Valid blocks of a type gguf cannot quantize, with values of a few tenths at most, [rows, bytes]."""
    n = rows * k // QK_K if type_name not in ("IQ4_NL",) else rows * k // 32
    u8 = lambda *shape: rng.integers(0, 256, size=shape, dtype=np.uint8)  # noqa: E731
    if type_name in ("Q4_K", "Q5_K"):
        levels = 15 if type_name == "Q4_K" else 31
        sc = rng.integers(1, 9, size=(n, 8)).astype(np.uint8)
        mn = np.clip(np.round(sc * levels / 2), 0, 63).astype(np.uint8)  # minima near the middle: centred values
        packed = np.zeros((n, 12), np.uint8)  # llama.cpp's 6-bit packing (scales fit in 6 bits, minima too)
        packed[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
        packed[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
        packed[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
        d = _f16(np.full(n, 0.012 if type_name == "Q4_K" else 0.006))
        parts = [d, d, packed] + ([u8(n, 32)] if type_name == "Q5_K" else []) + [u8(n, 128)]
        return np.concatenate(parts, axis=1).reshape(rows, -1)
    if type_name == "Q6_K":
        scales = rng.integers(-8, 9, size=(n, 16)).astype(np.int8).view(np.uint8)
        return np.concatenate([u8(n, 128), u8(n, 64), scales, _f16(np.full(n, 0.004))], axis=1).reshape(rows, -1)
    if type_name in ("Q3_K", "Q2_K"):
        size = 110 if type_name == "Q3_K" else 84
        blocks = u8(n, size)
        if type_name == "Q3_K":  # 6-bit scales near 32 (sc - 32 small), d last
            blocks[:, 96:104] = (rng.integers(0, 16, size=(n, 8)) | (rng.integers(0, 16, size=(n, 8)) << 4))
            blocks[:, 104:108] = 0b10101010
            blocks[:, 108:110] = _f16(np.full(n, 0.01))
        else:
            blocks[:, 80:82] = _f16(np.full(n, 0.01))
            blocks[:, 82:84] = _f16(np.full(n, 0.01))
        return blocks.reshape(rows, -1)
    if type_name == "IQ4_NL":
        return np.concatenate([_f16(np.full(n, 0.002)), u8(n, 16)], axis=1).reshape(rows, -1)
    if type_name == "IQ4_XS":
        scales_l = rng.integers(0, 256, size=(n, 4), dtype=np.uint8)
        return np.concatenate([_f16(np.full(n, 0.0005)), np.zeros((n, 2), np.uint8) + 0b10101010, scales_l, u8(n, 128)],
                              axis=1).reshape(rows, -1)
    raise ValueError(type_name)


GGUF_QUANTIZABLE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "BF16", "F16")


def encode_tensor(w: np.ndarray, type_name: str, rng: np.random.Generator):
    """(data, raw_dtype) for GGUFWriter.add_tensor."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name == "F32":
        return w.astype(np.float32), None
    if type_name in GGUF_QUANTIZABLE:
        return gguf.quants.quantize(w.astype(np.float32), qtype), qtype
    return random_blocks(type_name, w.shape[0], w.shape[1], rng), qtype


def write_gguf(path, model_dir: str, gguf_arch: str = "llama", matrix_type: str | dict = "F32",
               name: str = "tiny", seed: int = 0) -> str:
    """The HF checkpoint ``model_dir`` as a GGUF file at ``path``; ``matrix_type``: one GGML type for every matrix,
    or {tensor-name suffix: type} (first match; "" for the rest)."""
    import gguf
    from safetensors.torch import load_file
    import json
    import os

    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    state = {k: v.float().numpy() for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[gguf_arch]
    layers = cfg["num_hidden_layers"]
    table = gguf.get_tensor_name_map(arch_enum, layers)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(path), gguf_arch)
    writer.add_name(name)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_eos_token_id(2)
    rng = np.random.default_rng(seed)
    for hf_name, w in state.items():
        base, _, suffix = hf_name.rpartition(".")
        gname = table.get_name(base)
        assert gname is not None, hf_name
        if gguf_arch == "llama" and base.endswith(("self_attn.q_proj", "self_attn.k_proj")):
            w = _permute(w, heads if base.endswith("q_proj") else kv_heads)
        kind = "F32"
        if w.ndim == 2:
            if isinstance(matrix_type, str):
                kind = matrix_type
            else:
                kind = next(t for s, t in matrix_type.items() if s == "" or gname.endswith(s))
        data, raw = encode_tensor(w, kind, rng)
        writer.add_tensor(f"{gname}.{suffix}", data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def hf_gguf_greedy(path: str, prompt: list[int], n: int) -> list[int]:
    """transformers' own GGUF loader (dequantized to fp32) and its greedy generate."""
    import os

    import transformers as tf

    folder, name = os.path.split(path)
    model = tf.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # n tokens whatever they are (min_new_tokens would mask eos)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()
