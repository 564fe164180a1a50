"""deploy/dynamo/tritonllm-dynamo.yaml: the DynamoGraphDeployment for Dynamo's operator. Checked here
with what can be had without a cluster: Kubernetes' own PodSpec schema (kubernetes-validate) for every
pod template, our worker's CLI for its arguments, and the shape of Dynamo's v1beta1 examples."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tritonllm.dynamo.engine import parse_args

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "dynamo" / "tritonllm-dynamo.yaml"
K8S_VERSION = "1.30.0"  # as tests/unit/test_trtllm_helm.py


@pytest.fixture(scope="module")
def dgd() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def test_shape_is_dynamos_v1beta1_graph(dgd):
    assert (dgd["apiVersion"], dgd["kind"]) == ("nvidia.com/v1beta1", "DynamoGraphDeployment")
    comps = {c["name"]: c for c in dgd["spec"]["components"]}
    assert {c["type"] for c in comps.values()} == {"frontend", "worker"}
    front, worker = comps["Frontend"], comps["TritonllmWorker"]
    env = {e["name"]: e["value"] for e in front["podTemplate"]["spec"]["containers"][0]["env"]}
    assert env["DYN_ROUTER_MODE"] == "kv" and worker["replicas"] == 2


def test_every_pod_template_is_a_valid_pod_spec(dgd):
    kv = pytest.importorskip("kubernetes_validate")
    for comp in dgd["spec"]["components"]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": comp["name"].lower()},
               "spec": comp["podTemplate"]["spec"]}
        kv.validate(pod, K8S_VERSION, strict=True)


def test_the_worker_runs_our_entry_point_with_arguments_it_accepts(dgd, monkeypatch):
    worker = next(c for c in dgd["spec"]["components"] if c["type"] == "worker")
    main = worker["podTemplate"]["spec"]["containers"][0]
    assert main["command"] == ["python3", "-m", "tritonllm.dynamo"]
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "kubernetes")  # what the operator sets in its pods
    monkeypatch.setenv("DYN_NAMESPACE", "ns1")
    args = parse_args(main["args"])
    assert args.discovery_backend == "kubernetes" and args.namespace == "ns1"
    assert args.num_threads == int(main["resources"]["requests"]["cpu"])
    assert args.deployment.startswith(main["volumeMounts"][0]["mountPath"])
