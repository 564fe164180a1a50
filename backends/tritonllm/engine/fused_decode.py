"""Every layer of a decode step in one native call: csrc/decode_cpu.cpp's DecodeStack over the model's weights.

On fp32 CPU a decode step of a deep, narrow model spends a fifth of its time between kernels (SmolLM2-135M: 30
layers x ~10 calls through each weight's Python dispatch, ~1.1 ms of a 5 ms step). ``build`` hands every layer's
weights to the native stack once, each as the kernel its own ``matmul`` would call on few rows (fp32 ``linear``,
``linear_q4x8`` / ``_f32``, ``linear_q8x8`` / ``_f32``, ``linear_nbit`` / ``_f32``; a RowStack's parts each by its
own, concatenated: a GGUF Q4_K_M file's Q4_K q / k beside its Q6_K v), so a fused step runs the same kernels on the
same tensors in the same order: the logits are bit for bit those of the per-layer path (tested). ``None`` when any
layer has something the stack does not run (FP8 weights, an input permutation, q / k norms, another
activation than SiLU, no native kernels): the per-layer path then serves every step, as it serves every step
with a prefill, LoRA, a quantized KV cache or more rows than the few-row kernels take (``applies``).
"""
from __future__ import annotations

import torch

from .cpu_kernels import KV_DTYPES, MAX_ROWS
from .quant import Int4Weight, Int8Weight, RowStack
from .quant_nbit import IntNWeight

# csrc/decode_cpu.cpp's Kind
F32, Q4, Q4_F32, Q8, Q8_F32, QN, QN_F32, ROWS = range(8)


def projection(w, b: torch.Tensor | None) -> tuple | None:
    """(kind, weight or codes, scales, zero shares, bias, output rows[, high-bit planes, offset]) as the stack takes
    it, or None."""
    if b is not None and not (b.dtype == torch.float32 and b.is_contiguous()):
        return None
    if isinstance(w, torch.Tensor):
        ok = w.dtype == torch.float32 and w.dim() == 2 and w.is_contiguous() and w.device.type == "cpu"
        return (F32, w, None, None, b, w.shape[0]) if ok else None
    if isinstance(w, RowStack):  # parts of different layouts: each its own kernel, outputs concatenated, then b
        parts = [projection(p, None) for p in w.parts]
        return None if any(p is None for p in parts) else (ROWS, parts, None, None, b, w.shape[0])
    if type(w) not in (Int4Weight, Int8Weight, IntNWeight) or w.native is None or w.perm is not None:
        return None
    if isinstance(w, IntNWeight):
        return QN if w.int8_activations else QN_F32, w.qx, w.dx, w.mx, b, w.shape[0], w.hx, w.zero, w.dsup, w.msup
    if isinstance(w, Int4Weight):
        return Q4 if w.int8_activations else Q4_F32, w.qx, w.dx, w.mx, b, w.shape[0], None, 0, w.dsup, w.msup
    return Q8 if w.int8_activations else Q8_F32, w.qx, w.dx, w.mx, b, w.shape[0]


def build(model):
    """The model's DecodeStack, or None (see the module docstring)."""
    spec, native = model.spec, model.native
    if native is None or not hasattr(native, "DecodeStack") or spec.activation != "silu":
        return None
    layers = []
    for layer in model.layers:
        if layer.q_norm is not None:
            return None
        projections = [projection(layer.qkv, layer.qkv_b), projection(layer.o, layer.o_b),
                       projection(layer.gate_up, layer.gate_up_b), projection(layer.down, layer.down_b)]
        if any(p is None for p in projections):
            return None
        layers.append((layer.ln1, layer.ln2, *projections))
    return native.DecodeStack(layers, spec.rms_norm_eps, spec.num_heads, spec.num_kv_heads, model.scale)


def applies(meta, num_tokens: int, kv_k: list[torch.Tensor]) -> bool:
    """A step the stack runs: every row a decode, no LoRA, a KV cache the native kernels read, few rows."""
    return (not meta.prefills and not meta.lora and meta.decode_rows is not None and num_tokens <= MAX_ROWS
            and kv_k[0].dtype in KV_DTYPES)
