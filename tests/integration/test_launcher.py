"""The launcher against the real tritonserver, on throwaway repositories (not the project's models).

A trivial Python model must come up READY and answer; stop() must drain and exit 0; a model whose
model.py cannot be imported must make start() fail with a message naming that model; a port taken is named with the
process holding it; a launcher killed outright leaves no server behind.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tritonllm.serving.launcher import ServerStartError, TritonServer, find_free_ports
from tritonllm.serving.orphans import port_holders

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
    first = next(line for line in str(err.value).splitlines() if line.startswith("port "))
    assert first.startswith(f"port {server.grpc_port} is already in use, held by pid {os.getpid()} ("), str(err.value)
    assert "GRPC_PORT=" in first and "--grpc-port" in first
    assert "did not become ready" not in str(err.value)


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.getpgid(int(proc.name)) == pgid:
                pids.append(int(proc.name))
        except ProcessLookupError:
            pass
    return pids


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def _launcher(tmp_path, repo, ports, log):
    """`make serve`'s process, over a throwaway repository; SIGINT at its default disposition whatever ours is."""
    return subprocess.Popen(
        [sys.executable, "-m", "tritonllm.serving.launcher", "--http-port", str(ports[0]), "--grpc-port",
         str(ports[1]), "--metrics-port", str(ports[2]), "--model-repository", str(repo), "--repo-root", str(tmp_path),
         "--log-path", str(log), "--exit-timeout", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_ready(launcher, log):
    lines = []
    for line in launcher.stdout:  # READY is printed once every model is up; EOF if the launcher died
        lines.append(line)
        if "tritonserver READY" in line:
            return
    raise AssertionError("".join(lines[-40:]) + (log.read_text() if log.exists() else ""))


def test_a_killed_launcher_takes_its_server_and_stubs_with_it(tmp_path):
    """SIGKILL runs no handler of the launcher's: its guard stops tritonserver and the stubs within 5 s, ports freed.
    Then the ports held by a server of ours that outlived its launcher are refused by name and pid."""
    repo = tmp_path / "models"
    _model(repo, "double", DOUBLE)
    ports = find_free_ports(3)
    launcher = _launcher(tmp_path, repo, ports, tmp_path / "server.log")
    server_pid = None
    try:
        _wait_ready(launcher, tmp_path / "server.log")
        server_pid = next(pid for pid, cmd in port_holders(ports[0]) if "tritonserver" in cmd)
        stubs = [pid for pid in _group_pids(server_pid) if pid != server_pid]
        assert stubs, "the double model's Python stub runs in the server's group"
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (_group_pids(server_pid) or not all(map(_port_free, ports))):
            time.sleep(0.1)
        assert _group_pids(server_pid) == [], "tritonserver or a stub outlived its launcher by 5 s"
        assert all(map(_port_free, ports)), ports
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.stdout.close()
        if server_pid is not None and _group_pids(server_pid):  # the test failed: leave nothing behind
            os.killpg(server_pid, signal.SIGKILL)


def test_a_server_left_holding_the_ports_is_named(tmp_path):
    """A tritonserver that is not the launcher's child (an orphan of an older launcher, here started bare) holds the
    HTTP port: the launcher exits non-zero, naming the port, the pid, and how to stop it."""
    repo = tmp_path / "models"
    _model(repo, "double", DOUBLE)
    orphan = _server(tmp_path, repo).start(timeout=120)
    try:
        launcher = _launcher(tmp_path, repo, (orphan.http_port, *find_free_ports(2)), tmp_path / "second.log")
        out, _ = launcher.communicate(timeout=120)
        assert launcher.returncode != 0, out
        assert (f"port {orphan.http_port} is already in use, held by pid {orphan.process.pid} (" in out and
                f"a server of ours left running; `kill {orphan.process.pid}` stops it" in out), out
    finally:
        orphan.stop()
