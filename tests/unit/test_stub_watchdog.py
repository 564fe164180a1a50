"""The stub watchdog's pure parts: tritonserver argument parsing (model-control mode, the admin key of a
restricted model-repository API) and the identity of a Python backend stub from its argv."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from tritonllm.serving.launcher import TritonServer
from tritonllm.serving.watchdog import admin_headers, arg_value, descendants, is_alive, stub_identity

STUB = "/opt/tritonserver/backends/python/triton_python_backend_stub"


def test_arg_value_reads_both_spellings_and_the_last_wins():
    assert arg_value(["--model-control-mode=explicit"], "--model-control-mode") == "explicit"
    assert arg_value(["--model-control-mode", "poll"], "--model-control-mode") == "poll"
    assert arg_value(["--model-control-mode=none", "--model-control-mode=explicit"],
                     "--model-control-mode") == "explicit"
    assert arg_value(["--model-control-mode-x=1"], "--model-control-mode") is None


def test_admin_headers_only_for_a_restricted_model_repository_api():
    args = ["--http-restricted-api=model-repository,shared-memory,trace,logging:admin-key=s3cr=t",
            "--grpc-restricted-protocol=model-repository:admin-key=other"]
    assert admin_headers(args) == {"admin-key": "s3cr=t"}
    assert admin_headers(["--http-restricted-api", "model-repository:x-key=v"]) == {"x-key": "v"}
    assert admin_headers(["--http-restricted-api=shared-memory:admin-key=k"]) == {}
    assert admin_headers([]) == {}


def test_stub_identity_from_argv():
    argv = [STUB, "/repo/tensorrt_llm/1/model.py", "shm_region", "1048576", "1048576", "4242",
            "/opt/tritonserver/backends/python", "336", "tensorrt_llm_0_0", "/build/backends/torchllm"]
    assert stub_identity(argv) == ("tensorrt_llm", "tensorrt_llm_0_0")
    assert stub_identity(argv[:9]) == ("tensorrt_llm", "tensorrt_llm_0_0")  # no runtime dir
    # the auto-complete stub is named after the model and exits by design
    assert stub_identity(argv[:8] + ["tensorrt_llm"]) is None
    assert stub_identity(["/usr/bin/python3", "x.py"]) is None
    assert stub_identity(argv[:5]) is None


def test_launcher_never_opens_the_load_api_by_itself(tmp_path):
    """Explicit model control (reloads) only where the caller asks for it: the load API can override a
    model's config, so an unrestricted `make serve` keeps Triton's default mode and the watchdog restarts."""
    def server(**kw):
        return TritonServer(1, 2, 3, repo_root=tmp_path, tritonserver=tmp_path / "tritonserver", **kw)

    assert server().server_args() == [] and server().watchdog.can_reload is False
    explicit = ["--model-control-mode=explicit", "--load-model=*"]
    assert server(extra_args=explicit).server_args() == explicit
    assert server(extra_args=explicit).watchdog.can_reload is True


def test_is_alive_sees_a_zombie_as_dead_and_descendants_finds_children():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while is_alive(child.pid) and time.monotonic() < deadline:  # exited, not reaped: a zombie
        time.sleep(0.05)
    assert child.pid in descendants(os.getpid())
    assert not is_alive(child.pid)
    child.wait()
    assert not is_alive(child.pid) and child.pid not in descendants(os.getpid())
    assert is_alive(os.getpid())
