"""What a checkpoint path is, and its tokenizer: an HF folder (config.json, tokenizer.json) or a llama.cpp GGUF file.

One place for the question every loader asks (the engine, the text steps, xgrammar, the OpenAI server, Dynamo):
``is_gguf(path)``, ``load_hf_tokenizer(path)``, ``context_length(path)`` and ``hf_folder(path)`` (an HF-style folder
for tools that only read folders, e.g. Dynamo's frontend: a GGUF's is its cache entry, below).

A GGUF file carries its tokenizer (vocabulary, merges, special tokens, chat template) in its metadata;
transformers converts it to a fast tokenizer (``from_pretrained(folder, gguf_file=name)``), which takes ~5 s for
a 49k vocabulary. Every serving process loads the tokenizer (preprocessing, postprocessing, tensorrt_llm, the
BLS, the OpenAI server), so the converted files are kept in a cache folder named by the file's path, size and
modification time (``$TRITONLLM_CACHE``, default ``~/.cache/tritonllm``): later loads read tokenizer.json
(~0.5 s). The cache entry also holds config.json and generation_config.json made from the file's metadata
(transformers' GGUF config, the end-of-generation ids), so it reads as an HF folder without weights. It is written
atomically (a temp folder renamed); an unwritable cache only costs the time.
Only local files are read and no repository code runs (``trust_remote_code=False``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
FACTS = "gguf_facts.json"


def is_gguf(path: str | os.PathLike) -> bool:
    """A file that starts with GGUF's magic (whatever its name)."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def cache_root() -> Path:
    return Path(os.environ.get("TRITONLLM_CACHE") or Path.home() / ".cache" / "tritonllm")


def _cache_dir(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:20]
    return cache_root() / "gguf-tokenizers" / f"{path.stem}-{key}"


def gguf_header(path: str | os.PathLike):
    """gguf's ``GGUFReader`` over ``path`` (tensors memory-mapped, scalar fields read), without the cost of its
    per-element parse of array fields: the library makes two numpy views per string of a 49k-token vocabulary and
    its merges (~4.5 s for SmolLM2's file). Numeric arrays are read as one view each (``contents()`` as the library
    gives it); arrays of strings (the tokenizer's tokens and merges, which transformers reads itself) are walked for
    their size and left out of ``fields``: ``reader.fields.get("tokenizer.ggml.tokens")`` is None here."""
    import struct

    import gguf
    import numpy as np
    from gguf.constants import GGUFValueType

    class HeaderReader(gguf.GGUFReader):
        def _get_field_parts(self, orig_offs, raw_type):
            if GGUFValueType(raw_type) != GGUFValueType.ARRAY or self.byte_order != "I":
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
            itype, count, offs = GGUFValueType(int(raw_itype[0])), int(alen[0]), orig_offs + 12
            nptype = self.gguf_scalar_to_np.get(itype)
            if nptype is not None:
                values = self._get(offs, nptype, count)
                return 12 + int(values.nbytes), [raw_itype, alen, values], [2], [GGUFValueType.ARRAY, itype]
            if itype != GGUFValueType.STRING:  # arrays of arrays: the library's own walk
                return super()._get_field_parts(orig_offs, raw_type)
            view, end = memoryview(self.data), offs
            for _ in range(count):
                end += 8 + struct.unpack_from("<Q", view, end)[0]
            return end - orig_offs, [raw_itype, alen], [], [GGUFValueType.ARRAY, GGUFValueType.STRING]

    reader = HeaderReader(str(path))
    reader.skipped = [k for k, f in reader.fields.items() if f.types[:1] == [GGUFValueType.ARRAY] and not f.data]
    for key in reader.skipped:
        del reader.fields[key]
    return reader


def gguf_facts(path: str | os.PathLike) -> dict:
    """The few model facts a text step needs without loading weights: context length and end-of-generation ids."""
    reader = gguf_header(path)

    def field(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture", "")
    eog = [field(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    return {"architecture": arch, "context_length": field(f"{arch}.context_length"),
            "eog_token_ids": sorted({int(i) for i in eog if i is not None})}


def _folder_tokenizer(folder: Path) -> Any:
    """``AutoTokenizer.from_pretrained(folder)`` (local files, no remote code, fast), reached without AutoTokenizer when
    tokenizer_config.json names its class: AutoTokenizer reads config.json through AutoConfig, whose import pulls in
    torch (~1 s and ~300 MB in each text step's stub, which needs no torch). The class is resolved as AutoTokenizer
    resolves a name, from transformers' namespace, its fast form first."""
    try:
        name = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        name = None
    cls = None
    if isinstance(name, str) and name.isidentifier():
        import transformers

        cls = getattr(transformers, name.removesuffix("Fast") + "Fast", None) or getattr(transformers, name, None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                             use_fast=True)
    return cls.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)


def _tokenizer_from_cache(folder: Path) -> Any | None:
    if not all((folder / f).is_file() for f in ("tokenizer.json", FACTS, "config.json")) or \
            "architectures" not in json.loads((folder / "config.json").read_text()):
        return None
    try:
        return _folder_tokenizer(folder)
    except (OSError, ValueError) as e:  # a damaged cache entry is rebuilt
        log.warning("GGUF tokenizer cache %s unreadable (%s): converting again", folder, e)
        return None


def _gguf_tokenizer(path: Path) -> Any:
    folder = _cache_dir(path)
    tok = _tokenizer_from_cache(folder)
    if tok is not None:
        return tok
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True,
                                            trust_remote_code=False)
    except (ValueError, KeyError, NotImplementedError) as e:
        raise ValueError(f"{path}: the GGUF file's tokenizer cannot be read by transformers: {e}") from e
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        try:
            tok.save_pretrained(str(tmp))
            facts = gguf_facts(path)
            (tmp / FACTS).write_text(json.dumps(facts) + "\n")
            _write_hf_config(path, tmp, facts)
            if folder.exists() and _tokenizer_from_cache(folder) is None:  # an entry of an older layout
                shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)  # another process may have won the race: then its copy stays
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        log.warning("GGUF tokenizer of %s not cached (%s): it is converted at every load", path, e)
    return tok


def _write_hf_config(path: Path, folder: Path, facts: dict) -> None:
    """config.json (transformers' reading of the file's metadata) and generation_config.json (end-of-generation
    ids) into ``folder``: the HF view of a GGUF, for tools that read folders."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True,
                                     trust_remote_code=False)
    cfg.architectures = [type(cfg).__name__.removesuffix("Config") + "ForCausalLM"]  # e.g. LlamaForCausalLM
    cfg.save_pretrained(str(folder))
    eog = facts["eog_token_ids"]
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": eog[0] if len(eog) == 1 else eog, "bos_token_id": cfg.bos_token_id}) + "\n")


def cached_hf_config(path: str | os.PathLike) -> Path | None:
    """The config.json of a GGUF file's cache entry (its HF view) when one was written, else None: nothing is made."""
    config = _cache_dir(Path(os.fspath(path))) / "config.json"
    try:
        return config if "architectures" in json.loads(config.read_text()) else None
    except (OSError, ValueError):
        return None


def hf_folder(path: str | os.PathLike) -> Path:
    """``path`` when it is a folder; for a GGUF file, its cache entry (tokenizer, config.json, generation_config.json;
    no weights), made now if missing."""
    p = Path(os.fspath(path))
    if not is_gguf(p):
        return p
    _gguf_tokenizer(p)
    folder = _cache_dir(p)
    if not (folder / "config.json").is_file():
        raise OSError(f"{p}: no HF view of the GGUF could be written to the cache {folder} (set TRITONLLM_CACHE to a "
                      "writable folder)")
    return folder


def load_hf_tokenizer(path: str | os.PathLike) -> Any:
    """A fast HF tokenizer from a tokenizer folder or a GGUF file. FileNotFoundError when the path does not exist,
    ValueError when it holds no fast tokenizer."""
    p = Path(os.fspath(path))
    if is_gguf(p):
        tok = _gguf_tokenizer(p)
    elif p.is_dir():
        tok = _folder_tokenizer(p)
    else:
        raise FileNotFoundError(f"tokenizer not found: {p} (a folder with tokenizer.json, or a .gguf file)")
    if not hasattr(tok, "backend_tokenizer"):
        raise ValueError(f"tokenizer in {p} is not a fast (tokenizers-backed) tokenizer")
    return tok


def cached_facts(path: Path) -> dict:
    """gguf_facts from the tokenizer cache when it is there (no second parse of the file), else read now."""
    facts = _cache_dir(path) / FACTS
    if facts.is_file():
        try:
            return json.loads(facts.read_text())
        except (OSError, ValueError):
            pass
    return gguf_facts(path)


def context_length(path: str | os.PathLike | None) -> int | None:
    """The model's context in tokens: config.json's max_position_embeddings, or a GGUF's <arch>.context_length."""
    if not path:
        return None
    p = Path(path)
    if is_gguf(p):
        value = cached_facts(p).get("context_length")
    else:
        cfg = p / "config.json"
        if not cfg.is_file():
            return None
        with open(cfg, encoding="utf-8") as f:
            value = json.load(f).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None
