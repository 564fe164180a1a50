"""The default deployment serves a real model: SmolLM2-135M-Instruct from its own GGUF (Q4_1 blocks, Q8_0 embedding),
and its greedy text equals transformers' on the same file (transformers' GGUF loader, dequantized to fp32), through
the ensemble, the BLS and the OpenAI chat endpoint; every KV block is back afterwards.

The reference runs in this process: transformers' generate, greedy, stopping at the model's end-of-turn token, on
the ids our own preprocessing makes (the prompts are plain text, the chat goes through the model's ChatML template).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from openai_helpers import openai_server, sdk_client
from robustness_helpers import served_parameters, stream_request, text_of, text_tensors, wait_idle

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / "build" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
           "The three primary colors are", "Photosynthesis is the process by which"]
CHAT = [{"role": "user", "content": "What is the capital of Germany?"}]
NEW = 24


def _all_blocks_back(server) -> None:
    m = wait_idle(server.metrics_url)
    assert m["llm_kv_cache_usage_ratio"] == 0 and m["llm_requests_running"] == 0, m


@pytest.fixture(scope="module")
def reference():
    """(tokenizer, greedy(ids) -> generated ids) of transformers on the served file."""
    import transformers as tf

    from tritonllm.model_files import load_hf_tokenizer

    tok = load_hf_tokenizer(GGUF)
    model = tf.AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name, dtype=torch.float32).eval()

    def greedy(ids: list[int]) -> list[int]:
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        return [t for t in out[0, len(ids):].tolist() if t != tok.eos_token_id]

    return tok, greedy


def test_the_default_deployment_names_the_real_model(triton_server):
    path = served_parameters(triton_server, "tensorrt_llm")["gpt_model_path"]
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert os.path.samefile(GGUF, ROOT / "model_repository" / "tensorrt_llm" / path)


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_served_greedy_text_equals_transformers(triton_server, reference, model):
    tok, greedy = reference
    for prompt in PROMPTS:
        chunks, err = stream_request(triton_server.grpc_url, model, text_tensors(prompt, NEW, stream=np.array([[True]])))
        assert err is None, err.message()
        expected = tok.decode(greedy(tok.encode(prompt)), skip_special_tokens=True)
        assert text_of(chunks) == expected, (model, prompt)
    _all_blocks_back(triton_server)


def test_served_chat_equals_transformers_through_the_openai_api(triton_server, reference):
    tok, greedy = reference
    ids = tok.encode(tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False))  # as preprocessing
    expected = tok.decode(greedy(ids), skip_special_tokens=True)
    assert "Berlin" in expected  # a real answer, not a toy's
    for url, _ in openai_server(triton_server):
        client = sdk_client(url)
        r = client.chat.completions.create(model="tritonllm", messages=CHAT, max_tokens=NEW, temperature=0)
        assert r.choices[0].message.content == expected
        assert r.usage.prompt_tokens == len(ids)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="tritonllm", messages=CHAT, max_tokens=NEW, temperature=0, stream=True) if c.choices)
        assert streamed == expected
    _all_blocks_back(triton_server)


def test_ids_through_tensorrt_llm_equal_transformers(triton_server, reference):
    """The token-level slot on its own: the same ids, the same greedy ids."""
    from robustness_helpers import ids_of, ids_tensors

    tok, greedy = reference
    ids = tok.encode(PROMPTS[1])
    chunks, err = stream_request(triton_server.grpc_url, "tensorrt_llm",
                                 {**ids_tensors(ids, NEW, stream=True), "end_id": np.array([[tok.eos_token_id]], np.int32)})
    assert err is None, err.message()
    assert [t for t in ids_of(chunks) if t != tok.eos_token_id] == greedy(ids)
    _all_blocks_back(triton_server)
