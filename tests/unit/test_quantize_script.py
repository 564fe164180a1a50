"""build_scripts/quantize.py: activation-aware scaling keeps the float model, never does worse than RTN on
the calibration data, and writes checkpoints (AWQ by our packer, compressed-tensors by the library) that the
engine serves token for token as transformers serves their dequantized weights; the demo's INT4 variant."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[2]
import quantize  # noqa: E402

from tritonllm.engine.loader import checkpoint_quantization, load_weights  # noqa: E402
from tritonllm.engine.quant import Int8Weight  # noqa: E402
from tritonllm.engine.quant_formats import load_prequantized  # noqa: E402

from engine_helpers import engine_greedy, hf_greedy, make_checkpoint  # noqa: E402

SHAPE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, vocab_size=211)
PROMPT = [5, 17, 33, 8, 90, 41, 7, 12, 150, 3]
TOY = ROOT / "build" / "models" / "toy"
TOY_INT4 = ROOT / "build" / "models" / "toy-int4-awq"


def _with_tokenizer(path: Path) -> Path:
    """A word-level tokenizer over the tiny model's vocabulary (w0 .. w210) and calibration text in it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(SHAPE["vocab_size"])}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    rng = random.Random(0)
    (path / "calib.txt").write_text(" ".join(f"w{rng.randrange(3, 211)}" for _ in range(4096)))
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return _with_tokenizer(Path(make_checkpoint(tmp_path_factory.mktemp("llama"), "llama", **SHAPE)))


def _args(ckpt: Path, **kw):
    p = dict(model=ckpt, bits=4, group_size=32, symmetric=False, format="awq", method="awq",
             calib=str(ckpt / "calib.txt"), calib_samples=8, calib_len=64)
    p.update(kw)
    return type("Args", (), p)()


@pytest.mark.parametrize("arch,kv_heads", [("llama", 4), ("llama", 2), ("qwen2", 2), ("qwen3", 2)])
def test_awq_scaling_keeps_the_float_model_and_beats_rtn_on_the_calibration_data(tmp_path, arch, kv_heads):
    """qwen2: q/k/v biases and a tied LM head; qwen3: q/k norms after the projections."""
    import transformers as tf

    path = _with_tokenizer(Path(make_checkpoint(tmp_path / "m", arch, **{**SHAPE, "num_key_value_heads": kv_heads})))
    a = _args(path)
    model = tf.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = quantize.calibration_ids(path, a.calib, a.calib_samples, a.calib_len)
    with torch.no_grad():
        before = model(ids[:2]).logits
    stats = quantize.collect(model, ids)
    report, clips = [], {}
    for i, layer in enumerate(model.model.layers):
        clips.update(quantize.awq_layer(layer, f"model.layers.{i}", stats, a, kv_heads != 4, report))
    with torch.no_grad():
        after = model(ids[:2]).logits
    assert torch.allclose(after, before, rtol=1e-4, atol=1e-4 * float(before.abs().max()))
    groups = [e["group"] for e in report]
    assert groups.count("o") == (2 if kv_heads == 4 else 0)                # v -> o only where heads are not grouped
    assert all(e["scaled_mse"] <= e["rtn_mse"] for e in report)             # a = 0 is RTN: never worse
    assert sum(e["scaled_mse"] for e in report) < sum(e["rtn_mse"] for e in report)
    assert set(n.rsplit(".", 1)[-1] for n in clips) == {"v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert all(((c >= 0.5 - 1e-6) & (c <= 1.0)).all() for c in clips.values())


def _dequantized_reference(qdir: Path, base: Path, dst: Path) -> str:
    """A float checkpoint of the quantized one's dequantized weights (and the engine's int8 LM head)."""
    shutil.copytree(base, dst)
    weights = load_prequantized(load_weights(str(qdir)), checkpoint_quantization(str(qdir)))
    tensors = {k: (v.dequant() if hasattr(v, "dequant") else v).contiguous() for k, v in weights.items()}
    head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
    tensors["lm_head.weight"] = Int8Weight(head).dequant()
    save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


@pytest.mark.parametrize("argv,method,bits", [
    (["--method", "awq"], "awq", 4),
    (["--format", "compressed-tensors", "--bits", "8", "--group-size", "-1", "--symmetric", "--method", "rtn"],
     "compressed-tensors", 8),
    (["--format", "compressed-tensors", "--bits", "4", "--method", "awq"], "compressed-tensors", 4),
])
def test_written_checkpoints_are_served_as_hf_serves_their_dequantized_weights(ckpt, tmp_path, argv, method, bits):
    if method == "compressed-tensors":
        import compressed_tensors  # noqa: F401  (the test extra installs it)
    out = tmp_path / "q"
    assert quantize.main(["--model", str(ckpt), "--out", str(out), "--group-size", "32", "--calib",
                          str(ckpt / "calib.txt"), "--calib-samples", "8", "--calib-len", "64", *argv]) == 0
    qcfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_method"] == method
    if method == "awq":
        assert (qcfg["bits"], qcfg["group_size"], qcfg["zero_point"], qcfg["version"]) == (4, 32, True, "gemm")
        assert {k.rsplit(".", 1)[-1] for k in load_file(str(out / "model.safetensors"))
                if "_proj." in k} == {"qweight", "qzeros", "scales"}
    else:
        assert qcfg["config_groups"]["group_0"]["weights"]["num_bits"] == bits
    report = json.loads((out / "quantize_report.json").read_text())
    assert report["method"] == ("rtn" if "rtn" in argv else "awq") and report["bits"] == bits
    assert engine_greedy(str(out), PROMPT, 12) == hf_greedy(_dequantized_reference(out, ckpt, tmp_path / "ref"), PROMPT, 12)
    # a second run finds it up to date (content stamp) and leaves it alone
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    quantize.main(["--model", str(ckpt), "--out", str(out), "--group-size", "32", "--calib", str(ckpt / "calib.txt"),
                   "--calib-samples", "8", "--calib-len", "64", *argv])
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_bad_arguments_are_refused_with_the_reason(ckpt, tmp_path, capsys):
    for argv, words in ((["--bits", "8"], "--format awq is 4-bit"), (["--group-size", "48"], "multiple of 32"),
                        (["--group-size", "96"], "must divide")):
        with pytest.raises(SystemExit) as e:
            quantize.main(["--model", str(ckpt), "--out", str(tmp_path / "x"), "--method", "rtn", *argv])
        assert words in capsys.readouterr().err + str(e.value.code)
        assert not (tmp_path / "x").exists()


def test_the_toy_int4_variant_is_awq_and_served_as_hf_serves_its_dequantized_weights(tmp_path):
    """build_all.py --toy (what `make test` runs first) wrote it: a missing variant fails here, it is not skipped."""
    assert (TOY_INT4 / "config.json").is_file(), "run build_scripts/build_all.py --toy (make test does)"
    report = json.loads((TOY_INT4 / "quantize_report.json").read_text())
    assert (report["method"], report["format"], report["bits"], report["group_size"]) == ("awq", "awq", 4, 64)
    assert report["layers"] and all(e["scaled_mse"] <= e["rtn_mse"] for e in report["layers"])
    assert engine_greedy(str(TOY_INT4), PROMPT, 12) == hf_greedy(_dequantized_reference(TOY_INT4, TOY, tmp_path / "ref"),
                                                                  PROMPT, 12)
