"""Launcher pieces that need no server: failure parsing of a real Triton log, ports, backend assembly."""
from __future__ import annotations

import os

from tritonllm.serving import discovery
from tritonllm.serving.launcher import default_ports, find_free_ports
from tritonllm.serving.server_log import describe_failure, failed_models

# Excerpt of tritonserver 2.51's output for a model whose model.py raises on import (seen on this machine).
LOG = r'''
E1130 13:07:04.878 7315 model_lifecycle.cc:654] "failed to load 'broken' version 1: Internal: ModuleNotFoundError: No module named 'does_not_exist_xyz'\n\nAt:\n  /tmp/lt/repo/broken/1/model.py(1): <module>\n"
I1130 13:07:04.879345 7315 server.cc:674]
+--------+---------+----------------------------------------------------------------------------------+
| Model  | Version | Status                                                                           |
+--------+---------+----------------------------------------------------------------------------------+
| broken | 1       | UNAVAILABLE: Internal: ModuleNotFoundError: No module named 'does_not_exist_xyz' |
|        |         |                                                                                  |
|        |         | At:                                                                              |
| echo   | 1       | READY                                                                            |
| other  | 1       | UNAVAILABLE: Invalid argument: unexpected inference input 'X'                    |
+--------+---------+----------------------------------------------------------------------------------+
error: creating server: Internal - failed to load all models
'''


def test_failed_models_are_named_with_their_reason():
    failed = failed_models(LOG)
    assert list(failed) == ["broken", "other"]
    assert failed["broken"] == "Internal: ModuleNotFoundError: No module named 'does_not_exist_xyz'"
    assert failed["other"].startswith("UNAVAILABLE: Invalid argument")
    text = describe_failure(LOG, tail_lines=3)
    assert text.startswith("tritonserver failed to load: broken, other")
    assert text.rstrip().endswith("error: creating server: Internal - failed to load all models")


def test_no_failure_in_a_clean_log():
    assert failed_models("| echo | 1 | READY |\n") == {}


def test_free_ports_are_distinct_and_bindable():
    ports = find_free_ports(3)
    assert len(set(ports)) == 3 and all(1024 <= p < 65536 for p in ports)


def test_default_ports_from_deployment_then_environment(monkeypatch):
    for key in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert default_ports() == {"http_port": 8000, "grpc_port": 8001, "metrics_port": 8002}
    monkeypatch.setenv("GRPC_PORT", "9101")
    assert default_ports()["grpc_port"] == 9101


def test_assemble_backends_links_adapters_and_matches_the_python(tmp_path):
    server = discovery.find_tritonserver()
    (tmp_path / "backends" / "mine").mkdir(parents=True)
    (tmp_path / "backends" / "mine" / "model.py").write_text("")
    (tmp_path / "backends" / "library_only").mkdir()  # no model.py: not a backend
    out = discovery.assemble_backends(server, tmp_path)
    assert (out / "python" / "libtriton_python.so").is_file()
    assert (out / "python" / "triton_python_backend_stub").is_file()
    assert os.readlink(out / "mine") == str((tmp_path / "backends" / "mine").resolve())
    assert not (out / "library_only").exists()
    (tmp_path / "backends" / "mine" / "model.py").unlink()
    discovery.assemble_backends(server, tmp_path)  # idempotent; drops the removed adapter
    assert not (out / "mine").exists()


def test_auto_complete_is_off_unless_the_caller_chose():
    """Our configs are complete: auto-complete would start a second stub per Python model for nothing. A caller's
    own choice (either flag, with or without a value) is left alone."""
    from pathlib import Path

    from tritonllm.serving.tritonserver import TritonServer

    def command(*extra):
        return TritonServer(1, 2, 3, tritonserver="/bin/true", extra_args=list(extra)).command(Path("b"))

    assert command().count("--disable-auto-complete-config") == 1
    for own in ("--disable-auto-complete-config=false", "--strict-model-config=true", "--strict-model-config"):
        assert command(own).count("--disable-auto-complete-config") == 0 and own in command(own)
