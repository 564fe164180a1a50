"""TextTokenizer: local loading, special tokens, chat template modes, eos/pad discovery."""

from __future__ import annotations

import json

import pytest

from text_helpers import byte_level
from tritonllm.text.tokenizer import TextTokenizer, load_tokenizer, parse_bool, parse_chat_messages

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    hf = byte_level()
    hf.chat_template = TEMPLATE
    path = tmp_path_factory.mktemp("tok")
    hf.save_pretrained(path)
    return str(path)


def test_load_from_directory(tok_dir):
    hf = load_tokenizer(tok_dir)
    assert hasattr(hf, "backend_tokenizer")
    assert hf.decode(hf.encode("hello world", add_special_tokens=False)) == "hello world"
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tok_dir + "/missing")


def test_plain_prompt_special_tokens(tok_dir):
    t = TextTokenizer.from_dir(tok_dir)
    bos = t.hf.bos_token_id
    with_bos = t.encode_prompt("hello world")
    assert with_bos.ids[0] == bos and not with_bos.chat
    assert t.encode_prompt("hello world", add_special_tokens=False).ids == with_bos.ids[1:]
    t_nobos = TextTokenizer.from_dir(tok_dir, add_special_tokens=False)
    assert t_nobos.encode_prompt("hello world").ids == with_bos.ids[1:]


def test_chat_modes(tok_dir):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi 🙂"}]
    as_json = json.dumps(messages, ensure_ascii=False)
    off = TextTokenizer.from_dir(tok_dir, chat_mode="off")
    assert not off.encode_prompt(as_json).chat  # off: JSON is just text
    auto = TextTokenizer.from_dir(tok_dir, chat_mode="auto")
    enc = auto.encode_prompt(as_json)
    assert enc.chat and enc.text == "<s><|system|>be brief\n<|user|>hi 🙂\n<|assistant|>"
    assert enc.ids.count(auto.hf.bos_token_id) == 1  # the template's BOS, not a second one
    assert auto.hf.decode(enc.ids, skip_special_tokens=False) == enc.text
    assert not auto.encode_prompt("plain question").chat
    on = TextTokenizer.from_dir(tok_dir, chat_mode="on")
    wrapped = on.encode_prompt("plain question")
    assert wrapped.chat and wrapped.text == "<s><|user|>plain question\n<|assistant|>"


def test_chat_errors(tok_dir):
    auto = TextTokenizer.from_dir(tok_dir, chat_mode="auto")
    with pytest.raises(ValueError, match="'content' must be a string"):
        auto.encode_prompt('[{"role": "user", "content": 3}]')
    with pytest.raises(ValueError, match="empty"):
        auto.encode_prompt("")
    with pytest.raises(ValueError, match="chat mode"):
        TextTokenizer.from_dir(tok_dir, chat_mode="sometimes")
    no_template = TextTokenizer(byte_level(), chat_mode="auto")
    with pytest.raises(ValueError, match="no chat template"):
        no_template.encode_prompt('[{"role": "user", "content": "x"}]')
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        TextTokenizer(byte_level(), chat_mode="on")


def test_parse_chat_messages():
    assert parse_chat_messages("hello") is None
    assert parse_chat_messages("[1, 2]") is None
    assert parse_chat_messages("[not json") is None
    assert parse_chat_messages('[{"role": "user", "content": "x"}]') == [{"role": "user", "content": "x"}]
    with pytest.raises(ValueError, match="'role'"):
        parse_chat_messages('[{"role": "", "content": "x"}]')


def test_eos_and_pad_ids(tok_dir, tmp_path):
    t = TextTokenizer.from_dir(tok_dir)
    assert t.eos_id == t.hf.convert_tokens_to_ids("</s>")
    assert t.pad_id == t.hf.convert_tokens_to_ids("<pad>")
    hf = byte_level()
    hf.pad_token = None
    assert TextTokenizer(hf).pad_id == TextTokenizer(hf).eos_id  # pad falls back to eos
    hf.eos_token = None
    with pytest.raises(ValueError, match="end-of-sequence"):
        TextTokenizer(hf)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9], "pad_token_id": 3}))
    found = TextTokenizer(hf, model_dir=str(tmp_path))
    assert (found.eos_id, found.pad_id) == (7, 3)


def test_parse_bool():
    assert parse_bool(None, True) is True
    assert parse_bool("${add_special_tokens}", False) is False
    assert parse_bool("Yes", False) is True
    assert parse_bool("0", True) is False
    with pytest.raises(ValueError):
        parse_bool("maybe", True)


def test_chat_mode_from_params():
    from tritonllm.text.tokenizer import chat_mode_from_params
    assert chat_mode_from_params({}) == "off"
    assert chat_mode_from_params({"apply_chat_template": "false"}) == "off"
    assert chat_mode_from_params({"apply_chat_template": "true"}) == "on"
    assert chat_mode_from_params({"apply_chat_template": "auto"}) == "auto"
    assert chat_mode_from_params({"chat_template": "auto", "apply_chat_template": "true"}) == "auto"
    assert chat_mode_from_params({"chat_template": "${chat_template}"}) == "off"
