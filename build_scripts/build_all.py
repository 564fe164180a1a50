"""Build everything the repository serves, in order, with progress; quick when nothing changed.

Steps (each one is cached by its own script, so a second run only checks stamps):
  0. the native CPU kernels of the engine   python -m tritonllm.engine.cpu_kernels (torch's extension cache)
  1. the demo LLM checkpoint  build_scripts/build_demo_model.py --out build/models/demo
     (skipped when deployment.yaml points the LLM at another checkpoint), then its LoRA adapter
     build_scripts/build_demo_lora.py (when tensorrt_llm's lora_adapters name build/models/demo-lora/python),
     and its INT4 variant build_scripts/quantize.py --out build/models/demo-int4-awq (when profile int4 names it)
  2. the classical models     build_scripts/build_classical.py   (when present)
  3. the LLM configs          build_scripts/render_configs.py    (deployment.yaml -> config.pbtxt)

Invariant: each step runs as its own process with this interpreter, its output streamed as it comes;
the first failing step stops the build with its exit code and names the step.
Usage: python build_scripts/build_all.py [--skip-demo] [--skip-classical]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "build_scripts"
DEMO_DIR = Path("build/models/demo")
DEMO_LORA_DIR = Path("build/models/demo-lora/python")
DEMO_INT4_DIR = Path("build/models/demo-int4-awq")
# The demo's INT4 variant (profile int4): AWQ calibrated on the demo corpus; 64 divides the demo's 256 and 704.
DEMO_INT4_ARGS = ["--group-size", "64", "--calib-samples", "32", "--calib-len", "128"]


def _uses_demo_model() -> bool:
    with open(REPO / "deployment.yaml") as f:
        llm = (yaml.safe_load(f) or {}).get("llm") or {}
    demo = (REPO / DEMO_DIR).resolve()
    return any((REPO / str(llm.get(k, ""))).resolve() == demo for k in ("gpt_model_path", "tokenizer_dir"))


def _uses_demo_lora() -> bool:
    with open(REPO / "deployment.yaml") as f:
        models = (yaml.safe_load(f) or {}).get("models") or {}
    adapters = (((models.get("tensorrt_llm") or {}).get("parameters") or {}).get("lora_adapters")) or {}
    return any((REPO / str(p)).resolve() == (REPO / DEMO_LORA_DIR).resolve() for p in adapters.values())


def _uses_demo_int4() -> bool:
    with open(REPO / "deployment.yaml") as f:
        int4 = ((yaml.safe_load(f) or {}).get("profiles") or {}).get("int4")
    return int4 is not None and (REPO / str((int4 or {}).get("model", DEMO_INT4_DIR))).resolve() == \
        (REPO / DEMO_INT4_DIR).resolve()


def _run(index: int, total: int, title: str, argv: list[str]) -> None:
    print(f"[{index}/{total}] {title}: {' '.join(argv)}", flush=True)
    start = time.monotonic()
    code = subprocess.call([sys.executable, *argv], cwd=REPO)
    if code != 0:
        print(f"[{index}/{total}] {title}: FAILED (exit {code})", file=sys.stderr, flush=True)
        raise SystemExit(code)
    print(f"[{index}/{total}] {title}: done in {time.monotonic() - start:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-demo", action="store_true", help="do not build the demo LLM")
    parser.add_argument("--skip-classical", action="store_true", help="do not build the classical models")
    args = parser.parse_args(argv)

    steps: list[tuple[str, list[str]]] = [("native CPU kernels", ["-m", "tritonllm.engine.cpu_kernels"])]
    if not args.skip_demo and _uses_demo_model():
        steps.append(("demo LLM", ["build_scripts/build_demo_model.py", "--out", str(DEMO_DIR)]))
        if _uses_demo_lora():
            steps.append(("demo LoRA adapter", ["build_scripts/build_demo_lora.py", "--base", str(DEMO_DIR),
                                                "--out", str(DEMO_LORA_DIR)]))
        if _uses_demo_int4():
            steps.append(("demo INT4 (AWQ)", ["build_scripts/quantize.py", "--model", str(DEMO_DIR),
                                              "--out", str(DEMO_INT4_DIR), *DEMO_INT4_ARGS]))
    if not args.skip_classical and (SCRIPTS / "build_classical.py").exists():
        steps.append(("classical models", ["build_scripts/build_classical.py"]))
    steps.append(("LLM configs", ["build_scripts/render_configs.py"]))

    start = time.monotonic()
    for i, (title, step_argv) in enumerate(steps, 1):
        _run(i, len(steps), title, step_argv)
    print(f"build: all {len(steps)} steps done in {time.monotonic() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
