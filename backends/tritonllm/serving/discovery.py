"""Find tritonserver and prepare what it needs: the backend directory and the process environment.

Invariants:
- The server binary is found in a fixed order: ``$TRITONSERVER``, then ``PATH`` (plus
  ``/opt/tritonserver/bin``, NVIDIA's NGC containers), then the binary shipped inside the PyPI wheel
  ``nvidia-pytriton``. Nothing is downloaded.
- ``build/backends/`` is (re)assembled idempotently: ``python/`` holds ``libtriton_python.so``,
  ``triton_python_backend_utils.py`` and the stub built for the *running* Python; every
  ``backends/<name>/`` that holds a ``model.py`` is symlinked as ``build/backends/<name>`` (a Python-based
  backend); any other backend the server ships (e.g. ``tensorrtllm`` in NGC) is symlinked too.
- The server's environment puts this interpreter's ``LIBDIR`` first on ``LD_LIBRARY_PATH`` (the stub
  links ``libpython3.X.so``) and this interpreter's ``bin`` first on ``PATH``: the stub's embedded Python
  takes its prefix from the first ``python3`` on PATH, so that is how a virtualenv's site-packages (with
  ``numpy<2`` and the editable ``tritonllm``) reach the models even when the venv is not activated.
  The stub ignores ``PYTHONPATH`` (seen with 2.51); it is set anyway (``<repo>/backends`` + site-packages)
  for stubs that honour it. Adapters therefore rely on ``pip install -e .`` to import ``tritonllm``.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
NGC_BIN_DIR = "/opt/tritonserver/bin"


def _pytriton_server_root() -> Path | None:
    # find_spec locates the package without executing its __init__ (pytriton is installed --no-deps,
    # so importing it could fail on missing optional dependencies).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return root if (root / "bin" / "tritonserver").exists() else None


def find_tritonserver() -> Path:
    """Return the tritonserver binary ($TRITONSERVER, then PATH + /opt/tritonserver/bin, then the wheel)."""
    env = os.environ.get("TRITONSERVER")
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise FileNotFoundError(f"TRITONSERVER={env} is not an executable file")
        return path
    search = os.pathsep.join([os.environ.get("PATH", ""), NGC_BIN_DIR])
    found = shutil.which("tritonserver", path=search)
    if found:
        return Path(found)
    root = _pytriton_server_root()
    if root is not None:
        return root / "bin" / "tritonserver"
    raise FileNotFoundError(
        "tritonserver not found: set TRITONSERVER, put it on PATH, or `pip install --no-deps nvidia-pytriton==0.7.0`"
    )


def _site_packages() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(p for p in (paths["purelib"], paths["platlib"]) if p))


def _copy_if_changed(src: Path, dst: Path) -> None:
    if dst.exists() and not dst.is_symlink():
        s, d = src.stat(), dst.stat()
        if s.st_size == d.st_size and int(s.st_mtime) == int(d.st_mtime):
            return
    # Copy then rename over: a stub that is running keeps its old inode, a concurrent reader sees a whole file.
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _symlink(target: Path, link: Path) -> None:
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    # Link under a temporary name, then rename over: a concurrent launcher never sees a missing link.
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, link)


def assemble_backends(server: Path, repo_root: Path = REPO_ROOT, out_dir: Path | None = None) -> Path:
    """Build ``<repo>/build/backends`` (see module docstring) and return it. Idempotent and quick."""
    out_dir = out_dir or repo_root / "build" / "backends"
    out_dir.mkdir(parents=True, exist_ok=True)
    server_root = server.resolve().parent.parent
    shipped = server_root / "backends"
    py_src = shipped / "python"
    lib = py_src / "libtriton_python.so"
    if not lib.exists():
        raise FileNotFoundError(f"Python backend not found next to {server}: missing {lib}")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = server_root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():  # NGC layout: the stub sits beside the library, built for the image's Python
        stub = py_src / "triton_python_backend_stub"
    if not stub.exists():
        raise FileNotFoundError(f"no Python backend stub for Python {version} under {server_root}")
    py_dst = out_dir / "python"
    if py_dst.is_symlink():
        py_dst.unlink()
    py_dst.mkdir(exist_ok=True)
    for src in (lib, py_src / "triton_python_backend_utils.py", stub):
        _copy_if_changed(src, py_dst / src.name)

    wanted: dict[str, Path] = {}
    if shipped.is_dir():
        for other in sorted(shipped.iterdir()):
            if other.is_dir() and other.name != "python":
                wanted[other.name] = other
    adapters = repo_root / "backends"
    for adapter in sorted(adapters.iterdir()) if adapters.is_dir() else ():
        if (adapter / "model.py").is_file():
            wanted[adapter.name] = adapter.resolve()  # ours win over a shipped backend of the same name
    for name, target in wanted.items():
        _symlink(target, out_dir / name)
    for entry in out_dir.iterdir():  # drop links to adapters that were removed
        if entry.is_symlink() and entry.name not in wanted:
            entry.unlink()
    return out_dir


def server_env(server: Path, repo_root: Path = REPO_ROOT, base: dict | None = None) -> dict:
    """Environment for tritonserver: LIBDIR first on LD_LIBRARY_PATH, backends + site-packages on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    lib_dirs = [sysconfig.get_config_var("LIBDIR") or ""]
    for sp in _site_packages():
        libs = Path(sp) / "nvidia_pytriton.libs"
        if libs.is_dir() and str(server.resolve()).startswith(sp):
            lib_dirs.append(str(libs))
    lib_dirs.append(env.get("LD_LIBRARY_PATH", ""))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in lib_dirs if p)
    py_paths = [str(repo_root / "backends"), *_site_packages(), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in py_paths if p)
    # The stub's embedded interpreter finds its prefix from the first `python3` on PATH: put this
    # interpreter's bin first so a virtualenv's packages (numpy<2!) win even when it is not activated.
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in (bin_dir, env.get("PATH", "")) if p)
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    return env


def find_free_ports(count: int = 3) -> list[int]:
    """Ports the OS hands out for port 0; all sockets stay open until every port is chosen (no duplicates)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


