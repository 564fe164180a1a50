"""Quantized Hugging Face checkpoints (``config.json: quantization_config``) -> ``Int4Weight``s, codes kept.

Layouts, as published by the formats' packers (read from AutoAWQ's ``awq/utils/packing_utils.py`` and
AutoGPTQ's ``QuantLinear.pack`` through their users' copies):

- AutoAWQ GEMM (``quant_method: awq``, ``version: gemm``, ``zero_point: true``): ``qweight`` int32
  [in, out / 8], ``qzeros`` int32 [in / group, out / 8], ``scales`` fp16 [in / group, out]; nibble i
  (bits 4i..4i+3) of packed column c holds output column 8c + AWQ_ORDER[i]; weight = (q - z) * s.
- GPTQ, AutoGPTQ / optimum format v1 (``quant_method: gptq``, ``checkpoint_format`` gptq or absent):
  ``qweight`` int32 [in / 8, out], nibble j of row r holds input 8r + j; ``qzeros`` int32
  [groups, out / 8], nibble j of column c holds output 8c + j, stored as z - 1; ``scales`` [groups, out];
  ``g_idx`` int32 [in], the group of each input (``desc_act``: inputs in activation order, so groups are
  not contiguous: the weight is stored in the order that makes them so, and activations are permuted to
  match); weight = (q - z) * s.
- compressed-tensors ``pack-quantized`` (``quant_method: compressed-tensors``, as llm-compressor writes it;
  read from compressed_tensors 0.20.1 ``compressors/pack_quantized``): ``weight_packed`` int32 [out, in / 8],
  element i at bits 4i of the row (word i // 8, nibble i % 8), stored as the signed code + 8;
  ``weight_scale`` [out, in / group]; asymmetric: ``weight_zero_point`` int32 [out / 8, groups], packed the
  same way along the output dimension; symmetric: zero point 0 (8 once offset); weight = (q - z) * s.
  One weight-only int4 config group (strategy group or channel), no activation quantization, no g_idx.

Anything else is refused with ValueError naming the field (``quantization_config.<field>``).
"""
from __future__ import annotations

import torch

from .quant import Int4Weight

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _nibbles(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 [..] -> uint8 codes with 8 nibbles per int32 expanded along `dim` (nibble j at position 8c + j)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    x = packed.to(torch.int32).unsqueeze(-1) >> shifts                       # [..., 8]
    x = (x & 0xF).to(torch.uint8)
    if dim in (-1, packed.dim() - 1):
        return x.reshape(*packed.shape[:-1], packed.shape[-1] * 8)
    x = x.movedim(-1, dim + 1)                                               # [.., rows, 8, ..]
    return x.reshape(*packed.shape[:dim], packed.shape[dim] * 8, *packed.shape[dim + 1:])


def _check_compressed_tensors(qcfg: dict) -> int:
    if qcfg.get("format") != "pack-quantized":
        raise ValueError(f"quantization_config.format {qcfg.get('format')!r} is not supported (pack-quantized)")
    groups = qcfg.get("config_groups") or {}
    if len(groups) != 1:
        raise ValueError(f"quantization_config.config_groups: one group is supported, got {len(groups)}")
    name, group = next(iter(groups.items()))
    w = group.get("weights") or {}
    where = f"quantization_config.config_groups.{name}"
    for field, want in (("num_bits", 4), ("type", "int")):
        if w.get(field) != want:
            raise ValueError(f"{where}.weights.{field} {w.get(field)!r} is not supported ({want})")
    if w.get("strategy") not in ("group", "channel"):
        raise ValueError(f"{where}.weights.strategy {w.get('strategy')!r} is not supported (group, channel)")
    if w.get("actorder"):
        raise ValueError(f"{where}.weights.actorder {w.get('actorder')!r} is not supported (none)")
    if group.get("input_activations") or group.get("output_activations"):
        raise ValueError(f"{where}.input_activations: activation quantization is not supported (weight-only)")
    return int(w["group_size"]) if w.get("strategy") == "group" else -1


def ct_weight(packed, scale, zero_point, shape, group: int) -> Int4Weight:
    out, k = (int(v) for v in shape)
    codes = _nibbles(packed, -1)[:, :k]                                      # unsigned: signed code + 8
    z = (_nibbles(zero_point, 0)[:out].float() if zero_point is not None
         else torch.full(scale.shape, 8.0))
    return Int4Weight.from_codes(codes.contiguous(), scale.float(), z, k if group == -1 else group)


def _check(qcfg: dict) -> tuple[str, int]:
    method = str(qcfg.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return method, _check_compressed_tensors(qcfg)
    if method not in ("awq", "gptq"):
        raise ValueError(f"quantization_config.quant_method {qcfg.get('quant_method')!r} is not supported "
                         "(awq, gptq, compressed-tensors; or a float checkpoint and deployment.yaml "
                         "`quantization`)")
    bits = qcfg.get("bits", qcfg.get("w_bit"))
    if bits != 4:
        raise ValueError(f"quantization_config.bits {bits!r} is not supported (4)")
    group = int(qcfg.get("group_size", qcfg.get("q_group_size", 128)))
    if method == "awq":
        version = str(qcfg.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"quantization_config.version {qcfg.get('version')!r} is not supported (gemm)")
        if qcfg.get("zero_point", True) is not True:
            raise ValueError("quantization_config.zero_point false is not supported (AWQ GEMM with zero points)")
    else:
        fmt = qcfg.get("checkpoint_format", "gptq")
        if fmt not in (None, "gptq"):
            raise ValueError(f"quantization_config.checkpoint_format {fmt!r} is not supported (gptq)")
    return method, group


def awq_weight(qweight, qzeros, scales, group: int) -> Int4Weight:
    k = qweight.shape[0]
    order = torch.tensor(AWQ_ORDER)
    cols = (torch.arange(qweight.shape[1])[:, None] * 8 + order[None, :]).reshape(-1)  # nibble -> output
    codes = torch.empty(k, qweight.shape[1] * 8, dtype=torch.uint8)
    codes[:, cols] = _nibbles(qweight, -1)
    zeros = torch.empty(qzeros.shape[0], qzeros.shape[1] * 8, dtype=torch.uint8)
    zeros[:, cols] = _nibbles(qzeros, -1)
    group = k if group == -1 else group
    return Int4Weight.from_codes(codes.t().contiguous(), scales.float().t(), zeros.float().t(), group)


def gptq_weight(qweight, qzeros, scales, g_idx, group: int) -> Int4Weight:
    codes = _nibbles(qweight, 0).t().contiguous()                            # [out, in]
    zeros = (_nibbles(qzeros, -1).float() + 1).t()                           # [out, groups], stored as z - 1
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
    return Int4Weight.from_codes(codes, d, zeros, group, perm)


def load_prequantized(weights: dict, qcfg: dict) -> dict:
    """Replaces every projection's packed tensors by one Int4Weight under ``<name>.weight``."""
    method, group = _check(qcfg)
    out = dict(weights)
    if method == "compressed-tensors":
        for name in [k[: -len(".weight_packed")] for k in weights if k.endswith(".weight_packed")]:
            if name.rsplit(".", 1)[-1] not in PROJECTIONS:
                raise ValueError(f"{name}: quantized module outside the attention / MLP projections is not supported")
            if f"{name}.weight_g_idx" in out:
                raise ValueError(f"{name}.weight_g_idx: activation-ordered compressed-tensors weights are not supported")
            out[f"{name}.weight"] = ct_weight(out.pop(f"{name}.weight_packed"), out.pop(f"{name}.weight_scale"),
                                              out.pop(f"{name}.weight_zero_point", None),
                                              out.pop(f"{name}.weight_shape"), group)
        return out
    for name in [k[: -len(".qweight")] for k in weights if k.endswith(".qweight")]:
        if name.rsplit(".", 1)[-1] not in PROJECTIONS:
            raise ValueError(f"{name}: quantized module outside the attention / MLP projections is not supported")
        qw, qz, sc = (out.pop(f"{name}.{t}") for t in ("qweight", "qzeros", "scales"))
        g_idx = out.pop(f"{name}.g_idx", None)
        out[f"{name}.weight"] = (awq_weight(qw, qz, sc, group) if method == "awq"
                                 else gptq_weight(qw, qz, sc, g_idx, group))
    return out
