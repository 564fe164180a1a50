"""Small tokenizers trained in-process for the text tests (no files from any hub).

- ``byte_level``: GPT-2/Llama-3 style byte-level BPE; a small vocabulary so that multi-byte
  characters (é, 中文, emoji) are split across tokens.
- ``metaspace``: SentencePiece style (Metaspace pre-tokenizer and decoder: "▁" marks word starts,
  the decoder drops the leading space of the first token).
- ``llama_fallback``: Llama-2 style: "▁" normalizer, BPE with byte fallback (<0xNN> tokens) for
  characters outside the alphabet, decoder Replace + ByteFallback + Fuse + Strip.
- ``wordpiece``: BERT style, for transformers' clean_up_tokenization_spaces.
Each returns a transformers PreTrainedTokenizerFast with <s> (bos), </s> (eos), <pad>.
"""

from __future__ import annotations

import json
import random

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>"]

_WORDS = ("the quick brown fox jumps over a lazy dog while hello world says don't stop "
          "we're testing token streams and it's fine you've seen café naïve résumé déjà vu "
          "crème brûlée 中文 测试 你好 世界 emoji 🙂 🚀 👍🏽 and numbers 12345 67 89 , . ! ? ' : ;").split()


SAMPLES = [
    "Hello world, the quick brown fox.",
    "café naïve résumé — déjà vu!",
    "中文测试：你好，世界。",
    "emoji 🙂🚀 and 👍🏽 mixed with text 🙂",
    "  leading and   multiple   spaces  ",
    "line one\nline two\n\n  indented\tTab",
    "don't stop , we're here . it's fine ! ok ?",
    "a",
    "🙂",
    "x 中 y é z 🚀",
]


def corpus(n_lines: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        sep = rng.choice([" ", " ", " ", "  ", ""])
        lines.append(sep.join(words) if sep else " ".join(words))
    return lines + SAMPLES * 2




def _wrap(tok: Tokenizer, **kw) -> PreTrainedTokenizerFast:
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                 additional_special_tokens=["<|user|>", "<|assistant|>"], **kw)
    return hf


def byte_level() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return _wrap(tok)


def metaspace() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS + ["<unk>"], show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return _wrap(tok, unk_token="<unk>")


def llama_fallback() -> PreTrainedTokenizerFast:
    base = Tokenizer(models.BPE())
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, limit_alphabet=40, show_progress=False)
    base.train_from_iterator(corpus(), trainer)
    spec = json.loads(base.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):  # byte-fallback tokens, as Llama-2's vocabulary has them
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    spec["model"]["fuse_unk"] = False
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return _wrap(tok)


def wordpiece() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(cleanup=False)  # cleanup left to transformers (Python side)
    trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=SPECIALS + ["<unk>"], show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return _wrap(tok, unk_token="<unk>", clean_up_tokenization_spaces=True)


ALL = {"byte_level": byte_level, "metaspace": metaspace, "llama_fallback": llama_fallback}


def random_chunks(ids: list[int], rng: random.Random, max_chunk: int = 5) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, max_chunk)
        out.append(ids[i:i + n])
        i += n
    return out
