"""build_scripts/build_demo_model.py: the checkpoint loads in stock transformers, the tokenizer is
byte-level and lossless, the chat template renders, builds are deterministic, cached and atomic.

A tiny configuration (a few training steps on a small corpus slice) keeps this to seconds.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

_SCRIPT = Path(__file__).resolve().parents[2] / "build_scripts" / "build_demo_model.py"
_spec = importlib.util.spec_from_file_location("build_demo_model", _SCRIPT)
bdm = importlib.util.module_from_spec(_spec)
sys.modules["build_demo_model"] = bdm  # dataclasses resolve their module through sys.modules
_spec.loader.exec_module(bdm)

TINY = dict(steps=3, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, vocab=1024,
            seq_len=32, batch=2, corpus_chars=200_000)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return bdm.build_demo_model(root / "demo", **TINY)


def test_checkpoint_files_and_config(demo):
    names = {p.name for p in demo.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", bdm.STAMP} <= names
    # Built in a temp sibling and renamed: only the lock file may be left next to the output.
    assert sorted(p.name for p in demo.parent.iterdir()) == [".demo.lock", "demo"]
    cfg = json.loads((demo / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert cfg["max_position_embeddings"] >= 2048
    assert cfg["torch_dtype"] == "float32" and cfg["rope_theta"] == 10000.0
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (bdm.BOS_ID, bdm.EOS_ID)
    weights = load_file(demo / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in weights.values())
    assert weights["lm_head.weight"].shape == (1024, 64)


def test_loads_and_generates_with_transformers(demo):
    tok = AutoTokenizer.from_pretrained(demo)
    model = AutoModelForCausalLM.from_pretrained(demo).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    ids = tok("The", return_tensors="pt").input_ids
    assert ids[0, 0].item() == bdm.BOS_ID  # Llama convention: bos prepended, no eos appended
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                             do_sample=False, pad_token_id=bdm.PAD_ID)
    assert out.shape == (1, ids.shape[1] + 5)
    report = json.loads((demo / "build_report.json").read_text())
    assert report["steps_run"] == 3 and report["parameters"] == model.num_parameters()


def test_tokenizer_round_trips_multibyte_utf8(demo):
    tok = AutoTokenizer.from_pretrained(demo)
    for text in ["héllo 世界 🙂", "  two spaces\tand\ttabs\n", "Ωμέγα — ½ ∑ \u200b"]:
        ids = tok(text, add_special_tokens=False).input_ids
        assert tok.unk_token_id not in ids  # byte-level: never unknown
        assert tok.decode(ids) == text
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == ("<s>", "</s>", "<pad>", "<unk>")
    assert tok.convert_tokens_to_ids(["<|user|>", "<|assistant|>"]) == [5, 6]


def test_chat_template_renders(demo):
    tok = AutoTokenizer.from_pretrained(demo)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<s><|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids[:2] == [bdm.BOS_ID, 4] and ids.count(bdm.EOS_ID) == 2  # markers are single tokens


def test_stamp_makes_rebuild_a_noop(demo, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in demo.iterdir()}
    assert bdm.is_up_to_date(demo, bdm.BuildArgs(**TINY))
    assert bdm.build_demo_model(demo, **TINY) == demo
    assert "up to date" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in demo.iterdir()} == before
    assert not bdm.is_up_to_date(demo, bdm.BuildArgs(**{**TINY, "seed": 1}))


def test_build_is_deterministic_and_clears_killed_builds(demo, tmp_path):
    (tmp_path / ".again.tmp-killed").mkdir()  # what a build killed mid-way leaves behind
    (tmp_path / ".again.tmp-killed" / "model.safetensors").write_bytes(b"half")
    again = bdm.build_demo_model(tmp_path / "again", **TINY)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".again.lock", "again"]
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (demo / name).read_bytes(), name
