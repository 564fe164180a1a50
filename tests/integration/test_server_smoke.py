"""The project's real repository on a real tritonserver: up, and every model READY.

Uses the session fixture `triton_server` (tests/conftest.py): build_all, then tritonserver on free ports
with model_repository + ensembles.
"""
from __future__ import annotations

import urllib.request

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

LLM_MODELS = {"preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls", "ensemble"}


def test_server_is_live_and_ready(triton_server):
    client = httpclient.InferenceServerClient(triton_server.http_url)
    try:
        assert client.is_server_live() and client.is_server_ready()
    finally:
        client.close()


def test_every_model_in_the_repository_is_ready(triton_server):
    client = httpclient.InferenceServerClient(triton_server.http_url)
    try:
        index = client.get_model_repository_index()
    finally:
        client.close()
    states = {m["name"]: m.get("state") for m in index}
    assert LLM_MODELS <= set(states), f"missing models: {LLM_MODELS - set(states)}"
    not_ready = {name: state for name, state in states.items() if state != "READY"}
    assert not not_ready, f"not READY: {not_ready}\n--- log tail ---\n{triton_server.log_tail(40)}"


def test_llm_models_are_decoupled_as_rendered(triton_server):
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        for name in ("tensorrt_llm", "tensorrt_llm_bls", "ensemble"):
            config = client.get_model_config(name, as_json=True)["config"]
            assert config.get("model_transaction_policy", {}).get("decoupled") is True, name
    finally:
        client.close()


def test_metrics_endpoint_serves_prometheus_text(triton_server):
    with urllib.request.urlopen(f"http://{triton_server.metrics_url}/metrics", timeout=10) as r:
        body = r.read().decode()
    assert "nv_inference_request_success" in body
