"""The ensemble's two wirings on one real tritonserver (issue 20): ``ensemble`` as rendered by default (text
made in the tensorrt_llm step, two steps) and NVIDIA's three steps (preprocessing -> tensorrt_llm ->
postprocessing, ``models.ensemble.detokenize_in: postprocessing``) served side by side as
``ensemble_three_step``. Both must answer the same text in the same deltas; the two-step one must not run
postprocessing at all, and tensorrt_llm must not spend decoding on direct callers."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from robustness_helpers import dedicated_server, ids_tensors, stream_request, throwaway_repository
from test_llm_pipeline import GrpcStream, text_tensors

import render_configs as rc
from tritonllm import contract as C

THREE = "ensemble_three_step"
PROMPTS = ("Once upon a time", "caf\u00e9 na\u00efve \u2603", "The little dog")


@pytest.fixture(scope="module")
def server(built_repository):
    repo = throwaway_repository({}, models=(C.PREPROCESSING, C.TENSORRT_LLM, C.POSTPROCESSING))
    llm = rc.load_deployment()["llm"]
    for name, steps in ((C.ENSEMBLE, C.ensemble_steps(text_in_llm=True)), (THREE, C.ensemble_steps())):
        cfg = rc.ensemble_model(llm, steps=steps)
        cfg.name = name
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text_format.MessageToString(cfg))
    try:
        with dedicated_server(repo) as s:
            yield s
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def _deltas(server, model, prompt, stream=True, **extra):
    results, error = GrpcStream(server, model, text_tensors(prompt, max_tokens=32, stream=stream, **extra)).collect()
    assert error is None, f"{model}: {error}"
    return [r.as_numpy("text_output").reshape(-1)[0].decode("utf-8") for r in results]


def _executions(server, model):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    finally:
        client.close()
    return int(stats.get("execution_count", 0))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_both_wirings_answer_the_same_deltas(server, prompt):
    posts = _executions(server, C.POSTPROCESSING)
    two = _deltas(server, C.ENSEMBLE, prompt)
    assert _executions(server, C.POSTPROCESSING) == posts  # the two-step ensemble never calls it
    three = _deltas(server, THREE, prompt)
    assert _executions(server, C.POSTPROCESSING) > posts
    assert len(two) > 1 and two == three                   # the same text, cut the same way
    seeded = {"temperature": np.array([[0.9]], np.float32), "top_k": np.array([[20]], np.int32),
              "seed": np.array([[7]], np.uint64)}
    assert _deltas(server, C.ENSEMBLE, prompt, **seeded) == _deltas(server, THREE, prompt, **seeded)
    whole = _deltas(server, C.ENSEMBLE, prompt, stream=False)
    assert whole == _deltas(server, THREE, prompt, stream=False) == ["".join(two)]


def test_direct_callers_get_token_ids_and_no_text(server):
    chunks, error = stream_request(server.grpc_url, C.TENSORRT_LLM, ids_tensors(list(range(10, 30)), 8, stream=True))
    assert error is None and len(chunks) > 1
    assert not any("text_output" in c for c in chunks)  # every output is "requested" by a client naming none
    assert sum(c["output_ids"].size for c in chunks) == 8
