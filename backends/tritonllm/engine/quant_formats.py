"""Quantized Hugging Face checkpoints (``config.json: quantization_config``) -> Int4Weight / Int8Weight, codes kept.

Layouts, as published by the formats' packers (read from AutoAWQ's ``awq/utils/packing_utils.py`` and
AutoGPTQ's ``QuantLinear.pack`` through their users' copies):

- AutoAWQ GEMM (``quant_method: awq``, ``version: gemm``, ``zero_point: true``): ``qweight`` int32
  [in, out / 8], ``qzeros`` int32 [in / group, out / 8], ``scales`` fp16 [in / group, out]; nibble i
  (bits 4i..4i+3) of packed column c holds output column 8c + AWQ_ORDER[i]; weight = (q - z) * s.
- GPTQ, AutoGPTQ / optimum format v1 (``quant_method: gptq``, ``checkpoint_format`` gptq or absent), 4 or
  8 bits (p = 32 / bits fields per int32): ``qweight`` int32 [in / p, out], field j of row r holds input
  p r + j; ``qzeros`` int32 [groups, out / p], field j of column c holds output p c + j, stored as z - 1
  (GPTQModel's ``gptq_v2``: z itself); ``scales`` [groups, out];
  ``g_idx`` int32 [in], the group of each input (``desc_act``: inputs in activation order, so groups are
  not contiguous: the weight is stored in the order that makes them so, and activations are permuted to
  match); weight = (q - z) * s.
- compressed-tensors ``pack-quantized`` (``quant_method: compressed-tensors``, as llm-compressor writes it;
  read from compressed_tensors 0.20.1 ``compressors/pack_quantized``), 4 or 8 bits: ``weight_packed`` int32
  [out, in * bits / 32], element i at bits ``bits * i`` of the row, stored as the signed code + 2^(bits-1);
  ``weight_scale`` [out, in / group]; asymmetric: ``weight_zero_point`` int32 [out * bits / 32, groups],
  packed the same way along the output dimension; symmetric: zero point 0 (2^(bits-1) once offset);
  weight = (q - z) * s.
  One weight-only config group (strategy group or channel), no activation quantization, no g_idx.

8-bit codes become Int8Weight: one scale per channel when symmetric over whole rows, else scales and zero
shares per 32-element block (the native kernel takes both).

Anything else is refused with ValueError naming the field (``quantization_config.<field>``).
"""
from __future__ import annotations

import torch

from .models.llama import LLAMA
from .quant import Int4Weight, Int8Weight

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _fields(packed: torch.Tensor, dim: int, bits: int = 4) -> torch.Tensor:
    """int32 [..] -> uint8 codes, 32 / bits fields per int32 expanded along `dim` (field j at position per * c + j)."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    x = packed.to(torch.int32).unsqueeze(-1) >> shifts                       # [..., per]
    x = (x & ((1 << bits) - 1)).to(torch.uint8)
    if dim in (-1, packed.dim() - 1):
        return x.reshape(*packed.shape[:-1], packed.shape[-1] * per)
    x = x.movedim(-1, dim + 1)                                               # [.., rows, per, ..]
    return x.reshape(*packed.shape[:dim], packed.shape[dim] * per, *packed.shape[dim + 1:])


def _weight(codes, d, z, group: int, bits: int, perm=None):
    cls = Int4Weight if bits == 4 else Int8Weight
    return cls.from_codes(codes, d, z, group, perm)


def _check_compressed_tensors(qcfg: dict) -> int:
    if qcfg.get("format") != "pack-quantized":
        raise ValueError(f"quantization_config.format {qcfg.get('format')!r} is not supported (pack-quantized)")
    groups = qcfg.get("config_groups") or {}
    if len(groups) != 1:
        raise ValueError(f"quantization_config.config_groups: one group is supported, got {len(groups)}")
    name, group = next(iter(groups.items()))
    w = group.get("weights") or {}
    where = f"quantization_config.config_groups.{name}"
    if w.get("num_bits") not in (4, 8):
        raise ValueError(f"{where}.weights.num_bits {w.get('num_bits')!r} is not supported (4, 8)")
    if w.get("type") != "int":
        raise ValueError(f"{where}.weights.type {w.get('type')!r} is not supported (int)")
    if w.get("strategy") not in ("group", "channel"):
        raise ValueError(f"{where}.weights.strategy {w.get('strategy')!r} is not supported (group, channel)")
    if w.get("actorder"):
        raise ValueError(f"{where}.weights.actorder {w.get('actorder')!r} is not supported (none)")
    if group.get("input_activations") or group.get("output_activations"):
        raise ValueError(f"{where}.input_activations: activation quantization is not supported (weight-only)")
    return int(w["group_size"]) if w.get("strategy") == "group" else -1


def ct_bits(qcfg: dict) -> int:
    return int(next(iter(qcfg["config_groups"].values()))["weights"]["num_bits"])


def ct_weight(packed, scale, zero_point, shape, group: int, bits: int = 4):
    out, k = (int(v) for v in shape)
    offset = 1 << (bits - 1)
    codes = _fields(packed, -1, bits)[:, :k]                                 # unsigned: signed code + offset
    z = (_fields(zero_point, 0, bits)[:out].float() if zero_point is not None
         else torch.full(scale.shape, float(offset)))
    return _weight(codes.contiguous(), scale.float(), z, k if group == -1 else group, bits)


def _check(qcfg: dict) -> tuple[str, int, int]:
    """(method, group size or -1, bits)."""
    method = str(qcfg.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return method, _check_compressed_tensors(qcfg), ct_bits(qcfg)
    if method not in ("awq", "gptq"):
        raise ValueError(f"quantization_config.quant_method {qcfg.get('quant_method')!r} is not supported "
                         "(awq, gptq, compressed-tensors; or a float checkpoint and deployment.yaml "
                         "`quantization`)")
    bits = qcfg.get("bits", qcfg.get("w_bit"))
    if bits not in ((4,) if method == "awq" else (4, 8)):
        raise ValueError(f"quantization_config.bits {bits!r} is not supported ({'4' if method == 'awq' else '4, 8'})")
    group = int(qcfg.get("group_size", qcfg.get("q_group_size", 128)))
    if method == "awq":
        version = str(qcfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"quantization_config.version {qcfg.get('version')!r} is not supported (gemm)")
        if qcfg.get("zero_point", True) is not True:
            raise ValueError("quantization_config.zero_point false is not supported (AWQ GEMM with zero points)")
    else:
        fmt = qcfg.get("checkpoint_format", "gptq")
        if fmt not in (None, "gptq", "gptq_v2"):
            raise ValueError(f"quantization_config.checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
    return method, group, bits


def awq_weight(qweight, qzeros, scales, group: int) -> Int4Weight:
    k = qweight.shape[0]
    order = torch.tensor(AWQ_ORDER)
    cols = (torch.arange(qweight.shape[1])[:, None] * 8 + order[None, :]).reshape(-1)  # nibble -> output
    codes = torch.empty(k, qweight.shape[1] * 8, dtype=torch.uint8)
    codes[:, cols] = _fields(qweight, -1)
    zeros = torch.empty(qzeros.shape[0], qzeros.shape[1] * 8, dtype=torch.uint8)
    zeros[:, cols] = _fields(qzeros, -1)
    group = k if group == -1 else group
    return Int4Weight.from_codes(codes.t().contiguous(), scales.float().t(), zeros.float().t(), group)


def gptq_weight(qweight, qzeros, scales, g_idx, group: int, bits: int = 4, v2: bool = False):
    codes = _fields(qweight, 0, bits).t().contiguous()                       # [out, in]
    zeros = (_fields(qzeros, -1, bits).float() + (0 if v2 else 1)).t()       # [out, groups]; v1 stores z - 1
    k = codes.shape[1]
    group = k if group == -1 else group
    d = scales.float().t()
    perm = None
    if g_idx is not None:
        g_idx = g_idx.to(torch.long)
        if not torch.equal(g_idx, torch.arange(k) // group):                 # act order: sort inputs by group
            perm = torch.argsort(g_idx, stable=True)
            if not torch.equal(g_idx[perm], torch.arange(k) // group):
                raise ValueError("quantization_config: g_idx does not assign group_size inputs to each group")
            codes = codes[:, perm].contiguous()
    return _weight(codes, d, zeros, group, bits, perm)


def load_prequantized(weights: dict, qcfg: dict, projections: tuple[str, ...] = LLAMA.projections()) -> dict:
    """Replaces every projection's packed tensors by one Int4Weight / Int8Weight under ``<name>.weight``.
    ``projections``: the architecture's linear module names (``Architecture.projections()``)."""
    method, group, bits = _check(qcfg)
    out = dict(weights)
    if method == "compressed-tensors":
        for name in [k[: -len(".weight_packed")] for k in weights if k.endswith(".weight_packed")]:
            if name.rsplit(".", 1)[-1] not in projections:
                raise ValueError(f"{name}: quantized module outside the attention / MLP projections is not supported")
            if f"{name}.weight_g_idx" in out:
                raise ValueError(f"{name}.weight_g_idx: activation-ordered compressed-tensors weights are not supported")
            out[f"{name}.weight"] = ct_weight(out.pop(f"{name}.weight_packed"), out.pop(f"{name}.weight_scale"),
                                              out.pop(f"{name}.weight_zero_point", None),
                                              out.pop(f"{name}.weight_shape"), group, bits)
        return out
    for name in [k[: -len(".qweight")] for k in weights if k.endswith(".qweight")]:
        if name.rsplit(".", 1)[-1] not in projections:
            raise ValueError(f"{name}: quantized module outside the attention / MLP projections is not supported")
        qw, qz, sc = (out.pop(f"{name}.{t}") for t in ("qweight", "qzeros", "scales"))
        g_idx = out.pop(f"{name}.g_idx", None)
        out[f"{name}.weight"] = (awq_weight(qw, qz, sc, group) if method == "awq"
                                 else gptq_weight(qw, qz, sc, g_idx, group, bits,
                                                  qcfg.get("checkpoint_format") == "gptq_v2"))
    return out
