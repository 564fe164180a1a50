"""The Llama-family transformer over a paged KV cache: every architecture of ``models.ARCHITECTURES``
(Llama 2/3/3.1, Mistral, Qwen2/2.5, Qwen3, Phi-3, Gemma), each read through its ``Architecture``.

Numerics follow transformers' reference code (RMSNorm in fp32, rotate-half RoPE with HF's inverse
frequencies, SDPA attention) so that greedy decoding in fp32 matches HF token for token. On fp32 CPU the
native kernels (cpu_kernels.py) replace the matmuls of few rows, norms, SiLU-gate, RoPE + KV write and
decode attention: same formulas, different summation order (~1e-6 relative), greedy parity tested. Projections are
fused (qkv, gate+up) to cut per-layer kernel launches; each output column is still one dot product.
Gathers use index_select / index_copy_: on CPU, advanced indexing (`t[idx]`) takes a slow multi-threaded
path that was measured 300x slower for the small gathers of decode attention.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import cpu_kernels as native_kernels
from . import fused_decode
from .fp8 import FP8Weight, wants_scaled_mm
from .kv_quant import load, store
from .quant import Int4Weight, Int8Weight, RowStack, quantize
from .quant_nbit import IntNWeight
from .hf_config import ModelSpec, rope_inv_freq
from .lora import LoraSet


@dataclass
class AttentionMeta:
    """Per-step layout of the flat token batch, shared by all layers.

    Sequences with one new token (decodes) are attended together through a padded gather;
    sequences with several new tokens (prefill chunks) are attended one by one.
    """

    slot_mapping: torch.Tensor                 # [T] cache slot of every new token
    decode_rows: torch.Tensor | None           # [Bd] flat token index of each decode
    decode_gather: torch.Tensor | None         # [Bd, Kmax] cache slots to read (padded)
    decode_mask: torch.Tensor | None           # [Bd, 1, 1, Kmax] True where a key is visible
    prefills: list[tuple[int, int, torch.Tensor, torch.Tensor]]  # (start, q_len, gather [K], mask [q, K])
    lora: list = field(default_factory=list)   # (LoraAdapter, token rows or None for all) per adapter
    decode_lo: torch.Tensor | None = None      # [Bd] first visible key (sliding window), as in decode_mask
    decode_hi: torch.Tensor | None = None      # [Bd] one past the last visible key


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)   # fewer ops; bitwise HF's form in our tests
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _fuse(parts: list):
    """Rows of projections over one input: float tensors, or a checkpoint's Int4 / Int8 / IntNWeights (GGUF mixes
    them within a layer, e.g. Q4_K q / k with a Q6_K v: one RowStack)."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts, 0).contiguous()
    for cls in (Int4Weight, Int8Weight, IntNWeight):
        if all(type(p) is cls for p in parts):
            return cls.cat(parts)
    if not any(isinstance(p, torch.Tensor) for p in parts):  # neighbours of one class fuse: fewer kernel calls
        runs: list[list] = []
        for p in parts:
            if runs and type(runs[-1][0]) is type(p):
                runs[-1].append(p)
            else:
                runs.append([p])
        return RowStack([run[0] if len(run) == 1 else type(run[0]).cat(run) for run in runs])
    raise ValueError("a fused projection mixes quantized and float weights")


class Layer:
    def __init__(self, w: dict[str, torch.Tensor], spec: ModelSpec) -> None:
        self.ln1 = w["input_layernorm.weight"]
        self.ln2 = w["post_attention_layernorm.weight"]
        arch = spec.arch
        self.qkv = _fuse([w[f"self_attn.{p}.weight"] for p in arch.qkv])
        self.qkv_b = None
        if spec.attention_bias:
            self.qkv_b = torch.cat([w[f"self_attn.{p}.bias"] for p in arch.qkv], 0).contiguous()
        self.o = w["self_attn.o_proj.weight"]
        self.o_b = w.get("self_attn.o_proj.bias")
        self.q_norm = w.get("self_attn.q_norm.weight")
        self.k_norm = w.get("self_attn.k_norm.weight")
        self.gate_up = _fuse([w[f"mlp.{p}.weight"] for p in arch.gate_up])
        self.gate_up_b = None
        if spec.mlp_bias:
            self.gate_up_b = torch.cat([w[f"mlp.{p}.bias"] for p in arch.gate_up], 0)
        self.down = w["mlp.down_proj.weight"]
        self.down_b = w.get("mlp.down_proj.bias")


class Transformer:
    """Weights + forward. Not an nn.Module: inference only, no autograd, no hooks."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, fp8_weights: bool = False, fp8_matmul: str = "auto",
                 cpu_kernels: str = "auto", quantization: str = "none", quant_group_size: int = 32,
                 activation_quantization: str = "none") -> None:
        self.spec = spec
        self.kv_scale = 1.0
        self.device = device
        self.dtype = dtype
        if spec.norm_offset:  # folded once, in fp32 as transformers adds it (Gemma: x * (1 + w))
            weights = {k: v.float() + spec.norm_offset if k.endswith("norm.weight") else v for k, v in weights.items()}
        w = {k: v.to(device=device, dtype=dtype).contiguous() if isinstance(v, torch.Tensor) else v.to(device)
             for k, v in weights.items()}
        self.embed_scale = (torch.tensor(spec.embed_scale, dtype=dtype, device=device)
                            if spec.embed_scale is not None else None)
        self.native = native_kernels.select(cpu_kernels, device, dtype)
        self.linear = native_kernels.make_linear(self.native)
        self.embed = w["model.embed_tokens.weight"]
        self.norm = w["model.norm.weight"]
        self.lm_head = self.embed if spec.tie_word_embeddings else w.get("lm_head.weight", self.embed)
        self.layers = []
        scaled = fp8_weights and wants_scaled_mm(fp8_matmul, device)
        for i in range(spec.num_layers):
            prefix = f"model.layers.{i}."
            self.layers.append(Layer({k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}, spec))
            if fp8_weights:
                for name in ("qkv", "o", "gate_up", "down"):
                    setattr(self.layers[-1], name, FP8Weight(getattr(self.layers[-1], name), scaled,
                                                             None if scaled else self.native))
            elif quantization in ("int8", "int4", "int4_sym"):
                mode, sym = quantization[:4], quantization.endswith("_sym")
                for name in ("qkv", "o", "gate_up", "down"):
                    weight = getattr(self.layers[-1], name)
                    if isinstance(weight, torch.Tensor):
                        setattr(self.layers[-1], name, quantize(weight, mode, quant_group_size, sym, self.native))
        if quantization in ("int8", "int4", "int4_sym") and isinstance(self.lm_head, torch.Tensor):
            self.lm_head = quantize(self.lm_head, "int8", native=self.native)  # the largest matrix of small models
        for weight in self._quantized():  # codes and scales: at load, or a checkpoint's own (AWQ / GPTQ / GGUF ...)
            weight.use_kernels(self.native, int8_activations=activation_quantization == "int8")
        self.activation_quantization = activation_quantization  # as resolved (loader.activation_mode)
        inv_freq, self.rope_scale = rope_inv_freq(spec, device)
        self.inv_freq = inv_freq.to(device=device, dtype=torch.float32)
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.scale = spec.head_dim ** -0.5
        self.decode_stack = fused_decode.build(self)  # every layer of a decode step in one native call

    def _quantized(self) -> list:
        """Every weight held as codes and scales (each prepares its own native form)."""
        found = [w for layer in self.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        found += [self.embed, self.lm_head]
        return [w for w in {id(w): w for w in found}.values() if hasattr(w, "use_kernels")]

    def embed_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings; a quantized table (GGUF) dequantizes the rows it looks up."""
        if isinstance(self.embed, torch.Tensor):
            return F.embedding(input_ids, self.embed)
        return self.embed.rows(input_ids, self.dtype)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scale).to(self.dtype), (emb.sin() * self.rope_scale).to(self.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta,
                kv_k: list[torch.Tensor], kv_v: list[torch.Tensor],
                logits_rows: torch.Tensor, hidden_rows: torch.Tensor | None = None):
        """Runs the new tokens, writes their K/V into the cache; returns (fp32 logits of `logits_rows`, fp32 final
        hidden states of `hidden_rows` after the last norm, what pooling reads, or None without them)."""
        spec, linear = self.spec, self.linear
        h = self.embed_rows(input_ids)
        if self.embed_scale is not None:
            h = h * self.embed_scale
        cos2, sin2 = self.rope(positions)
        cos, sin = cos2[:, None, :], sin2[:, None, :]
        T = input_ids.shape[0]
        if self.decode_stack is not None and fused_decode.applies(meta, T, kv_k):
            self.decode_stack.run(h, kv_k, kv_v, cos2, sin2, meta.slot_mapping, meta.decode_rows, meta.decode_gather,
                                  meta.decode_lo, meta.decode_hi)
            layers = ()
        else:
            layers = self.layers
        for li, layer in enumerate(layers):
            x = self._norm(h, layer.ln1)
            qkv = linear(x, layer.qkv, layer.qkv_b)
            if meta.lora:
                LoraSet.apply(qkv, x, meta.lora, li, "qkv")
            if self.native is not None and kv_k[li].dtype in native_kernels.KV_DTYPES:
                attn = self._native_attention(qkv, layer, cos2, sin2, kv_k[li], kv_v[li], meta)
            else:
                q, k, v = self._split_heads(qkv, layer)
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
                store(kv_k[li], meta.slot_mapping, k, self.kv_scale)
                store(kv_v[li], meta.slot_mapping, v, self.kv_scale)
                attn = self._attention(q, kv_k[li], kv_v[li], meta).reshape(T, self.q_size)
            o = linear(attn, layer.o, layer.o_b)
            if meta.lora:
                LoraSet.apply(o, attn, meta.lora, li, "o")
            x = self._add_norm(h, o, layer.ln2)
            gu = linear(x, layer.gate_up, layer.gate_up_b)
            if meta.lora:
                LoraSet.apply(gu, x, meta.lora, li, "gate_up")
            act = self._act_mul(gu)
            down = linear(act, layer.down, layer.down_b)
            if meta.lora:
                LoraSet.apply(down, act, meta.lora, li, "down")
            h.add_(down)
        if hidden_rows is None:
            return self.head_logits(self._norm(h.index_select(0, logits_rows), self.norm)), None
        n = logits_rows.numel()
        normed = self._norm(h.index_select(0, torch.cat([logits_rows, hidden_rows])), self.norm)
        logits = self.head_logits(normed[:n]) if n else normed.new_empty(0, self.spec.vocab_size)
        return logits, normed[n:].float()

    def head_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """fp32 logits of final hidden states (after the last norm): what ``forward`` samples from, and what a
        scored prompt's rows (``prompt_logprobs``) turn into."""
        return self.linear(normed, self.lm_head).float()

    # One fused native call each on fp32 CPU (cpu_kernels), torch's ops elsewhere.
    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return self.native.rms_norm(x, w, self.spec.rms_norm_eps)
        return rms_norm(x, w, self.spec.rms_norm_eps)

    def _add_norm(self, h: torch.Tensor, delta: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """h += delta (in place: h is this forward's own residual stream); returns rms_norm(h)."""
        if self.native is not None:
            return self.native.add_rms_norm(h, delta, w, self.spec.rms_norm_eps)
        h.add_(delta)
        return rms_norm(h, w, self.spec.rms_norm_eps)

    def _act_mul(self, gu: torch.Tensor) -> torch.Tensor:
        """act(gate) * up of the fused gate_up rows; the native kernel computes SiLU only."""
        act = self.spec.activation
        if self.native is not None and act == "silu":
            return self.native.silu_mul(gu)
        inter = gu.shape[-1] // 2
        gate = gu[:, :inter]
        a = F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh" if act == "gelu_tanh" else "none")
        return a * gu[:, inter:]

    def _split_heads(self, qkv: torch.Tensor, layer: Layer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v head views of the fused projection; q and k normalised per head where the model says."""
        spec, T = self.spec, qkv.shape[0]
        q = qkv[:, :self.q_size].view(T, spec.num_heads, spec.head_dim)
        k = qkv[:, self.q_size:self.q_size + self.kv_size].view(T, spec.num_kv_heads, spec.head_dim)
        v = qkv[:, self.q_size + self.kv_size:].view(T, spec.num_kv_heads, spec.head_dim)
        if layer.q_norm is not None:
            q = rms_norm(q, layer.q_norm, spec.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, spec.rms_norm_eps)
        return q, k, v

    def _native_attention(self, qkv: torch.Tensor, layer: Layer, cos: torch.Tensor, sin: torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        """fp32 CPU: RoPE in place in qkv, K/V into the cache, decodes attended on the paged cache."""
        spec, T = self.spec, qkv.shape[0]
        if layer.q_norm is not None:  # Qwen3: normalised heads go back into qkv, where the kernels read them
            q, k, _ = self._split_heads(qkv, layer)
            qkv[:, :self.q_size].view_as(q).copy_(q)
            qkv[:, self.q_size:self.q_size + self.kv_size].view_as(k).copy_(k)
        self.native.rope_store(qkv, cos, sin, meta.slot_mapping, k_cache, v_cache, spec.num_heads,
                               spec.num_kv_heads)
        out = torch.empty(T, self.q_size, dtype=qkv.dtype)
        if meta.decode_rows is not None:
            self.native.decode_attention(qkv, k_cache, v_cache, meta.decode_rows, meta.decode_gather,
                                         meta.decode_lo, meta.decode_hi, self.scale, spec.num_heads, out)
        if meta.prefills:
            q = qkv[:, :self.q_size].view(T, spec.num_heads, spec.head_dim)
            self._prefill_attention(q, k_cache, v_cache, meta, out.view(T, spec.num_heads, spec.head_dim))
        return out

    def _attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   meta: AttentionMeta) -> torch.Tensor:
        out = torch.empty_like(q)
        if meta.decode_rows is not None:
            b, kmax = meta.decode_gather.shape
            flat = meta.decode_gather.reshape(-1)
            qd = q.index_select(0, meta.decode_rows).unsqueeze(2)          # [B, H, 1, D]
            kd = load(k_cache, flat, q.dtype, self.kv_scale)
            vd = load(v_cache, flat, q.dtype, self.kv_scale)
            kd = kd.view(b, kmax, *kd.shape[1:]).permute(0, 2, 1, 3)     # [B, KVH, kmax, D]
            vd = vd.view(b, kmax, *vd.shape[1:]).permute(0, 2, 1, 3)
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask,
                                                scale=self.scale, enable_gqa=True)
            out.index_copy_(0, meta.decode_rows, od.squeeze(2))
        self._prefill_attention(q, k_cache, v_cache, meta, out)
        return out

    def _prefill_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           meta: AttentionMeta, out: torch.Tensor) -> None:
        for start, n, gather, mask in meta.prefills:
            qp = q[start:start + n].transpose(0, 1).unsqueeze(0)           # [1, H, n, D]
            kp = load(k_cache, gather, q.dtype, self.kv_scale).transpose(0, 1).unsqueeze(0)  # [1,KVH,K,D]
            vp = load(v_cache, gather, q.dtype, self.kv_scale).transpose(0, 1).unsqueeze(0)
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=self.scale,
                                                enable_gqa=True)
            out[start:start + n] = op.squeeze(0).transpose(0, 1)
