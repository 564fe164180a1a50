"""/v1/embeddings through the OpenAI server, Triton and our engine on the real model (SmolLM2-135M-Instruct from its
GGUF), driven by the `openai` SDK unmodified: the vectors equal transformers' final hidden states of the same file
pooled the same way (last token / mean, L2-normalized), from strings and token ids, in float and base64 (the SDK's
default), under profile ``exact`` (the default's int8 activations are llama.cpp's arithmetic, not transformers');
embeddings run beside a streamed generation; bad input is 400 naming the field; no KV block stays held.
"""
from __future__ import annotations

import base64
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import openai  # noqa: E402

from openai_helpers import client, openai_server, tokenizer  # noqa: E402,F401  (fixtures)
from robustness_helpers import wait_idle  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "build" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = ["The capital of France is Paris.", "A lighthouse guides ships at night.", "def add(a, b): return a + b"]


@pytest.fixture(scope="module")
def openai_url(exact_server):
    """The OpenAI front over profile ``exact``: the default deployment's int8 activations (``auto``) move hidden
    states by more than these bounds allow (docs/quantization.md)."""
    for url, _ in openai_server(exact_server):
        yield url


@pytest.fixture(scope="module")
def reference(tokenizer, default_model_reference):
    """text or ids -> transformers' last_hidden_state on the served GGUF (dequantized to fp32): the base model under
    the causal LM, as ``AutoModel`` would load it."""
    model = default_model_reference.model

    def hidden(item) -> np.ndarray:
        ids = tokenizer(item).input_ids if isinstance(item, str) else item
        with torch.no_grad():
            return model(torch.tensor([ids])).last_hidden_state[0].numpy()

    return hidden


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _close(got, want) -> None:
    """Same direction within fp32 noise: the served engine and transformers sum in different orders."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    assert float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want))) > 1 - 1e-5
    assert np.abs(got - want).max() < 2e-3


def test_embeddings_equal_transformers_last_token_pooling(client, reference, tokenizer):
    r = client.embeddings.create(model="tritonllm", input=TEXTS, encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == "tritonllm"
    for d, text in zip(r.data, TEXTS):
        assert len(d.embedding) == 576  # SmolLM2-135M's hidden size
        _close(d.embedding, _unit(reference(text)[-1]))
    tokens = sum(len(tokenizer(t).input_ids) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == tokens


def test_mean_pooling_token_ids_and_raw_vectors(client, reference, tokenizer):
    ids = tokenizer(TEXTS[1]).input_ids
    r = client.embeddings.create(model="tritonllm", input=[ids], encoding_format="float",
                                 extra_body={"pooling": "mean", "normalize": False})
    _close(r.data[0].embedding, reference(ids).mean(0))
    assert r.usage.prompt_tokens == len(ids)


def test_the_sdks_default_base64_decodes_to_the_same_vectors(client, openai_url):
    floats = client.embeddings.create(model="tritonllm", input=TEXTS[0], encoding_format="float").data[0].embedding
    decoded = client.embeddings.create(model="tritonllm", input=TEXTS[0]).data[0].embedding  # SDK: base64
    np.testing.assert_allclose(decoded, floats, atol=1e-6)
    import json
    import urllib.request

    body = json.dumps({"model": "tritonllm", "input": TEXTS[0], "encoding_format": "base64"}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{openai_url}/v1/embeddings", body,
                                                       {"Content-Type": "application/json"})) as resp:
        raw = json.loads(resp.read())["data"][0]["embedding"]
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(raw), dtype="<f4"), floats, atol=1e-6)


def test_embeddings_run_beside_a_streamed_generation(client, exact_server, reference):
    done = {}

    def generate():
        stream = client.chat.completions.create(model="tritonllm", max_tokens=64, temperature=0, stream=True,
                                                messages=[{"role": "user", "content": "Tell me a story."}])
        done["text"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    t = threading.Thread(target=generate)
    t.start()
    for _ in range(4):
        r = client.embeddings.create(model="tritonllm", input=TEXTS, encoding_format="float")
        _close(r.data[2].embedding, _unit(reference(TEXTS[2])[-1]))
    t.join(timeout=120)
    assert done.get("text")
    m = wait_idle(exact_server.metrics_url)
    assert m["llm_kv_cache_usage_ratio"] == 0 and m["llm_requests_running"] == 0, m


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": "x", "dimensions": 64}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "model": "ensemble"}, "model"),
])
def test_bad_input_is_400_naming_the_field(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(**{"model": "tritonllm", **body})
    assert e.value.body["param"] == param, e.value.body


def test_token_ids_outside_the_vocabulary_are_refused(client):
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.embeddings.create(model="tritonllm", input=[[1, 2, 10 ** 6]])
