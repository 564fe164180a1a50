"""llama.cpp's GGUF tensor types -> the engine's weights, the file's blocks kept as they are (no requantizing).

Every supported block type stores, per block of 32 (or 16) weights along K, small integer codes and one or two
float16 numbers; each is decoded here into the codes and fp32 scales of the engine's own layouts:

| GGUF type | weight (as ``gguf.quants.dequantize`` computes it) | engine weight |
|---|---|---|
| Q4_0 | d * (q - 8), q 0..15 | Int4Weight, d, m = -8 d |
| Q4_1 | d * q + m, q 0..15 | Int4Weight, d, m |
| Q4_K | (d * sc_j) * q - (dmin * mn_j), 8 sub-blocks of 32 | Int4Weight, d * sc_j, -(dmin * mn_j) |
| Q5_0 / Q5_1 | d * (q - 16) / d * q + m, q 0..31 | IntNWeight, 5 bits, per 32-block (zero 16 / m) |
| Q5_K | (d * sc_j) * q - (dmin * mn_j), q 0..31 | IntNWeight, 5 bits, d and m per 32-block |
| Q8_0 | d * q, q -128..127 | Int8Weight per 32-block |
| Q6_K | (d * sc_i) * (q - 32), 16 sub-blocks of 16 | IntNWeight, 6 bits, d per 16-block, zero 32 |
| Q3_K | (d * (sc_i - 32)) * q, q -4..3, 16 sub-blocks of 16 | Int8Weight per 16-block |
| IQ4_NL / IQ4_XS | d (* (ls - 32)) * kvalues[q] | Int8Weight per 32-block, codes = kvalues[q] |
| F32 / F16 / BF16 | the value | float tensor |

Exactness: every scale here is a float16 times a small integer (at most 19 significant bits), exact in fp32, so
the engine's ``code * scale + shift`` rounds once where gguf's formula rounds once, at the same product: the
dequantized weights equal ``gguf.quants.dequantize`` bit for bit (Q4_0's d * (q - 8) = q * d - 8 d holds exactly
since every term is a multiple of d's last bit; tests compare every type). Types not listed (Q2_K, the IQ1-3
families, TQ*, Q8_K) are refused by name: Q2_K's 16-element minima would need per-16 activation sums.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .quant import Int4Weight, Int8Weight
from .quant_nbit import IntNWeight

QK_K = 256
IQ4_VALUES = np.array((-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113), dtype=np.int8)


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per block -> fp32 [blocks, 1] (as gguf reads them: float16 viewed, then widened)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """Packed bytes [blocks, bytes] -> codes [blocks, 2 * bytes]: each run of width / 2 bytes gives ``width``
    codes, its low nibbles first, then its high nibbles (llama.cpp's order)."""
    b = qs.reshape(qs.shape[0], -1, 1, width // 2) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (b & np.uint8(0x0F)).reshape(qs.shape[0], -1)


def _high_bits(qh: np.ndarray, n: int) -> np.ndarray:
    """Q5_0 / Q5_1: bit i of a block's 32-bit qh is element i's fifth bit."""
    bits = qh.view(np.uint32).reshape(-1, 1) >> np.arange(n, dtype=np.uint32).reshape(1, n)
    return (bits & np.uint32(1)).astype(np.uint8)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit minima (llama.cpp's get_scale_min_k4)."""
    s = scales.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


class Blocks(NamedTuple):
    """A decoder's result (blocks [n_blocks, type_size] uint8 in): codes [n_blocks, block], d [n_blocks, groups],
    m [n_blocks, groups of 32] or None. kind "int4" (codes 0..15), "int8" (codes -128..127), "int5" / "int6" (codes
    0..31 / 0..63, the fixed offset zero: weight = d * (q - zero) (+ m)). factors: the K-quants' d and m as the file
    factors them, (d codes, d super, m codes or None, m super or None): 6-bit codes per sub-block times a float16
    per 256 (d = d codes * d super exactly), kept so for a quarter of the scale bytes."""
    kind: str
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None
    zero: int = 0
    factors: tuple | None = None



def _q4_0(b):
    d = _f16(b[:, :2])
    return Blocks("int4", _nibbles(b[:, 2:], 32), d, d * np.float32(-8.0))


def _q4_1(b):
    return Blocks("int4", _nibbles(b[:, 4:], 32), _f16(b[:, :2]), _f16(b[:, 2:4]))


def _q5_0(b):
    q = _nibbles(b[:, 6:], 32) | (_high_bits(b[:, 2:6], 32) << np.uint8(4))
    return Blocks("int5", q, _f16(b[:, :2]), None, 16)


def _q5_1(b):
    q = _nibbles(b[:, 8:], 32) | (_high_bits(b[:, 4:8], 32) << np.uint8(4))
    return Blocks("int5", q, _f16(b[:, :2]), _f16(b[:, 2:4]))


def _q8_0(b):
    return Blocks("int8", np.ascontiguousarray(b[:, 2:]).view(np.int8), _f16(b[:, :2]), None)


def _k_scales(b):
    """Q4_K / Q5_K: d * sc and -(dmin * mn) per 32-element sub-block, and those factors."""
    sc, mn = _scale_min_k4(b[:, 4:16])
    d, neg_dmin = _f16(b[:, :2]), -_f16(b[:, 2:4])
    return d * sc, neg_dmin * mn, (sc, d, mn, neg_dmin)


def _q4_k(b):
    d, m, factors = _k_scales(b)
    return Blocks("int4", _nibbles(b[:, 16:], 64), d, m, 0, factors)


def _q5_k(b):
    d, m, factors = _k_scales(b)
    qh = b[:, 16:48].reshape(-1, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    q = _nibbles(b[:, 48:], 64) | ((qh & np.uint8(1)).reshape(b.shape[0], -1) << np.uint8(4))
    return Blocks("int5", q, d, m, 0, factors)


def _q6_k(b):
    n = b.shape[0]
    ql = _nibbles(b[:, :128], 128)
    qh = b[:, 128:192].reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = ql | ((qh & np.uint8(3)).reshape(n, -1) << np.uint8(4))
    sc, d = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32), _f16(b[:, 208:210])
    return Blocks("int6", q, d * sc, None, 32, (sc, d, None, None))


def _q3_k(b):
    n = b.shape[0]
    hmask, qs, scales, d = b[:, :32], b[:, 32:96], b[:, 96:108], b[:, 108:110]
    lo = (scales[:, :8].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    hi = (scales[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sc = ((lo & np.uint8(0x0F)) | ((hi & np.uint8(3)) << np.uint8(4))).astype(np.int8) - np.int8(32)
    ql = qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    qh = hmask.reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    ql = ql.reshape(n, 16, 16) & np.uint8(3)
    qh = (qh.reshape(n, 16, 16) & np.uint8(1)) ^ np.uint8(1)  # the offset applies where the mask bit is 0
    q = (ql.astype(np.int8) - (qh << np.uint8(2)).astype(np.int8)).reshape(n, QK_K)
    return Blocks("int8", q, _f16(d) * sc.astype(np.float32), None)


def _iq4_nl(b):
    return Blocks("int8", IQ4_VALUES[_nibbles(b[:, 2:], 32)], _f16(b[:, :2]), None)


def _iq4_xs(b):
    n = b.shape[0]
    scales_h = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)
    lo = (b[:, 4:8].reshape(n, -1, 1) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2)).reshape(n, -1)
    hi = (scales_h.reshape(n, 1, -1) >> np.arange(0, 16, 2, dtype=np.uint16).reshape(1, -1, 1)).reshape(n, -1)
    ls = ((lo & np.uint8(0x0F)) | ((hi.astype(np.uint8) & np.uint8(3)) << np.uint8(4))).astype(np.int8) - np.int8(32)
    return Blocks("int8", IQ4_VALUES[_nibbles(b[:, 8:], 32)], _f16(b[:, :2]) * ls.astype(np.float32), None)


# type name -> (weights per block, bytes per block, decoder)
DECODERS = {
    "Q4_0": (32, 18, _q4_0), "Q4_1": (32, 20, _q4_1), "Q5_0": (32, 22, _q5_0), "Q5_1": (32, 24, _q5_1),
    "Q8_0": (32, 34, _q8_0), "Q3_K": (QK_K, 110, _q3_k), "Q4_K": (QK_K, 144, _q4_k), "Q5_K": (QK_K, 176, _q5_k),
    "Q6_K": (QK_K, 210, _q6_k), "IQ4_NL": (32, 18, _iq4_nl), "IQ4_XS": (QK_K, 136, _iq4_xs),
}
FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED = (*FLOAT_TYPES, *DECODERS)


class UnsupportedTensorError(ValueError):
    """A GGUF tensor whose type the engine cannot keep as it is."""


def decode(type_name: str, data: np.ndarray, n: int, k: int) -> Blocks:
    """One GGUF tensor's rows -> its Blocks, every array per row ([n, k], [n, k / group], ...)."""
    block, size, fn = DECODERS[type_name]
    out = fn(np.ascontiguousarray(data).reshape(-1, size))
    rows = lambda a: None if a is None else np.ascontiguousarray(a).reshape(n, -1)  # noqa: E731
    return out._replace(q=out.q.reshape(n, k), d=rows(out.d), m=rows(out.m),
                        factors=None if out.factors is None else tuple(rows(f) for f in out.factors))


def float_tensor(type_name: str, data: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    if type_name == "BF16":  # bfloat16 bits widened to fp32 (exact), as gguf does
        data = (np.ascontiguousarray(data).view(np.int16).astype(np.int32) << 16).view(np.float32)
    return torch.from_numpy(np.array(data, dtype=np.float32 if type_name != "F16" else np.float16)).reshape(shape)


def to_weight(name: str, type_name: str, data: np.ndarray, shape: tuple[int, ...]):
    """A GGUF tensor (``data`` as GGUFReader maps it, ``shape`` in torch order [out, in]) -> a float tensor, or an
    Int4Weight / Int8Weight / IntNWeight holding the file's own codes and scales."""
    if type_name in FLOAT_TYPES:
        return float_tensor(type_name, data, shape)
    if type_name not in DECODERS:
        raise UnsupportedTensorError(
            f"GGUF tensor {name!r} has type {type_name}, which the engine does not serve (supported: "
            f"{', '.join(SUPPORTED)}); requantize the file with llama.cpp's llama-quantize to one of them")
    if len(shape) != 2:
        raise UnsupportedTensorError(f"GGUF tensor {name!r} ({type_name}) has shape {list(shape)}: quantized "
                                     "tensors are served as matrices only")
    n, k = shape
    block = DECODERS[type_name][0]
    if k % block:
        raise UnsupportedTensorError(f"GGUF tensor {name!r} ({type_name}): rows of {k} are not whole {block}-blocks")
    out = decode(type_name, data, n, k)
    t = lambda a: None if a is None else torch.from_numpy(a)  # noqa: E731
    codes, d_t, m_t = t(out.q), t(out.d), t(out.m)
    factors = None if out.factors is None else tuple(t(f) for f in out.factors)
    if out.kind == "int4":
        return Int4Weight.from_blocks(codes, d_t, m_t, factors=factors)
    if out.kind in ("int5", "int6"):
        return IntNWeight.from_blocks(codes, d_t, m_t, int(out.kind[3]), out.zero, factors=factors)
    return Int8Weight.from_blocks(codes, d_t, m_t)
