"""A Dynamo cluster for integration tests: ``python -m tritonllm.dynamo.launch`` (what ``make serve-dynamo``
runs) in its own process group, loopback only, with the openai SDK and plain-HTTP helpers."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tritonllm.serving.discovery import find_free_ports

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_PY = ROOT / "build" / "dynamo-venv" / "bin" / "python"


class Cluster:
    def __init__(self, router: str, replicas: int = 2, extra: tuple[str, ...] = ()) -> None:
        import openai
        (self.port,) = find_free_ports(1)
        self.log_dir = ROOT / "build" / "logs"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tritonllm.dynamo.launch", "--replicas", str(replicas), "--port", str(self.port),
             "--router", router, "--threads", "1", "--log-dir", str(self.log_dir), *extra],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "backends")}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if "dynamo READY" in line:
                self.worker_pids = [int(p) for p in re.search(r"pids ([\d ]+)\)", line).group(1).split()]
                self.model = re.search(r" model (\S+) ", line).group(1)  # the served name
                self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="none",
                                            max_retries=0, timeout=120)  # a failure shows, never retried
                return
        self.stop()
        pytest.fail("dynamo launch did not get READY:\n" + "".join(self.lines[-40:]), pytrace=False)

    def completion(self, prompt, max_tokens=10, **extra) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "nvext": {"extra_fields": ["worker_id", "timing"]}, **extra}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return {"status": e.code, **json.loads(e.read() or b"{}")}

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the process group, as a supervisor would
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)

    def listening(self) -> list[str]:
        """Listening sockets (`ss` lines) of the launcher and every process it started (each child in its own group)."""
        import psutil

        root = psutil.Process(self.proc.pid)
        group = [str(p.pid) for p in [root, *root.children(recursive=True)]]
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if any(f"pid={p}," in line for p in group)]


def prompt_ids(text: str, tokenizer_dir=None) -> list[int]:
    """Ids of ``text`` by the served tokenizer (deployment.yaml's, a folder or a GGUF file)."""
    from clients.triton_llm import default_tokenizer_dir
    from tritonllm.model_files import load_hf_tokenizer

    return load_hf_tokenizer(tokenizer_dir or default_tokenizer_dir())(text)["input_ids"]
