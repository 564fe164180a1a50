"""The production profile (deploy/production.args, `make serve-prod`) on a real tritonserver: admin APIs
(repository control, shared memory) answer only with the `admin-key` header / gRPC metadata, inference
stays open. Triton 2.51 answers a refused HTTP call 403 and a refused gRPC call UNAVAILABLE, and expects
the gRPC key as metadata `triton-grpc-protocol-admin-key`. The server serves a throwaway repository holding only `tabular_rf` (quick to load): the
flags are what is under test, not the models.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from robustness_helpers import ROOT, throwaway_repository, unary_request
from tritonllm.serving.launcher import TritonServer, find_free_ports

KEY = "test-admin-key-7f3a"
# Triton 2.51 prefixes the gRPC metadata key of a restricted protocol (the HTTP header is the bare key).
GRPC_HEADER = "triton-grpc-protocol-admin-key"


def production_args(env: dict[str, str]) -> list[str]:
    """deploy/production.args with comments dropped and ${VAR} expanded from ``env`` (as `make serve-prod`)."""
    out = []
    for line in (ROOT / "deploy" / "production.args").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            for k, v in env.items():
                line = line.replace("${" + k + "}", v)
            assert "${" not in line, f"unexpanded variable in {line}"
            out.append(line)
    return out


@pytest.fixture(scope="module")
def prod_server():
    if not (ROOT / "model_repository" / "tabular_rf" / "1" / "model.onnx").exists():
        subprocess.run([sys.executable, str(ROOT / "build_scripts" / "build_classical.py")], check=True)
    repo = throwaway_repository({}, models=("tabular_rf",))
    http, grpc, metrics = find_free_ports(3)
    server = TritonServer(http, grpc, metrics, repositories=[repo], exit_timeout_s=2,
                          log_path=ROOT / "build" / "logs" / f"pytest-prod-{http}.log",
                          extra_args=production_args({"TRITON_ADMIN_KEY": KEY}))
    try:
        server.start(timeout=120)
        yield server
    finally:
        server.kill()
        shutil.rmtree(repo, ignore_errors=True)


def test_production_args_expand_the_key_from_the_environment():
    args = production_args({"TRITON_ADMIN_KEY": KEY})
    assert f"--http-restricted-api=model-repository,shared-memory,trace,logging:admin-key={KEY}" in args
    assert any(a.startswith("--grpc-restricted-protocol=") and a.endswith(f"admin-key={KEY}") for a in args)


@pytest.mark.parametrize("method,path", [("POST", "/v2/repository/index"), ("GET", "/v2/systemsharedmemory/status")])
def test_http_admin_api_needs_the_key(prod_server, method, path):
    status, text = _call(prod_server, method, path)
    assert status == 403 and "admin-key" in text, (status, text)
    assert _call(prod_server, method, path, {"admin-key": "wrong"})[0] == 403
    status, text = _call(prod_server, method, path, {"admin-key": KEY})
    assert status == 200, (status, text)


def _call(server, method, path, headers=None):
    req = urllib.request.Request(f"http://{server.http_url}{path}", headers=headers or {}, method=method,
                                 data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_grpc_repository_control_needs_the_key(prod_server):
    client = grpcclient.InferenceServerClient(prod_server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.get_model_repository_index()
        assert GRPC_HEADER in str(e.value) and e.value.status() == "StatusCode.UNAVAILABLE"
        with pytest.raises(InferenceServerException):
            client.unload_model("tabular_rf")
        assert client.is_model_ready("tabular_rf")
        index = client.get_model_repository_index(headers={GRPC_HEADER: KEY}, as_json=True)
        assert [m["name"] for m in index["models"]] == ["tabular_rf"]
        with pytest.raises(InferenceServerException):
            client.get_system_shared_memory_status()
        client.get_system_shared_memory_status(headers={GRPC_HEADER: KEY})
    finally:
        client.close()


def test_inference_stays_open(prod_server):
    out, err = unary_request(prod_server.grpc_url, "tabular_rf", {"input": np.zeros((2, 16), np.float32)})
    assert err is None and out["label"].shape[0] == 2
