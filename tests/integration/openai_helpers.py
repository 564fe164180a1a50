"""Start ``python -m clients.openai_server`` against a running tritonserver, as ``make openai`` does."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tritonllm.serving.launcher import find_free_ports

ROOT = Path(__file__).resolve().parents[2]
from clients.triton_llm import default_tokenizer_dir  # noqa: E402

TOKENIZER_DIR = default_tokenizer_dir()  # deployment.yaml's: what the served models tokenize with


def openai_server(triton_server, env: dict | None = None, args: tuple[str, ...] = ()):
    """``python -m clients.openai_server`` on a free port; yields (url, log path), stops it afterwards."""
    (port,) = find_free_ports(1)
    log_path = ROOT / "build" / "logs" / f"pytest-openai-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clients.openai_server", "--host", "127.0.0.1", "--port", str(port),
             "--triton-url", triton_server.grpc_url, "--tokenizer-dir", str(TOKENIZER_DIR), "--log-level", "info",
             *args],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"OpenAI server did not start:\n{log_path.read_text()[-3000:]}", pytrace=False)
            time.sleep(0.3)
        yield url, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def sdk_client(url: str):
    """The official SDK against one of these servers (no retries: a failure shows at once)."""
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def served_tokenizer():
    from tritonllm.model_files import load_hf_tokenizer

    return load_hf_tokenizer(TOKENIZER_DIR)


# Fixtures of a module served by one default OpenAI server (test modules import them by name).
@pytest.fixture(scope="module")
def openai_url(triton_server):
    for url, _ in openai_server(triton_server):
        yield url


@pytest.fixture(scope="module")
def client(openai_url):
    return sdk_client(openai_url)


@pytest.fixture(scope="module")
def tokenizer():
    return served_tokenizer()
