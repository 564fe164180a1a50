"""Helm chart deploy/helm/triton-llm: renders to valid Kubernetes objects that agree with each other and with
deployment.yaml (GPU count = tp x pp, health probes, Prometheus scraping, autoscaling on backend metrics).

No helm binary installs here (neither Debian nor PyPI ships one): the chart is rendered by tests/unit/
helm_lite.py (a strict Go-template subset) and the objects are checked against Kubernetes' OpenAPI schemas
with kubernetes-validate. Where a real `helm` is on PATH, `helm lint` and `helm template` run too.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/triton-llm"

from helm_lite import Chart, Unsupported, to_jinja  # noqa: E402

K8S_VERSION = "1.30.0"
CORE_KINDS = {"Deployment", "Service", "HorizontalPodAutoscaler"}


@pytest.fixture(scope="module")
def chart() -> Chart:
    return Chart(CHART, release="prod")


@pytest.fixture(scope="module")
def deployment_yaml() -> dict:
    return yaml.safe_load((ROOT / "deployment.yaml").read_text())


def by_kind(docs: list[dict]) -> dict[str, dict]:
    out = {}
    for d in docs:
        assert d["kind"] not in out, f"two {d['kind']} objects"
        out[d["kind"]] = d
    return out


def schema_check(docs: list[dict]) -> None:
    import kubernetes_validate as kv
    for d in docs:
        assert d["apiVersion"] and d["kind"] and d["metadata"]["name"]
        if d["kind"] in CORE_KINDS:
            kv.validate(d, K8S_VERSION, strict=True)  # raises ValidationError with the path of the fault


def test_chart_metadata():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["name"] == "triton-llm" and meta["type"] == "application"
    assert len(str(meta["version"]).split(".")) == 3
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"].startswith(str(meta["appVersion"]))
    assert values["image"]["tag"].endswith("-trtllm-python-py3")


@pytest.mark.parametrize("overrides", [
    {},
    {"autoscaling": {"enabled": False}, "metrics": {"serviceMonitor": {"enabled": True}}},
    {"trtllm": {"tpSize": 4, "ppSize": 2}, "imagePullSecrets": [{"name": "ngc"}],
     "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
])
def test_rendered_objects_are_valid_kubernetes(chart, overrides):
    schema_check(chart.manifests(overrides))


def test_default_render_wires_gpus_probes_ports_and_scraping(chart, deployment_yaml):
    objs = by_kind(chart.manifests())
    assert set(objs) == {"Deployment", "Service", "HorizontalPodAutoscaler"}
    dep, svc, hpa = objs["Deployment"], objs["Service"], objs["HorizontalPodAutoscaler"]
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    s = deployment_yaml["profiles"]["trtllm"]
    gpus = s["tp_size"] * s["pp_size"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus == c["resources"]["requests"]["nvidia.com/gpu"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    server = deployment_yaml["server"]
    assert ports == {"http": server["http_port"], "grpc": server["grpc_port"], "metrics": server["metrics_port"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in ports
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports)
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert set(dep["spec"]["selector"]["matchLabels"].items()) <= set(pod["metadata"]["labels"].items())
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ports["metrics"]
    # The model repository is mounted where the GPU profile's gpt_model_path expects it.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["model-repository"] == s["container_repo_root"] == c["workingDir"]
    assert mounts["dshm"] == "/dev/shm"
    # One tritonserver per MPI rank via our launcher script, with the world size and ports above.
    args = " ".join(c["args"]).split()
    assert "build_scripts/serve_trtllm_mpi.py" in args and (ROOT / "build_scripts/serve_trtllm_mpi.py").is_file()
    assert args[args.index("--world-size") + 1] == str(gpus)
    assert args[args.index("--metrics-port") + 1] == str(ports["metrics"])
    # Autoscaling owns the replica count and scales on the backend's queue and KV-cache metrics.
    assert "replicas" not in dep["spec"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": dep["metadata"]["name"]}
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert names == ["trtllm_requests_waiting", "trtllm_kv_cache_used_fraction"]
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_gpu_count_follows_tp_times_pp(chart):
    dep = by_kind(chart.manifests({"trtllm": {"tpSize": 4, "ppSize": 2}}))["Deployment"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    args = " ".join(c["args"]).split()
    assert args[args.index("--world-size") + 1] == "8"


def test_toggles(chart):
    objs = by_kind(chart.manifests({"autoscaling": {"enabled": False}, "replicaCount": 3,
                                    "metrics": {"podAnnotations": False, "serviceMonitor": {"enabled": True}}}))
    assert set(objs) == {"Deployment", "Service", "ServiceMonitor"}
    assert objs["Deployment"]["spec"]["replicas"] == 3
    assert "annotations" not in objs["Deployment"]["spec"]["template"]["metadata"]
    sm, svc = objs["ServiceMonitor"], objs["Service"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm["spec"]["selector"]["matchLabels"].items()) <= set(svc["metadata"]["labels"].items())
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"]
    assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}


def test_helm_lite_refuses_what_it_does_not_understand():
    with pytest.raises(Unsupported):
        to_jinja("{{ range .Values.x }}{{ . }}{{ end }}")
    with pytest.raises(Unsupported):
        to_jinja("{{ .Values.x | b64enc }}")
    with pytest.raises(Unsupported):
        to_jinja("{{ if .Values.x }}")


def test_strict_values_lookup(chart):
    broken = Chart(CHART)
    broken.templates = {"x.yaml": "a: {{ .Values.no.such.key }}\n"}
    with pytest.raises(Exception, match="no"):
        broken.render()


@pytest.mark.skipif(shutil.which("helm") is None, reason="no helm binary on this machine")
def test_real_helm_lint_and_template(tmp_path):
    subprocess.run(["helm", "lint", str(CHART)], check=True, capture_output=True, text=True)
    out = subprocess.run(["helm", "template", "prod", str(CHART)], check=True, capture_output=True, text=True)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "HorizontalPodAutoscaler"}
    schema_check(docs)
    assert by_kind(docs)["Deployment"] == by_kind(Chart(CHART, release="prod").manifests())["Deployment"]
