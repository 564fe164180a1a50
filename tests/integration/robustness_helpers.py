"""Shared helpers of the reliability tests (issue 8): one-request gRPC streams, the LLM metrics, and what
the server process owns (child processes, stub threads, /dev/shm entries), plus throwaway repositories
whose ``tensorrt_llm`` config is the rendered one with a few parameters overridden.

Invariants:
- Every helper talks to a real tritonserver; nothing here fakes a response.
- ``server_footprint`` reads /proc only for the server's own descendants, so other servers running on the
  machine (other test sessions) never disturb a leak check.
"""
from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tritonllm.serving.launcher import TritonServer, find_free_ports
from tritonllm.serving.watchdog import descendants

ROOT = Path(__file__).resolve().parents[2]
GRPC_DTYPES = {np.dtype(object): "BYTES", np.dtype(np.int32): "INT32", np.dtype(np.bool_): "BOOL",
               np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.uint64): "UINT64",
               np.dtype(np.int64): "INT64", np.dtype(np.float16): "FP16"}


def grpc_inputs(tensors: dict[str, np.ndarray]) -> list:
    out = []
    for name, arr in tensors.items():
        t = grpcclient.InferInput(name, list(arr.shape), GRPC_DTYPES[arr.dtype])
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def stream_request(url: str, model: str, tensors: dict, timeout: float = 120.0, client=None, parameters=None,
                   outputs=None, on_chunk=None):
    """One request on its own gRPC stream: (list of {output name: array}, error or None). In-stream errors
    carry a message only (``error.status()`` is None): Triton's ``triton_grpc_error`` header would add the
    status, but on 2.51 it crashed the server under some sequences of errors (docs/nvidia_clients.md).
    ``parameters``: request parameters; ``outputs``: the output names to ask for (default: every one);
    ``on_chunk()`` is called after each response with outputs (a test's cue that the request is generating)."""
    own = client is None
    client = client or grpcclient.InferenceServerClient(url)
    q: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    chunks: list[dict] = []
    done = False
    try:
        client.async_stream_infer(model, grpc_inputs(tensors), enable_empty_final_response=True, parameters=parameters,
                                  outputs=[grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None)
        while True:
            result, error = q.get(timeout=timeout)  # queue.Empty propagates: the caller sees the hang
            if error is not None:
                done = True
                return chunks, error
            resp = result.get_response()
            if resp.outputs:
                chunks.append({o.name: result.as_numpy(o.name) for o in resp.outputs})
                if on_chunk is not None:
                    on_chunk()
            if resp.parameters["triton_final_response"].bool_param:
                done = True
                return chunks, None
    finally:
        # A plain stop_stream() waits for the server to end the stream; after a timeout it may never do.
        client.stop_stream(cancel_requests=not done)
        if own:
            client.close()


def unary_request(url: str, model: str, tensors: dict):
    """One plain (non-decoupled) inference: ({output name: array}, error or None)."""
    client = grpcclient.InferenceServerClient(url)
    try:
        result = client.infer(model, grpc_inputs(tensors))
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}, None
    except InferenceServerException as e:
        return {}, e
    finally:
        client.close()


def served_parameters(server, model: str) -> dict[str, str]:
    """The string parameters of ``model``'s config as the server loaded it."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return {k: v["string_value"] for k, v in client.get_model_config(model)["parameters"].items()}
    finally:
        client.close()


def text_of(chunks: list[dict]) -> str:
    return "".join(c["text_output"].reshape(-1)[0].decode("utf-8") for c in chunks if "text_output" in c)


def ids_of(chunks: list[dict]) -> list[int]:
    return [t for c in chunks for t in c["output_ids"].reshape(-1).tolist()]


def ids_tensors(ids: list[int], n: int, stream: bool = False, **extra) -> dict:
    return {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
            "request_output_len": np.array([[n]], np.int32), "end_id": np.array([[-1]], np.int32),
            "streaming": np.array([[stream]]), **extra}


def text_tensors(prompt: str | bytes, max_tokens: int = 16, **extra) -> dict:
    raw = prompt.encode() if isinstance(prompt, str) else prompt
    return {"text_input": np.array([[raw]], dtype=object), "max_tokens": np.array([[max_tokens]], np.int32),
            **extra}


# --------------------------------------------------------------------------- metrics

def llm_metrics(metrics_url: str, model: str = "tensorrt_llm") -> dict[str, float]:
    """The ``llm_*`` series of one model (histogram buckets dropped)."""
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'^(llm_[a-z_]+)\{([^}]*)\} ([0-9.eE+-]+|NaN|[+-]Inf)$', line)
        if m and f'model="{model}"' in m.group(2) and "le=" not in m.group(2):
            out[m.group(1)] = float(m.group(3))
    return out


def wait_idle(metrics_url: str, timeout: float = 30.0, required: bool = True) -> dict[str, float]:
    """Poll until KV usage and running/waiting requests are all 0 and return that reading (each read follows a
    publication: the adapter publishes every ~0.5 s, so the first read is never one from before the caller's last
    request). Not idle within ``timeout``: AssertionError with the last reading, or that reading when not
    ``required`` (a report that states it)."""
    deadline = time.monotonic() + timeout
    m: dict[str, float] = {}
    while time.monotonic() < deadline:
        time.sleep(0.6)
        m = llm_metrics(metrics_url)
        if (m.get("llm_kv_cache_usage_ratio") == 0.0 and m.get("llm_requests_running") == 0
                and m.get("llm_requests_waiting", 0) == 0):
            return m
    assert not required, f"the engine was not idle within {timeout:.0f} s: {m}"
    return m


# --------------------------------------------------------------------------- what the server owns

def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stub_pids(server_pid: int, model: str) -> list[int]:
    """The Python backend stub processes serving ``model`` (the stub's argv carries the model's path)."""
    return [p for p in descendants(server_pid)
            if "triton_python_backend_stub" in cmdline(p) and f"/{model}/1/model.py" in cmdline(p)]


def thread_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def shm_entries(server_pid: int) -> set[str]:
    """/dev/shm entries the server's processes hold open or map (others' entries are ignored)."""
    pids = [server_pid] + descendants(server_pid)
    out: set[str] = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        out.update(re.findall(r"(/dev/shm/\S+)", maps))
    return out


def server_footprint(server_pid: int) -> dict:
    """Child processes by kind, threads of the tensorrt_llm stub, /dev/shm entries mapped by the server."""
    children = descendants(server_pid)
    llm = stub_pids(server_pid, "tensorrt_llm")
    return {"children": len(children), "llm_stub_threads": sum(thread_count(p) for p in llm),
            "shm": shm_entries(server_pid)}


# --------------------------------------------------------------------------- throwaway repositories

def _absolute_paths(value: str, base: Path) -> str:
    """``value`` with each relative path (``./x``, ``../x``, or ``key=../x`` items of a comma list) made
    absolute against ``base``; everything else unchanged."""
    items = []
    for item in value.split(","):
        key, sep, path = item.rpartition("=")
        if path.startswith(("./", "../")):
            path = str((base / path).resolve())
        items.append(key + sep + path)
    return ",".join(items)


def throwaway_repository(overrides: dict[str, str], models: tuple[str, ...] = ("tensorrt_llm",),
                         gpt_model_path: str | None = None) -> Path:
    """A temp repository with ``models`` copied from model_repository (configs as rendered), the
    ``tensorrt_llm`` config's string parameters overridden; relative path parameters are made absolute so
    the copy finds the same checkpoint. The caller removes it (``shutil.rmtree``)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    tmp = Path(tempfile.mkdtemp(prefix="h8-repo-"))
    for model in models:
        src = ROOT / "model_repository" / model
        shutil.copytree(src, tmp / model, ignore=shutil.ignore_patterns("__pycache__"))
        cfg = model_config_pb2.ModelConfig()
        text_format.Parse((src / "config.pbtxt").read_text(), cfg)
        for key in cfg.parameters:  # relative paths, also inside lists such as "1=../a,2=../b"
            cfg.parameters[key].string_value = _absolute_paths(cfg.parameters[key].string_value, src)
        if model == "tensorrt_llm":
            for k, v in overrides.items():
                cfg.parameters[k].string_value = str(v)
            if gpt_model_path is not None:
                cfg.parameters["gpt_model_path"].string_value = gpt_model_path
        (tmp / model / "config.pbtxt").write_text(text_format.MessageToString(cfg))
    return tmp


@contextlib.contextmanager
def dedicated_server(repo: Path, extra_args=(), timeout=180):
    """A tritonserver of its own over `repo`, on free loopback ports."""
    http, grpc, metrics = find_free_ports(3)
    server = TritonServer(http, grpc, metrics, repositories=[repo], exit_timeout_s=10, extra_args=list(extra_args),
                          log_path=ROOT / "build" / "logs" / f"pytest-h8-{http}.log")
    try:
        server.start(timeout=timeout)
        yield server
    finally:
        server.kill()  # tests that check the stop call stop() themselves
