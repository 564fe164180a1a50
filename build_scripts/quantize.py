"""Hugging Face checkpoint -> INT4 / INT8 checkpoint in a standard format, with activation-aware scaling.

    python build_scripts/quantize.py --model build/models/demo --out build/models/demo-int4-awq \
        [--bits 4] [--group-size 128] [--format awq | compressed-tensors] [--method awq | rtn] \
        [--calib demo | FILE.txt] [--calib-samples 32] [--calib-len 256]

Formats (read back by the engine, engine/quant_formats.py, and by vLLM / TensorRT-LLM / transformers):
- ``awq``: AutoAWQ GEMM packing, 4 bits, asymmetric (zero points), ``quant_method: awq`` (our packer,
  engine/quant_writer.py, checked against a second dequantizer in the tests);
- ``compressed-tensors``: ``pack-quantized`` as llm-compressor writes it, 4 or 8 bits, written by the
  compressed-tensors library itself (its ModelCompressor packs and saves; the scales and zero points are ours).

Methods:
- ``rtn``: round to nearest per group (per output channel when --group-size -1).
- ``awq`` (activation-aware weight quantization, Lin et al. 2023, as AutoAWQ applies it): the float model
  runs the calibration text once; for each layer's input groups (q/k/v after input_layernorm, gate/up after
  post_attention_layernorm, down_proj after up_proj, o_proj after v_proj where heads are not grouped) a
  per-input-channel scale s = mean|x|^a is searched over a in [0, 1), minimising the error of the quantized
  outputs on the calibration activations; the weights' columns are multiplied by s and the preceding norm
  (or projection rows) divided by it, so the float model is unchanged and salient channels lose less to
  rounding. Then each group's clipping range is searched (shrink 1.0 .. 0.5, q/k excepted, as AutoAWQ)
  against the same error. a = 0 and shrink 1.0 are plain RTN, so the search never does worse than RTN on the
  calibration data; the report gives both errors per layer (``quantize_report.json`` in the output).

Scope: Llama-family decoders (q/k/v/o, gate/up/down projections; Llama, Mistral, Qwen2, Qwen3). The LM head
and embeddings stay in the checkpoint's dtype (the engine quantizes its LM head to int8 at load).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

import cached_build  # sibling helper (build_scripts is not a package: the script's folder is on sys.path)
from cached_build import STAMP
from tritonllm.engine.quant_writer import contiguous_groups, dequantize, pack_awq, rtn

GROUPS = (("qkv", ("q_proj", "k_proj", "v_proj")), ("o", ("o_proj",)), ("gate_up", ("gate_proj", "up_proj")),
          ("down", ("down_proj",)))
SCALE_GRID = 20
CLIP_RATIOS = [1.0 - 0.05 * i for i in range(11)]
MAX_ROWS = 1024        # calibration rows kept per input for the error (mean |x| uses every token)
NO_CLIP = ("q_proj", "k_proj")
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def log(msg: str) -> None:
    print(f"[quantize] {msg}", flush=True)


def calibration_ids(tokenizer_dir: Path, source: str, samples: int, length: int) -> torch.Tensor:
    from tokenizers import Tokenizer

    if source == "demo":
        import demo_corpus

        text = demo_corpus.load_corpus(max_chars=samples * length * 8)
    else:
        text = Path(source).read_text(encoding="utf-8", errors="replace")
    ids = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(text).ids
    if len(ids) < samples * length:
        samples = max(1, len(ids) // length)
        if len(ids) < length:
            raise SystemExit(f"calibration text has {len(ids)} tokens; need at least --calib-len {length}")
    stride = len(ids) // samples
    return torch.tensor([ids[i * stride: i * stride + length] for i in range(samples)])


class Inputs:
    """Per projection input: mean |x| over every calibration token and a fixed subsample of rows."""

    def __init__(self) -> None:
        self.abs_sum, self.count, self.rows = None, 0, []

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()
        self.abs_sum = x.abs().sum(0) if self.abs_sum is None else self.abs_sum + x.abs().sum(0)
        self.count += x.shape[0]
        self.rows.append(x[:: max(1, x.shape[0] // 64)])

    def mean_abs(self) -> torch.Tensor:
        return self.abs_sum / self.count

    def sample(self) -> torch.Tensor:
        x = torch.cat(self.rows)
        return x[torch.linspace(0, x.shape[0] - 1, min(MAX_ROWS, x.shape[0])).long()]


def collect(model, ids: torch.Tensor) -> dict[str, Inputs]:
    stats: dict[str, Inputs] = {}
    hooks = []
    for name, mod in model.named_modules():
        if name.rsplit(".", 1)[-1] in ("q_proj", "o_proj", "gate_proj", "down_proj"):
            stats[name] = Inputs()
            hooks.append(mod.register_forward_pre_hook(lambda m, a, n=name: stats[n].add(a[0])))
    with torch.no_grad():
        for row in ids:
            model(row[None])
    for h in hooks:
        h.remove()
    return stats


def _qdq(w: torch.Tensor, cols, a, clip=None) -> torch.Tensor:
    codes, s, z = rtn(w, cols, a.bits, a.symmetric, clip)
    return dequantize(codes, s, z, cols)


def search_scale(ws: list[torch.Tensor], x: torch.Tensor, mean_abs: torch.Tensor, cols, a) -> tuple:
    """(s, error with s, error of plain RTN); error = mean squared output difference on x."""
    w = torch.cat(ws)
    ref = x @ w.t()
    best = (float("inf"), torch.ones_like(mean_abs))
    rtn_err = None
    for i in range(SCALE_GRID):
        s = mean_abs.pow(i / SCALE_GRID).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        err = float(((x @ (_qdq(w * s, cols, a) / s).t() - ref) ** 2).mean())
        rtn_err = err if i == 0 else rtn_err
        if err < best[0]:
            best = (err, s)
    return best[1], best[0], rtn_err


def search_clip(w: torch.Tensor, x: torch.Tensor, cols, a) -> torch.Tensor:
    """Per (output row, group) shrink of the range, minimising that group's share of the output error."""
    xg = x[:, cols]                                                       # [n, groups, gs]
    best_err = torch.full((w.shape[0], cols.shape[0]), float("inf"))
    best = torch.ones_like(best_err)
    for r in CLIP_RATIOS:
        clip = torch.full_like(best, r)
        dw = (_qdq(w, cols, a, clip) - w)[:, cols]                       # [out, groups, gs]
        err = torch.einsum("ngk,ogk->ogn", xg, dw).pow(2).sum(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, clip, best)
    return best


def awq_layer(layer, prefix: str, stats: dict[str, Inputs], a, heads_grouped: bool, report: list) -> dict:
    """Scales one decoder layer's projections (into the preceding ops) and returns their clip ranges
    {projection name: [out, groups]}; records the calibration errors of RTN and of the scaled weights."""
    attn, mlp = layer.self_attn, layer.mlp
    prev = {"qkv": (layer.input_layernorm, None), "gate_up": (layer.post_attention_layernorm, None),
            "down": (mlp.up_proj, "rows"), "o": (attn.v_proj, "rows")}
    owner = {"qkv": ("self_attn", attn), "o": ("self_attn", attn), "gate_up": ("mlp", mlp), "down": ("mlp", mlp)}
    inputs = {}
    for group, names in GROUPS:
        where, parent = owner[group]
        mods = [getattr(parent, n) for n in names]
        st = stats[f"{prefix}.{where}.{names[0]}"]
        x = st.sample()
        cols = contiguous_groups(x.shape[1], a.group_size)
        if group == "o" and heads_grouped:
            # v_proj's rows feed several heads' o_proj inputs: no one scale per channel (AutoAWQ skips it too)
            inputs[f"{prefix}.{where}.o_proj"] = x
            continue
        s, err, rtn_err = search_scale([m.weight.data.float() for m in mods], x, st.mean_abs(), cols, a)
        with torch.no_grad():
            for m in mods:
                m.weight.mul_(s.to(m.weight.dtype))
            op, kind = prev[group]
            if kind == "rows":
                op.weight.div_(s[:, None].to(op.weight.dtype))
                if getattr(op, "bias", None) is not None:
                    op.bias.div_(s.to(op.bias.dtype))
            else:
                op.weight.div_(s.to(op.weight.dtype))
        for n in names:
            inputs[f"{prefix}.{where}.{n}"] = x / s
        report.append({"layer": prefix, "group": group, "rtn_mse": rtn_err, "scaled_mse": err})
    clips = {}
    for name, x in inputs.items():
        if name.rsplit(".", 1)[-1] in NO_CLIP:
            continue
        w = layer.get_submodule(name[len(prefix) + 1:]).weight.data.float()
        clips[name] = search_clip(w, x, contiguous_groups(w.shape[1], a.group_size), a)
    return clips


def projections(model):
    return [(n, m) for n, m in model.named_modules() if n.rsplit(".", 1)[-1].endswith("_proj")]


def quantize_model(model, a, clips: dict) -> dict[str, tuple]:
    """name -> (codes, scales, zeros, cols) of every projection, in the model's current (scaled) weights."""
    out = {}
    for name, mod in projections(model):
        w = mod.weight.data.float()
        cols = contiguous_groups(w.shape[1], a.group_size)
        out[name] = (*rtn(w, cols, a.bits, a.symmetric, clips.get(name)), cols)
    return out


def write_awq(model, q: dict, out: Path, a) -> dict:
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()
               if not (k.endswith("_proj.weight") and k[: -len(".weight")] in q)}
    if getattr(model.config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    for name, (codes, s, z, _) in q.items():
        tensors.update({f"{name}.{k}": v for k, v in pack_awq(codes, s, z).items()})
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return {"quant_method": "awq", "bits": 4, "group_size": a.group_size, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": None}


def write_compressed_tensors(model, q: dict, out: Path, a) -> dict:
    """The library packs and saves; the scales and zero points it packs with are ours."""
    try:
        from compressed_tensors.compressors import ModelCompressor
        from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                     QuantizationStatus, apply_quantization_config)
    except ImportError as e:
        raise SystemExit(f"--format compressed-tensors needs the compressed-tensors package ({e}): "
                         "pip install compressed-tensors") from e
    strategy = {"strategy": "channel"} if a.group_size == -1 else {"strategy": "group", "group_size": a.group_size}
    args = QuantizationArgs(num_bits=a.bits, type="int", symmetric=a.symmetric, **strategy)
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)}, ignore=["lm_head"],
        quantization_status=QuantizationStatus.INITIALIZED))
    offset = 1 << (a.bits - 1)
    for name, (codes, s, z, _) in q.items():
        mod = model.get_submodule(name)
        mod.weight_scale.data = s.reshape(mod.weight_scale.shape).to(mod.weight_scale.dtype)
        if hasattr(mod, "weight_zero_point"):
            mod.weight_zero_point.data = (z - offset).reshape(mod.weight_zero_point.shape).to(mod.weight_zero_point.dtype)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    return json.loads((out / "config.json").read_text())["quantization_config"]


def verify(out: Path, q: dict) -> None:
    """The written checkpoint, read back by the engine's reader, holds exactly our codes' weights."""
    from tritonllm.engine.loader import checkpoint_quantization, load_weights
    from tritonllm.engine.quant_formats import load_prequantized

    weights = load_prequantized(load_weights(str(out)), checkpoint_quantization(str(out)))
    for name, (codes, s, z, cols) in q.items():
        if not torch.equal(weights[f"{name}.weight"].dequant(), dequantize(codes, s, z, cols)):
            raise SystemExit(f"{out}: {name} does not read back as written")


def quantize_checkpoint(a, out: Path) -> dict:
    """Writes the quantized checkpoint of ``a.model`` into ``out`` (a fresh folder); returns the report."""
    import transformers as tf

    start = time.monotonic()
    cfg = json.loads((a.model / "config.json").read_text())
    if "quantization_config" in cfg:
        raise SystemExit(f"{a.model} is already quantized ({cfg['quantization_config'].get('quant_method')})")
    if cfg.get("model_type") not in MODEL_TYPES:
        raise SystemExit(f"model_type {cfg.get('model_type')!r}: only {MODEL_TYPES} are supported (their norms are "
                         "x * w right before the projections, so scales fold into them)")
    model = tf.AutoModelForCausalLM.from_pretrained(str(a.model), dtype=torch.float32).eval()
    layers = model.model.layers
    sizes = sorted({m.weight.shape[1] for _, m in projections(model)})
    if a.group_size != -1 and any(k % a.group_size for k in sizes):
        raise SystemExit(f"--group-size {a.group_size} must divide every projection's input size {sizes}")
    report, clips = [], {}
    if a.method == "awq":
        ids = calibration_ids(a.model, a.calib, a.calib_samples, a.calib_len)
        log(f"calibration: {ids.numel()} tokens ({ids.shape[0]} x {ids.shape[1]}) from {a.calib}")
        with torch.no_grad():
            before = model(ids[:1]).logits
        stats = collect(model, ids)
        grouped = model.config.num_key_value_heads != model.config.num_attention_heads
        for i, layer in enumerate(layers):
            clips.update(awq_layer(layer, f"model.layers.{i}", stats, a, grouped, report))
            r = [e for e in report if e["layer"] == f"model.layers.{i}"]
            log(f"layer {i + 1}/{len(layers)}: output MSE vs RTN " +
                ", ".join(f"{e['group']} {e['scaled_mse'] / max(e['rtn_mse'], 1e-30):.2f}x" for e in r))
        with torch.no_grad():
            after = model(ids[:1]).logits
        if not torch.allclose(after, before, rtol=1e-3, atol=1e-3 * float(before.abs().max())):
            raise SystemExit(f"the scaled float model's logits moved by {float((after - before).abs().max()):.3g}: "
                             "not written")
    q = quantize_model(model, a, clips)
    writer = write_awq if a.format == "awq" else write_compressed_tensors
    qcfg = writer(model, q, out, a)
    for f in a.model.iterdir():  # tokenizer, generation config, chat template: everything but the weights
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json", STAMP, "report.json")) \
                and not (f.name == "config.json" and a.format == "compressed-tensors"):
            shutil.copy(f, out / f.name)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = qcfg
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    verify(out, q)
    summary = {"format": a.format, "method": a.method, "bits": a.bits, "group_size": a.group_size,
               "symmetric": a.symmetric, "calib": a.calib if a.method == "awq" else None,
               "calib_tokens": int(ids.numel()) if a.method == "awq" else 0, "layers": report,
               "seconds": round(time.monotonic() - start, 1)}
    (out / "quantize_report.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"wrote {a.format}, {a.bits}-bit, group {a.group_size}, {a.method} in {summary['seconds']} s")
    return summary


def _stamp(a) -> str:
    """Everything the output depends on: the sources that write it, the input checkpoint, the arguments."""
    h = hashlib.sha256()
    for src in (Path(__file__), ROOT / "backends/tritonllm/engine/quant_writer.py",
                ROOT / "backends/tritonllm/engine/quant_formats.py"):
        h.update(src.read_bytes())
    base_stamp = a.model / STAMP
    h.update(base_stamp.read_bytes() if base_stamp.is_file() else
             b"".join(f.read_bytes() for f in sorted(a.model.glob("*.safetensors"))))
    if a.method == "awq":  # the calibration text itself, as tokens (the demo corpus or a file may change)
        h.update(calibration_ids(a.model, a.calib, a.calib_samples, a.calib_len).numpy().tobytes())
    h.update(json.dumps({k: str(v) for k, v in sorted(vars(a).items()) if k not in ("out", "force")}).encode())
    return h.hexdigest()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, help="HF checkpoint folder (config.json, safetensors)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--bits", type=int, choices=(4, 8), default=4)
    p.add_argument("--group-size", type=int, default=128, help="inputs per scale (-1: one per output channel)")
    p.add_argument("--symmetric", action="store_true", help="no zero points (compressed-tensors only)")
    p.add_argument("--format", choices=("awq", "compressed-tensors"), default="awq")
    p.add_argument("--method", choices=("awq", "rtn"), default="awq")
    p.add_argument("--calib", default="demo", help="'demo' (the demo corpus) or a UTF-8 text file")
    p.add_argument("--calib-samples", type=int, default=32)
    p.add_argument("--calib-len", type=int, default=256)
    p.add_argument("--force", action="store_true", help="rebuild even when the output is up to date")
    a = p.parse_args(argv)
    if a.format == "awq" and (a.bits != 4 or a.symmetric):
        p.error("--format awq is 4-bit with zero points (AutoAWQ GEMM): use --format compressed-tensors")
    if a.group_size != -1 and (a.group_size <= 0 or a.group_size % 32):
        p.error("--group-size must be a multiple of 32 (the engine's block) or -1")
    if not (a.model / "config.json").is_file():
        p.error(f"--model {a.model}: no config.json")
    a.model = a.model.resolve()
    built = cached_build.build_atomically(a.out, _stamp(a), ("config.json", "quantize_report.json"),
                                          lambda tmp: quantize_checkpoint(a, tmp), force=a.force)
    print(f"{a.out}: {'built' if built else 'up to date'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
