"""The repository as deployment.yaml renders it, with the LLM on the test toy instead of the default model.

The test toy (build_all.py --toy: the demo toy's shapes, tokenizer and tool-aware chat template, untrained: random
weights with peaked logits) is what the real model cannot give in seconds: a LoRA adapter made for its base model
(lora_task_id 1, `build/models/toy-lora/python`, random A and B), an AWQ checkpoint quantize.py writes from an HF
float folder (profile ``int4``, `build/models/toy-int4-awq`), and a chat template with a tools section. Everything
else is the default deployment: the same renderer, configs and adapters; only ``llm.gpt_model_path`` /
``tokenizer_dir``, the adapters and profile int4 change.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "build" / "models" / "toy"
TOY_LORA = ROOT / "build" / "models" / "toy-lora" / "python"
TOY_INT4 = ROOT / "build" / "models" / "toy-int4-awq"


def toy_deployment() -> dict:
    from render_configs import load_deployment

    dep = load_deployment(ROOT / "deployment.yaml")
    dep["llm"]["gpt_model_path"] = dep["llm"]["tokenizer_dir"] = str(TOY)  # absolute: kept as is by the renderer
    dep["models"]["tensorrt_llm"]["parameters"]["lora_adapters"] = {1: str(TOY_LORA)}
    dep["models"]["tensorrt_llm"]["parameters"]["lora_root"] = str(TOY_LORA.parent)  # lora_path "python" is it
    dep.setdefault("profiles", {})["int4"] = {"model": str(TOY_INT4), "tokenizer": str(TOY)}
    return dep


def toy_repository() -> Path:
    """A temp checkout-like folder (model_repository/ and ensembles/, rendered for the toy); the caller removes it."""
    from render_configs import render_files, write_files

    tmp = Path(tempfile.mkdtemp(prefix="toy-repo-"))
    for folder in ("model_repository", "ensembles"):
        shutil.copytree(ROOT / folder, tmp / folder, ignore=shutil.ignore_patterns("__pycache__"))
    write_files(render_files(toy_deployment(), repo=tmp), repo=tmp)
    return tmp
