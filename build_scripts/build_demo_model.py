"""Build the demo LLM: a byte-level BPE tokenizer + a small Llama trained on local text.

Writes an HF-format checkpoint (config.json, model.safetensors, generation_config.json,
tokenizer.json, tokenizer_config.json with a Jinja chat template, special_tokens_map.json)
to ``--out`` (default build/models/demo). Nothing is downloaded: the corpus comes from
build_scripts/demo_corpus.py.

Invariants:
- Cached: ``.build_stamp`` in the output holds a hash of (this script, demo_corpus.py,
  every build argument, Python/torch/tokenizers/transformers versions). A matching stamp
  means "up to date" and the call returns at once without importing torch.
- Atomic: the checkpoint is built in a sibling temp dir and renamed into place, so an
  interrupted build never leaves a half checkpoint; the stamp is written last.
- Deterministic for a fixed step count, seed, machine image and thread count
  (``train_seconds`` is an optional wall-clock cap and breaks that; it is off by default).
- ``steps=0`` writes untrained random weights in seconds (for tests that need a checkpoint).

Usage: python build_scripts/build_demo_model.py --out build/models/demo [--steps N] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import cached_build  # sibling helpers (build_scripts is not a package: the script's folder is on sys.path)
import demo_corpus
from cached_build import STAMP  # noqa: F401  (re-exported: the checkpoint's stamp file name)

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "build" / "models" / "demo"
# Ids are fixed by the order here (trainer puts special tokens first): engine tests may rely on them.
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
# Llama-2-like turns: role marker, newline, content, eos. Ending a turn with eos means one
# stop id everywhere (config, generation_config, engine) instead of a list. Tools the Hermes / Qwen 2.5
# way (the OpenAI server's `hermes` parser reads the answers): signatures in <tools> in the system turn,
# calls as <tool_call>{"name", "arguments"}</tool_call>, results in a user turn as <tool_response>.
# Without tools the rendering is the plain one above, character for character. (transformers renders with
# trim_blocks: a newline right after a {% %} tag is dropped, so such newlines are written as {{ '\\n' }}.)
_TOOLS_SYSTEM = (
    "# Tools\n\nYou may call one or more functions. Their signatures are within <tools></tools> XML tags:"
    "\n<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, "
    "return a JSON object with the function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>'
)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(first=0) %}"
    "{% if tools %}{{ '<|system|>\n' }}"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}"
    "{% set ns.first = 1 %}{% endif %}" + _TOOLS_SYSTEM + "{{ eos_token + '\n' }}{% endif %}"
    "{% for message in messages[ns.first:] %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role: ' + message['role']) }}{% endif %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|user|>\n<tool_response>\n' + message['content'] + '\n</tool_response>' + eos_token + '\n' }}"
    "{% else %}{{ '<|' + message['role'] + '|>\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set args = call['function']['arguments'] %}"
    "{{ '<tool_call>\n{\"name\": ' + (call['function']['name'] | tojson) + ', \"arguments\": ' }}"
    "{{ args if args is string else args | tojson }}{{ '}\n</tool_call>' }}{% endfor %}"
    "{{ eos_token + '\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@dataclass(frozen=True)
class BuildArgs:
    """Everything that determines the checkpoint; hashed into the stamp."""

    steps: int = 200  # ~1 minute on 2 idle cores (~3.4k tokens/s): the toy only feeds the LoRA / AWQ tests now
    seed: int = 0
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 704  # ~2.75x hidden, a multiple of 64
    vocab: int = 4096
    seq_len: int = 128
    batch: int = 8
    lr: float = 5e-3
    max_positions: int = 2048
    rope_theta: float = 10000.0
    train_seconds: float = 0.0  # 0 = no wall-clock cap (deterministic)
    corpus_chars: int = 6_000_000  # steps=0 caps it at 400k: random weights need no big tokenizer corpus
    # Weight init std (transformers' initializer_range). The test toy (random weights) takes a large one: peaked
    # logits, so greedy never meets a near-tie that two summation orders (batched or not) could break differently.
    init_std: float = 0.02


def _stamp_for(args: BuildArgs) -> str:
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for src in ("build_demo_model.py", "demo_corpus.py", "cached_build.py"):
        h.update((here / src).read_bytes())
    h.update(json.dumps(asdict(args), sort_keys=True).encode())
    versions = [sys.version] + [metadata.version(p) for p in ("torch", "tokenizers", "transformers")]
    h.update("|".join(versions).encode())
    return h.hexdigest()


def is_up_to_date(out_dir: Path, args: BuildArgs) -> bool:
    """The stamp matches these args and sources, and every checkpoint file is there."""
    return cached_build.is_up_to_date(Path(out_dir), _stamp_for(args), FILES)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train_tokenizer(text: str, vocab: int):
    """Byte-level BPE (GPT-2 style): every UTF-8 byte is in the alphabet, so any text round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    # Llama convention: encode(add_special_tokens=True) prepends bos, never appends eos.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(len(SPECIALS)))
    return tok


def _write_tokenizer_files(tok, out: Path, max_positions: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    names = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    roles = SPECIALS[4:]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", **names,
        "additional_special_tokens": roles,
        "add_bos_token": True, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": max_positions,
        "padding_side": "left", "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": s, "special": True, "lstrip": False,
                                          "rstrip": False, "normalized": False, "single_word": False}
                                 for i, s in enumerate(SPECIALS)},
    }
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", {**names, "additional_special_tokens": roles})


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _llama_config(a: BuildArgs):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        head_dim=a.hidden // a.heads, max_position_embeddings=a.max_positions,
        rope_theta=a.rope_theta, rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, initializer_range=a.init_std,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, torch_dtype="float32")


def train(model, ids, a: BuildArgs) -> dict:
    """AdamW on random windows of the token stream, each led by bos (as prompts are at inference)."""
    import torch

    gen = torch.Generator().manual_seed(a.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    warmup = max(1, a.steps // 20)
    bos = torch.full((a.batch, 1), BOS_ID, dtype=torch.long)
    model.train()
    start, losses, step = time.monotonic(), [], 0
    for step in range(1, a.steps + 1):
        # Warmup then cosine decay to 10% of the peak learning rate.
        frac = (step - warmup) / max(1, a.steps - warmup)
        scale = step / warmup if step <= warmup else 0.1 + 0.45 * (1 + math.cos(math.pi * frac))
        for g in opt.param_groups:
            g["lr"] = a.lr * scale
        starts = torch.randint(0, len(ids) - a.seq_len, (a.batch,), generator=gen)
        batch = torch.cat([bos, torch.stack([ids[s:s + a.seq_len] for s in starts.tolist()])], dim=1)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        elapsed = time.monotonic() - start
        if step % 50 == 0 or step == a.steps:
            tps = step * a.batch * a.seq_len / elapsed
            _log(f"step {step}/{a.steps} loss {sum(losses[-50:]) / len(losses[-50:]):.3f} "
                 f"lr {a.lr * scale:.2e} {tps:.0f} tok/s {elapsed:.0f}s")
        if a.train_seconds and elapsed >= a.train_seconds:
            _log(f"stopping at step {step}: --train-seconds {a.train_seconds} reached")
            break
    model.eval()
    tail = losses[-50:]
    return {"steps_run": step, "train_seconds": round(time.monotonic() - start, 1),
            "final_loss": round(sum(tail) / len(tail), 4) if tail else None}


def sample(model_dir: Path, prompt: str = "The", max_new_tokens: int = 40) -> str:
    """Greedy continuation with stock transformers: proves the checkpoint loads outside our engine."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=PAD_ID)
    return tok.decode(out[0][ids.shape[1]:], skip_special_tokens=True)


def _build_into(tmp: Path, a: BuildArgs) -> dict:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep stderr for our own progress lines
    torch.manual_seed(a.seed)
    t0 = time.monotonic()
    text = demo_corpus.load_corpus(max_chars=a.corpus_chars if a.steps else min(a.corpus_chars, 400_000))
    tok = train_tokenizer(text, a.vocab)
    _write_tokenizer_files(tok, tmp, a.max_positions)
    _log(f"tokenizer: {tok.get_vocab_size()} tokens from {len(text)} chars ({time.monotonic() - t0:.0f}s)")

    model = LlamaForCausalLM(_llama_config(a))
    report = {"parameters": sum(p.numel() for p in model.parameters())}
    _log(f"model: {report['parameters'] / 1e6:.2f}M parameters")
    if a.steps > 0:
        docs = tok.encode_batch(text.split("\n\n"), add_special_tokens=False)
        stream = [i for d in docs for i in d.ids + [EOS_ID]]  # eos marks document boundaries
        report["train_tokens_available"] = len(stream)
        report.update(train(model, torch.tensor(stream, dtype=torch.long), a))
    model.save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                     do_sample=False, max_new_tokens=64).save_pretrained(tmp)
    cfg = json.loads((tmp / "config.json").read_text())
    # transformers 5 writes "dtype" and rope_parameters; older readers look for these keys.
    cfg.setdefault("torch_dtype", "float32")
    cfg.setdefault("rope_theta", a.rope_theta)
    _write_json(tmp / "config.json", cfg)
    return report


def build_demo_model(out_dir=DEFAULT_OUT, *, force: bool = False, **overrides) -> Path:
    """Build (or reuse) the checkpoint at out_dir; returns out_dir. overrides: BuildArgs fields."""
    a = BuildArgs(**overrides)
    out = Path(out_dir).resolve()
    stamp = _stamp_for(a)  # taken before building: edits made meanwhile must not pass as built
    report: dict = {}

    def build(tmp: Path) -> None:
        report.update(_build_into(tmp, a))
        report["sample"] = {"prompt": "The", "greedy": sample(tmp)}
        _write_json(tmp / "build_report.json", {**report, "args": asdict(a)})

    if not cached_build.build_atomically(out, stamp, FILES, build, force=force):
        print(f"{out}: up to date")
        return out
    _log(json.dumps(report, indent=2, ensure_ascii=False))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    p.add_argument("--random", action="store_true", help="untrained random weights (same as --steps 0)")
    for field, default in asdict(BuildArgs()).items():
        p.add_argument("--" + field.replace("_", "-"), type=type(default), default=default)
    ns = vars(p.parse_args(argv))
    out, force = ns.pop("out"), ns.pop("force")
    if ns.pop("random"):
        ns["steps"] = 0
    build_demo_model(out, force=force, **ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
