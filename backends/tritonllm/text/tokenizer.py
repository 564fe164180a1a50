"""Load a local fast Hugging Face tokenizer and turn prompts into token ids.

Invariants:
- Only local files are read (``local_files_only=True``) and no repository code is ever executed
  (``trust_remote_code=False``): a model directory cannot run code inside the server.
- Only *fast* tokenizers (backed by the Rust ``tokenizers`` library) are accepted, because the
  incremental detokenizer decodes through ``backend_tokenizer`` for speed and exactness.
- ``encode_prompt`` never raises for valid UTF-8 text except ``ValueError`` with a message meant for
  the client (empty prompt, malformed chat messages, chat requested without a template).
- When a chat template is applied, special tokens are *not* added again by the encoder: templates
  carry their own BOS/markers, and adding them twice changes what the model sees.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

CHAT_MODES = ("off", "auto", "on")
"""off: never apply the chat template. auto: apply it only when the prompt is a JSON list of
{role, content} messages. on: always apply it; plain text becomes one user message."""


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    """Return a fast tokenizer read from ``path``: a folder (tokenizer.json + tokenizer_config.json) or a GGUF
    file (its metadata's tokenizer and chat template; ``model_files``).

    Raises FileNotFoundError when the path does not exist, ValueError when what it holds is
    not a fast tokenizer.
    """
    from ..model_files import load_hf_tokenizer

    return load_hf_tokenizer(path)


def parse_chat_messages(text: str) -> list[dict[str, str]] | None:
    """Return the messages if ``text`` is a JSON list of chat messages, else None.

    A list counts as messages when every element is an object with a "role" key; such a list with
    a non-string role/content is malformed and raises ValueError (it was clearly meant as chat).
    """
    stripped = text.lstrip()
    if not stripped.startswith("["):
        return None
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, list) or not data or not all(isinstance(m, dict) and "role" in m for m in data):
        return None
    messages = []
    for i, m in enumerate(data):
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise ValueError(f"chat message {i}: 'role' must be a non-empty string")
        if not isinstance(content, str):
            raise ValueError(f"chat message {i}: 'content' must be a string")
        messages.append({"role": role, "content": content})
    return messages


def _first_id(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return int(value) if isinstance(value, int) else None


def _id_from_model_files(directory: str, key: str) -> int | None:
    """Look ``key`` up in generation_config.json, then config.json (eos may be a list there)."""
    for name in ("generation_config.json", "config.json"):  # a GGUF file has none: its tokenizer names eos
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                found = _first_id(json.load(f).get(key))
            if found is not None:
                return found
    return None


def max_prompt_bytes(tokenizer: Any, directory: str | None) -> int | None:
    """A byte length beyond which a prompt surely exceeds the model's context, so it can be refused
    before tokenizing (tokenizing megabytes takes minutes): context tokens x the longest token's bytes
    (UTF-8 of the vocabulary strings, an upper bound for byte-level and SentencePiece vocabularies)."""
    from ..model_files import context_length

    context = context_length(directory)
    if context is None:
        return None
    longest = max((len(t.encode("utf-8")) for t in tokenizer.get_vocab()), default=1)
    return context * max(longest, 1)


@dataclass(frozen=True)
class EncodedPrompt:
    """Token ids of one prompt and the text they were made from (after any chat template)."""

    ids: list[int]
    text: str
    chat: bool


class TextTokenizer:
    """A loaded tokenizer plus the prompt policy of one deployment.

    ``add_special_tokens`` applies to plain prompts only; ``chat_mode`` is one of CHAT_MODES.
    ``eos_id`` / ``pad_id`` are always ints (pad falls back to eos, as NVIDIA's preprocessing does).
    """

    def __init__(self, tokenizer: Any, *, add_special_tokens: bool = True, chat_mode: str = "off",
                 model_dir: str | None = None) -> None:
        if chat_mode not in CHAT_MODES:
            raise ValueError(f"chat mode must be one of {CHAT_MODES}, got {chat_mode!r}")
        self.hf = tokenizer
        self.add_special_tokens = add_special_tokens
        self.chat_mode = chat_mode
        eos = tokenizer.eos_token_id
        if eos is None and model_dir:
            eos = _id_from_model_files(model_dir, "eos_token_id")
        if eos is None:
            raise ValueError("cannot find an end-of-sequence token id (no eos_token in the tokenizer, "
                             "no eos_token_id in generation_config.json/config.json)")
        self.eos_id = int(eos)
        pad = tokenizer.pad_token_id
        if pad is None and model_dir:
            pad = _id_from_model_files(model_dir, "pad_token_id")
        self.pad_id = int(pad) if pad is not None else self.eos_id
        if chat_mode == "on" and not self.has_chat_template:
            raise ValueError("chat mode 'on' needs a tokenizer with a chat template")
        self.max_prompt_bytes = max_prompt_bytes(tokenizer, model_dir)

    @classmethod
    def from_dir(cls, directory: str, **kwargs: Any) -> "TextTokenizer":
        return cls(load_tokenizer(directory), model_dir=directory, **kwargs)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        """Render messages with the tokenizer's template and the assistant generation prompt."""
        if not self.has_chat_template:
            raise ValueError("the prompt is a list of chat messages but the tokenizer has no chat template")
        rendered = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(rendered, str):
            raise ValueError("chat template did not render to text")
        return rendered

    def encode_prompt(self, text: str, *, add_special_tokens: bool | None = None) -> EncodedPrompt:
        """Token ids for ``text`` under this deployment's chat mode.

        ``add_special_tokens`` overrides the deployment default for plain (non-chat) prompts.
        """
        if not text:
            raise ValueError("prompt is empty")
        if self.max_prompt_bytes and len(text) > self.max_prompt_bytes // 4 \
                and len(text.encode("utf-8")) > self.max_prompt_bytes:
            raise ValueError(f"prompt is {len(text.encode('utf-8'))} bytes: longer than the model's context "
                             f"can hold (refused before tokenizing; at most {self.max_prompt_bytes} bytes)")
        messages = parse_chat_messages(text) if self.chat_mode != "off" else None
        if messages is None and self.chat_mode == "on":
            messages = [{"role": "user", "content": text}]
        if messages is not None:
            rendered = self.apply_chat_template(messages)
            ids = self.hf.encode(rendered, add_special_tokens=False)
            return EncodedPrompt(ids=list(ids), text=rendered, chat=True)
        special = self.add_special_tokens if add_special_tokens is None else add_special_tokens
        ids = self.hf.encode(text, add_special_tokens=special)
        if not ids:
            raise ValueError("prompt encodes to zero tokens")
        return EncodedPrompt(ids=list(ids), text=text, chat=False)

    def encode_plain(self, text: str) -> list[int]:
        """Ids of ``text`` with no special tokens (word lists, embedding bias words)."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)


def chat_mode_from_params(params: dict[str, str]) -> str:
    """The chat mode of a model config: ``chat_template`` (off|auto|on) wins; else the boolean
    ``apply_chat_template`` (true -> on, false/unset -> off; "auto" is accepted too)."""
    mode = (params.get("chat_template") or "").strip().lower()
    if mode and not mode.startswith("${"):
        return mode
    apply = (params.get("apply_chat_template") or "").strip().lower()
    if apply == "auto":
        return "auto"
    return "on" if parse_bool(apply, False) else "off"


def parse_bool(value: str | None, default: bool) -> bool:
    """Read a config-parameter boolean the way NVIDIA's models do; unset or `${...}` -> default."""
    if value is None:
        return default
    v = value.strip().lower()
    if not v or v.startswith("${"):
        return default
    if v in ("true", "1", "t", "y", "yes", "on"):
        return True
    if v in ("false", "0", "f", "n", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")
