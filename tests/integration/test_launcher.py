"""The launcher against the real tritonserver, on throwaway repositories (not the project's models).

A trivial Python model must come up READY and answer; stop() must drain and exit 0; a model whose
model.py cannot be imported must make start() fail with a message naming that model.
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from tritonllm.serving.launcher import ServerStartError, TritonServer, find_free_ports

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""
# The stub must run inside *this* interpreter's environment: same numpy (the venv pins numpy<2; a
# system numpy 2 silently corrupts tensors in the stub) and the editable tritonllm importable.
DOUBLE = textwrap.dedent(f"""
    import numpy
    import tritonllm.contract
    import triton_python_backend_utils as pb_utils

    assert numpy.__version__ == "{np.__version__}", numpy.__version__

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)]) for r in requests]
""")


def _model(repo, name, source):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (repo / name / "1" / "model.py").write_text(source)


def _server(tmp_path, repo):
    http, grpc, metrics = find_free_ports(3)
    # repo_root=tmp_path: build/backends is assembled there, with no adapters of ours.
    return TritonServer(http, grpc, metrics, repositories=[repo], log_path=tmp_path / "server.log",
                        repo_root=tmp_path, exit_timeout_s=3)


def test_trivial_model_ready_answers_and_stops_cleanly(tmp_path):
    repo = tmp_path / "models"
    _model(repo, "double", DOUBLE)
    server = _server(tmp_path, repo).start(timeout=120)
    try:
        assert server.is_ready()
        client = httpclient.InferenceServerClient(server.http_url)
        inp = httpclient.InferInput("IN", [2, 1], "INT32")
        inp.set_data_from_numpy(np.array([[3], [5]], dtype=np.int32))
        assert client.infer("double", [inp]).as_numpy("OUT").tolist() == [[6], [10]]
        client.close()
    finally:
        code = server.stop()
    assert code == 0
    assert not server.is_ready()
    assert server.stop() is None  # idempotent


def test_broken_model_is_named_in_the_failure(tmp_path):
    repo = tmp_path / "models"
    _model(repo, "double", DOUBLE)
    _model(repo, "broken_model", "import a_module_that_does_not_exist\n")
    server = _server(tmp_path, repo)
    with pytest.raises(ServerStartError) as err:
        server.start(timeout=120)
    message = str(err.value)
    assert "failed to load: broken_model" in message
    assert "a_module_that_does_not_exist" in message
    assert "--- tritonserver log tail ---" in message
    assert server.process is None  # stopped, nothing left running


def test_a_port_in_use_is_named_with_how_to_choose_another(tmp_path):
    """Triton's own message ("Socket '0.0.0.0:N' already in use") is only in its log: the error says which port
    and which option moves it, instead of "did not become ready"."""
    import socket

    repo = tmp_path / "models"
    _model(repo, "double", DOUBLE)
    server = _server(tmp_path, repo)
    taken = socket.socket()
    taken.bind(("0.0.0.0", server.grpc_port))
    taken.listen(1)
    try:
        with pytest.raises(ServerStartError) as err:
            server.start(timeout=120)
    finally:
        taken.close()
    first = str(err.value).splitlines()[1]
    assert first.startswith(f"port {server.grpc_port} is already in use"), str(err.value)
    assert "GRPC_PORT=" in first and "--grpc-port" in first
    assert "did not become ready" not in str(err.value)
