"""model_files: a GGUF file's tokenizer and chat template from its metadata (converted by transformers once, then read
from the cache), its context length, and its HF view for tools that read folders (Dynamo).

On the default model's own file (SmolLM2-135M-Instruct's Q4_1 GGUF, linked by `make build`)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tritonllm import model_files as mf
from tritonllm.text.tokenizer import TextTokenizer

ROOT = Path(__file__).resolve().parents[2]
SMOL = ROOT / "build" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
needs_smol = pytest.mark.skipif(not SMOL.is_file(), reason="the default model is linked by `make build`")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONLLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A cache holding the default file's entry, converted once for the tests whose subject is not the conversion."""
    root = tmp_path_factory.mktemp("converted")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITONLLM_CACHE", str(root))
        mf.hf_folder(SMOL)
    return root


@pytest.fixture()
def warm_cache(cache, converted):
    shutil.copytree(converted, cache)
    return cache


@needs_smol
def test_the_gguf_tokenizer_is_transformers_conversion_and_is_cached(cache):
    from transformers import AutoTokenizer

    direct = AutoTokenizer.from_pretrained(str(SMOL.parent), gguf_file=SMOL.name)
    first = mf.load_hf_tokenizer(SMOL)
    entries = list((cache / "gguf-tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "tokenizer.json").is_file()
    second = mf.load_hf_tokenizer(SMOL)  # from the cache now
    text = "Hello <|im_start|>user\nwhat's 2+2? ünïcödé 😀<|im_end|>"
    assert first.encode(text) == second.encode(text) == direct.encode(text)
    assert second.chat_template == direct.chat_template and "<|im_start|>" in second.chat_template
    assert (second.eos_token, second.eos_token_id) == ("<|im_end|>", 2)


@needs_smol
def test_text_tokenizer_and_context_from_the_gguf(warm_cache):
    tok = TextTokenizer.from_dir(str(SMOL), chat_mode="auto")
    assert tok.eos_id == 2 and mf.context_length(SMOL) == 8192
    assert tok.max_prompt_bytes is not None and tok.max_prompt_bytes >= 8192
    chat = tok.encode_prompt(json.dumps([{"role": "user", "content": "Hi"}]))
    assert chat.chat and chat.text.endswith("<|im_start|>assistant\n") and chat.ids[0] == 1  # <|im_start|>


@needs_smol
def test_the_hf_view_of_a_gguf_reads_as_a_folder(warm_cache):
    folder = mf.hf_folder(SMOL)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2
    assert mf.hf_folder(ROOT) == ROOT  # a folder is its own view


def test_what_is_a_gguf(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"not a gguf")
    (tmp_path / "y.bin").write_bytes(b"GGUF\x03\x00\x00\x00")
    assert not mf.is_gguf(tmp_path / "x.gguf") and mf.is_gguf(tmp_path / "y.bin") and not mf.is_gguf(tmp_path)
    with pytest.raises(FileNotFoundError, match="tokenizer not found"):
        mf.load_hf_tokenizer(tmp_path / "missing.gguf")


@needs_smol
def test_a_damaged_cache_entry_is_rebuilt(warm_cache):
    tok = mf.load_hf_tokenizer(SMOL)
    entry = next((warm_cache / "gguf-tokenizers").iterdir())
    (entry / "tokenizer.json").unlink()
    again = mf.load_hf_tokenizer(SMOL)
    assert (entry / "tokenizer.json").is_file() and len(again) == len(tok) == 49152
