"""Build the demo LoRA adapter: PEFT LoRA on the demo LLM, trained to write Python instead of English.

The demo model learned English prose (build_demo_model.py drops code from its corpus); this adapter is
trained with peft on Python source of the standard library, so ``lora_task_id`` visibly switches style:
"def" continues as code with the adapter and as prose without. Writes a PEFT folder
(adapter_config.json + adapter_model.safetensors + build_report.json) to ``--out``
(default build/models/demo-lora/python), cached and atomic like the demo model (cached_build.py): the
stamp hashes this script, the base checkpoint's stamp, the arguments and library versions.

Usage: python build_scripts/build_demo_lora.py [--base build/models/demo] [--out ...] [--steps N]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import cached_build  # sibling helper (build_scripts is not a package: the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASE = ROOT / "build" / "models" / "demo"
DEFAULT_OUT = ROOT / "build" / "models" / "demo-lora" / "python"
FILES = ("adapter_config.json", "adapter_model.safetensors")
# Small, stable, code-heavy modules of the standard library (sorted, read as bytes: deterministic).
_SOURCES = ("textwrap.py", "fnmatch.py", "bisect.py", "heapq.py", "shlex.py", "glob.py", "colorsys.py",
            "json/encoder.py", "json/decoder.py", "string.py", "keyword.py", "operator.py", "queue.py")


@dataclass(frozen=True)
class LoraArgs:
    steps: int = 150        # ~40 s on 2 cores; 0 = untrained, A and B random (the test toy's adapter, seconds)
    seed: int = 0
    rank: int = 8
    alpha: int = 16
    lr: float = 3e-3
    batch: int = 8
    seq_len: int = 128


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def code_corpus() -> str:
    """Code lines without indentation or comments: the demo tokenizer has no multi-space tokens, and
    indentation would teach the adapter to emit runs of single spaces."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    lines = [line.strip() for name in _SOURCES if (lib / name).is_file()
             for line in (lib / name).read_text(encoding="utf-8").splitlines()]
    return "\n".join(line for line in lines if line and not line.startswith("#"))


def _stamp(base: Path, a: LoraArgs) -> str:
    h = hashlib.sha256()
    for src in ("build_demo_lora.py", "cached_build.py"):
        h.update((Path(__file__).resolve().parent / src).read_bytes())
    h.update((base / cached_build.STAMP).read_bytes())
    h.update(json.dumps(asdict(a), sort_keys=True).encode())
    h.update("|".join([sys.version] + [metadata.version(p) for p in ("torch", "transformers", "peft")]).encode())
    return h.hexdigest()


def _greedy(model, tok, prompt: str, n: int = 24) -> str:
    import torch

    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    return tok.decode(out[0][ids.shape[1]:], skip_special_tokens=True)


def _train(base: Path, tmp: Path, a: LoraArgs) -> dict:
    import peft
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    prompt = "def"
    before = _greedy(model.eval(), tok, prompt)
    cfg = peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                          "down_proj"], init_lora_weights=a.steps > 0)
    model = peft.get_peft_model(model, cfg)
    if a.steps == 0:  # untrained: both A and B random (PEFT's default B = 0 would leave the base model unchanged)
        return _save(model, tok, prompt, before, tmp, a, {"corpus_tokens": 0, "final_loss": None,
                                                          "train_seconds": 0.0})
    ids = torch.tensor(tok(code_corpus(), add_special_tokens=False).input_ids, dtype=torch.long)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr)
    gen = torch.Generator().manual_seed(a.seed)
    bos = torch.full((a.batch, 1), tok.bos_token_id, dtype=torch.long)
    model.train()
    t0, losses = time.monotonic(), []
    for step in range(1, a.steps + 1):
        starts = torch.randint(0, len(ids) - a.seq_len, (a.batch,), generator=gen).tolist()
        batch = torch.cat([bos, torch.stack([ids[s:s + a.seq_len] for s in starts])], dim=1)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == a.steps:
            _log(f"[demo-lora] step {step}/{a.steps} loss {sum(losses[-25:]) / len(losses[-25:]):.3f} "
                 f"{time.monotonic() - t0:.0f}s")
    return _save(model, tok, prompt, before, tmp, a, {
        "corpus_tokens": len(ids), "final_loss": round(sum(losses[-25:]) / len(losses[-25:]), 4),
        "train_seconds": round(time.monotonic() - t0, 1)})


def _save(model, tok, prompt: str, before: str, tmp: Path, a: LoraArgs, report: dict) -> dict:
    model.eval()
    model.save_pretrained(tmp, safe_serialization=True)
    report = {**report, "sample": {"prompt": prompt, "base": before, "adapter": _greedy(model, tok, prompt)},
              "args": asdict(a)}
    (tmp / "build_report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


def build_demo_lora(base: Path = DEFAULT_BASE, out: Path = DEFAULT_OUT, *, force: bool = False,
                    **overrides) -> Path:
    a = LoraArgs(**overrides)
    base, out = Path(base).resolve(), Path(out).resolve()
    if not (base / cached_build.STAMP).is_file():
        raise SystemExit(f"base checkpoint {base} is not built (run build_scripts/build_demo_model.py)")
    report: dict = {}
    built = cached_build.build_atomically(out, _stamp(base, a), FILES,
                                          lambda tmp: report.update(_train(base, tmp, a)), force=force)
    print(f"{out}: {'built' if built else 'up to date'}")
    if built:
        _log(json.dumps(report["sample"], ensure_ascii=False))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", type=Path, default=DEFAULT_BASE)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--force", action="store_true")
    for name, default in asdict(LoraArgs()).items():
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    ns = vars(p.parse_args(argv))
    build_demo_lora(ns.pop("base"), ns.pop("out"), force=ns.pop("force"), **ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
