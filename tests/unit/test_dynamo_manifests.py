"""deploy/dynamo/*.yaml: DynamoGraphDeployments for Dynamo's operator (aggregated, and disaggregated prefill /
decode). Checked with what can be had without a cluster: Kubernetes' own PodSpec schema (kubernetes-validate)
for every pod template, our worker's CLI for its arguments, and Dynamo's own v1beta1 reader (the planner's
``dynamo.planner.monitoring.dgd_services``, run in build/dynamo-venv) for the components' roles."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tritonllm.dynamo.engine import parse_args

ROOT = Path(__file__).resolve().parents[2]
AGG = ROOT / "deploy" / "dynamo" / "tritonllm-dynamo.yaml"
DISAGG = ROOT / "deploy" / "dynamo" / "tritonllm-dynamo-disagg.yaml"
DYNAMO_PY = ROOT / "build" / "dynamo-venv" / "bin" / "python"
K8S_VERSION = "1.30.0"  # as tests/unit/test_trtllm_helm.py
# Resolve prefill / decode with the planner's own function; prints {role: component name or the error}.
# dynamo.planner's package __init__ imports its performance model, which needs `aisimulate` (a PyPI
# placeholder, not installable): the package is entered without running that __init__; the reader and
# the modules it imports are Dynamo's, unchanged.
RESOLVE = """
import importlib.util, json, sys, types, yaml
spec = importlib.util.find_spec("dynamo.planner")
pkg = types.ModuleType("dynamo.planner")
pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["dynamo.planner"] = pkg
from dynamo.planner.config.defaults import SubComponentType
from dynamo.planner.monitoring.dgd_services import get_component_from_type_or_name
dgd = yaml.safe_load(open(sys.argv[1]))
out = {}
for role in (SubComponentType.PREFILL, SubComponentType.DECODE):
    try:
        s = get_component_from_type_or_name(dgd, role)
        out[role.value] = [s.name, s.number_replicas()]
    except Exception as e:
        out[role.value] = type(e).__name__
print(json.dumps(out))
"""


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _comps(dgd: dict) -> dict[str, dict]:
    return {c["name"]: c for c in dgd["spec"]["components"]}


def test_shape_is_dynamos_v1beta1_graph():
    for path, types in ((AGG, {"frontend", "worker"}), (DISAGG, {"frontend", "prefill", "decode"})):
        dgd = _load(path)
        assert (dgd["apiVersion"], dgd["kind"]) == ("nvidia.com/v1beta1", "DynamoGraphDeployment")
        assert {c["type"] for c in dgd["spec"]["components"]} == types, path.name
        front = _comps(dgd)["Frontend"]
        env = {e["name"]: e["value"] for e in front["podTemplate"]["spec"]["containers"][0]["env"]}
        assert env["DYN_ROUTER_MODE"] == "kv"
    assert _comps(_load(AGG))["TritonllmWorker"]["replicas"] == 2


@pytest.mark.parametrize("path", [AGG, DISAGG], ids=lambda p: p.name)
def test_every_pod_template_is_a_valid_pod_spec(path):
    import kubernetes_validate as kv
    for comp in _load(path)["spec"]["components"]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": comp["name"].lower()},
               "spec": comp["podTemplate"]["spec"]}
        kv.validate(pod, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", [AGG, DISAGG], ids=lambda p: p.name)
def test_the_workers_run_our_entry_point_with_arguments_it_accepts(path, monkeypatch):
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "kubernetes")  # what the operator sets in its pods
    monkeypatch.setenv("DYN_NAMESPACE", "ns1")
    workers = [c for c in _load(path)["spec"]["components"] if c["type"] != "frontend"]
    assert workers
    for worker in workers:
        main = worker["podTemplate"]["spec"]["containers"][0]
        assert main["command"] == ["python3", "-m", "tritonllm.dynamo"]
        args = parse_args(main["args"])
        assert args.discovery_backend == "kubernetes" and args.namespace == "ns1"
        assert args.num_threads == int(main["resources"]["requests"]["cpu"])
        assert args.deployment.startswith(main["volumeMounts"][0]["mountPath"])
        want = {"worker": "agg", "prefill": "prefill", "decode": "decode"}[worker["type"]]
        assert args.disaggregation_mode == want, worker["name"]


def test_dynamos_planner_finds_the_roles():
    if not DYNAMO_PY.exists():
        pytest.fail("build/dynamo-venv is missing: run `make dynamo-venv`", pytrace=False)

    def resolve(path: Path) -> dict:
        out = subprocess.run([str(DYNAMO_PY), "-c", RESOLVE, str(path)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert resolve(DISAGG) == {"prefill": ["TritonllmPrefill", 1], "decode": ["TritonllmDecode", 1]}
    # aggregated: the one generic worker is the decode role, and there is no prefill role
    assert resolve(AGG) == {"prefill": "SubComponentNotFoundError", "decode": ["TritonllmWorker", 2]}
