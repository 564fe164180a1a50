"""Serve the GPU profile on tp x pp GPUs: one tritonserver per MPI rank, as NVIDIA's launch_triton_server.py.

A TensorRT-LLM engine built for world size W = tp_size x pp_size runs as W MPI ranks, one GPU each. NVIDIA's
``triton_backend/scripts/launch_triton_server.py`` (leader mode) starts them with one ``mpirun`` holding W
app contexts separated by ``:``. Rank 0 serves every model; ranks > 0 load only ``tensorrt_llm``
(``--model-control-mode=explicit --load-model=tensorrt_llm``) and act as workers of its executor. Each rank
gets its own Python-backend shared-memory prefix so the ranks' stubs do not collide.

Usage (on the GPU host, inside nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3):
    python build_scripts/serve_trtllm_mpi.py --dry-run     # print the mpirun command
    python build_scripts/serve_trtllm_mpi.py               # assemble build/backends, exec mpirun

Invariants:
- ``mpirun_command`` is pure (unit-tested exactly). The world size comes from ``deployment.yaml:
  profiles.trtllm`` (tp_size x pp_size), the ports from ``server:``; flags override.
- Every rank runs with ``--model-config-name trtllm`` over both repositories (``model_repository`` and
  ``ensembles``) and ``--backend-directory build/backends`` (our Python-based backends plus, linked by
  ``tritonllm.serving.discovery.assemble_backends``, the ``tensorrtllm`` backend the container ships).
- Single node only: W must not exceed the GPUs on this host (checked before a real start, not in --dry-run).
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "backends"))

NGC_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
CONFIG_NAME = "trtllm"
LLM_MODEL = "tensorrt_llm"


def rank_args(rank: int, tritonserver: str, *, http_port: int, grpc_port: int, metrics_port: int,
              repositories: list[str], backend_dir: str, config_name: str = CONFIG_NAME,
              llm_model: str = LLM_MODEL) -> list[str]:
    """The tritonserver argv of one rank."""
    args = [tritonserver]
    args += [f"--model-repository={r}" for r in repositories]
    args += [f"--backend-directory={backend_dir}", f"--model-config-name={config_name}",
             f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}"]
    if rank != 0:  # workers: only the engine; the Python models and the ensemble live on rank 0
        args += ["--model-control-mode=explicit", f"--load-model={llm_model}"]
    args += ["--disable-auto-complete-config", f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
    return args


def mpirun_command(world_size: int, tritonserver: str, **kwargs) -> list[str]:
    """``mpirun --allow-run-as-root -n 1 <rank 0> : -n 1 <rank 1> : ...`` (pure)."""
    if world_size <= 0:
        raise ValueError(f"world size must be > 0 (got {world_size})")
    cmd = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        if rank:
            cmd.append(":")
        cmd += ["-n", "1", *rank_args(rank, tritonserver, **kwargs)]
    return cmd


def world_size(settings: dict | None) -> int:
    """tp_size x pp_size of ``profiles.trtllm`` (1 x 1 when absent). Kept free of tritonclient imports:
    this runs inside NVIDIA's container, which need not have it."""
    s = settings or {}
    tp, pp = s.get("tp_size", 1), s.get("pp_size", 1)
    for name, v in (("tp_size", tp), ("pp_size", pp)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"deployment.yaml: profiles.trtllm.{name} = {v!r}; must be a positive integer")
    return tp * pp


def count_gpus() -> int:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    out = subprocess.run([smi, "--list-gpus"], capture_output=True, text=True)
    return len([line for line in out.stdout.splitlines() if line.strip()]) if out.returncode == 0 else 0


def main(argv: list[str] | None = None) -> int:
    with open(REPO / "deployment.yaml") as f:
        dep = yaml.safe_load(f) or {}
    server = dep.get("server") or {}
    settings = (dep.get("profiles") or {}).get(CONFIG_NAME)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=world_size(settings))
    p.add_argument("--tritonserver", default=None, help="default: $TRITONSERVER, PATH, /opt/tritonserver/bin")
    p.add_argument("--http-port", type=int, default=int(server.get("http_port", 8000)))
    p.add_argument("--grpc-port", type=int, default=int(server.get("grpc_port", 8001)))
    p.add_argument("--metrics-port", type=int, default=int(server.get("metrics_port", 8002)))
    p.add_argument("--dry-run", action="store_true", help="print the command; start nothing")
    args = p.parse_args(argv)
    if settings is None:
        print("serve_trtllm_mpi: deployment.yaml has no profiles.trtllm; using world size "
              f"{args.world_size}", file=sys.stderr)

    binary = args.tritonserver
    if binary is None:
        if args.dry_run:
            binary = os.environ.get("TRITONSERVER") or shutil.which("tritonserver") or NGC_TRITONSERVER
        else:
            from tritonllm.serving.discovery import find_tritonserver
            binary = str(find_tritonserver())
    backend_dir = REPO / "build" / "backends"
    cmd = mpirun_command(args.world_size, binary, http_port=args.http_port, grpc_port=args.grpc_port,
                         metrics_port=args.metrics_port,
                         repositories=[str(REPO / "model_repository"), str(REPO / "ensembles")],
                         backend_dir=str(backend_dir))
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    if shutil.which("mpirun") is None:
        print("serve_trtllm_mpi: mpirun not found (NVIDIA's trtllm container ships Open MPI)", file=sys.stderr)
        return 2
    gpus = count_gpus()
    if gpus < args.world_size:
        print(f"serve_trtllm_mpi: world size {args.world_size} (tp x pp) needs as many GPUs; "
              f"nvidia-smi lists {gpus}", file=sys.stderr)
        return 2
    from tritonllm.serving.discovery import assemble_backends, server_env
    assemble_backends(Path(binary), REPO)
    print(f"$ {shlex.join(cmd)}", flush=True)
    os.chdir(REPO)
    os.execvpe("mpirun", cmd, server_env(Path(binary), REPO))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
