"""The OpenAI-compatible server (clients/openai_server) in front of the real tritonserver, driven by the
official `openai` SDK: completions, chat completions, streaming (concatenated deltas == the non-streamed
text under greedy decoding), usage, stop strings, logprobs, seeds, structured output (json_schema) and
errors mapped to HTTP statuses.

The server runs as a subprocess (``python -m clients.openai_server``) on a free port, pointed at the
``triton_server`` fixture's gRPC port, exactly as ``make openai`` runs it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import openai  # noqa: E402

from openai_helpers import client, openai_server, openai_url, sdk_client, tokenizer  # noqa: E402,F401  (fixtures)
from tritonllm.serving.launcher import find_free_ports  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Once upon a time"





@pytest.fixture(scope="module")
def greedy(client):
    """A greedy completion of PROMPT, the reference the other tests compare against."""
    return client.completions.create(model="tritonllm", prompt=PROMPT, max_tokens=24, temperature=0)


def test_models_lists_the_served_name_and_the_triton_models(client):
    ids = {m.id for m in client.models.list().data}
    assert {"tritonllm", "tensorrt_llm_bls", "ensemble"} <= ids


def test_completion_text_and_usage(greedy, tokenizer):
    choice = greedy.choices[0]
    assert choice.text.strip()
    # Engine counts: the prompt as the served tokenizer encodes it (with BOS); 24 tokens unless EOS came first.
    assert greedy.usage.prompt_tokens == len(tokenizer(PROMPT).input_ids)
    assert 0 < greedy.usage.completion_tokens <= 24
    assert greedy.usage.total_tokens == greedy.usage.prompt_tokens + greedy.usage.completion_tokens
    assert choice.finish_reason == ("length" if greedy.usage.completion_tokens == 24 else "stop")


def test_streamed_completion_equals_non_streamed(client, greedy):
    stream = client.completions.create(model="tritonllm", prompt=PROMPT, max_tokens=24, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    deltas, usage, finish = [], None, None
    for event in stream:
        if event.choices:
            deltas.append(event.choices[0].text)
            finish = event.choices[0].finish_reason or finish
        if event.usage:
            usage = event.usage
    assert len([d for d in deltas if d]) > 1, "expected several streamed deltas"
    assert "".join(deltas) == greedy.choices[0].text
    assert usage.model_dump() == greedy.usage.model_dump()
    assert finish == greedy.choices[0].finish_reason


def test_lora_module_is_a_model_name(toy_server):
    """`--lora-modules python=1` over the toy repository (the default model has no adapter trained for it): model
    "python" is the toy's adapter (lora_task_id 1), listed with its parent; its text equals the BLS asked directly
    with lora_task_id 1 and differs from the base model's."""
    from test_llm_pipeline import generate
    from toy_repository import TOY

    for url, _ in openai_server(toy_server, args=("--tokenizer-dir", str(TOY), "--lora-modules", "python=1")):
        client = sdk_client(url)
        listed = {m.id: m for m in client.models.list().data}
        assert listed["python"].model_dump().get("parent") == "tritonllm"
        r = client.completions.create(model="python", prompt=PROMPT, max_tokens=24, temperature=0)
        base = client.completions.create(model="tritonllm", prompt=PROMPT, max_tokens=24, temperature=0)
        direct = generate(toy_server, "tensorrt_llm_bls", text_input=PROMPT, max_tokens=24, lora_task_id=1)
        assert r.choices[0].text == direct["text_output"]
        assert r.choices[0].text != base.choices[0].text


def test_ensemble_is_addressable_and_agrees_with_the_bls(client, greedy):
    r = client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=24, temperature=0)
    assert r.choices[0].text == greedy.choices[0].text


def test_chat_completion_streamed_equals_non_streamed(client, tokenizer):
    messages = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "A short one, please."}]
    full = client.chat.completions.create(model="tritonllm", messages=messages, max_tokens=20, temperature=0)
    msg = full.choices[0].message
    assert msg.role == "assistant" and msg.content
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = tokenizer(rendered, add_special_tokens=False).input_ids
    assert full.usage.prompt_tokens in (len(expected), len(expected) + 1)  # + the BOS preprocessing may add
    events = list(client.chat.completions.create(model="tritonllm", messages=messages, max_tokens=20,
                                                 temperature=0, stream=True))
    assert events[0].choices[0].delta.role == "assistant"
    assert "".join(e.choices[0].delta.content or "" for e in events) == msg.content
    assert events[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_stop_string_cuts_the_text(client, greedy):
    text = greedy.choices[0].text
    # A stop string that starts at a word boundary (" word"), after the first word.
    i = text.index(" ", 2)
    stop = text[i:i + 4]
    assert stop.strip(), text
    r = client.completions.create(model="tritonllm", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == text[:text.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_logprobs_one_per_generated_token(client, greedy):
    r = client.completions.create(model="tritonllm", prompt=PROMPT, max_tokens=24, temperature=0, logprobs=1)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == greedy.choices[0].text
    assert len(lp.token_logprobs) == r.usage.completion_tokens
    assert all(x <= 0.0 for x in lp.token_logprobs)


@pytest.mark.parametrize("model", ["tritonllm", "tensorrt_llm_bls"])  # the direct path and the BLS
def test_logprobs_name_every_scored_token_past_a_stop_string(client, greedy, model):
    """Each log prob's token is the engine's (its id), also past the stop string's cut: re-tokenizing the cut
    text gave fewer tokens than log probs, and every token came back as ""."""
    text = greedy.choices[0].text
    i = text.index(" ", 2)
    stop = text[i:i + 4]
    kw = dict(model=model, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=1, stop=[stop])
    r = client.completions.create(**kw)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == text[:text.index(stop)] and r.choices[0].finish_reason == "stop"
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    joined = "".join(lp.tokens)
    assert all(lp.tokens) and joined.startswith(r.choices[0].text) and stop in joined, lp.tokens
    assert lp.text_offset == [len("".join(lp.tokens[:k])) for k in range(len(lp.tokens))]
    streamed = [t for e in client.completions.create(stream=True, **kw) for c in e.choices if c.logprobs
                for t in c.logprobs.tokens]
    assert streamed == lp.tokens


def test_seeded_sampling_is_reproducible(client):
    kwargs = dict(model="tritonllm", prompt=PROMPT, max_tokens=16, temperature=1.0, top_p=0.95, seed=1234)
    a, b = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert a.choices[0].text == b.choices[0].text


def test_structured_output_follows_the_json_schema(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    r = client.chat.completions.create(
        model="tritonllm", messages=[{"role": "user", "content": "Name?"}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content)["name"], str)


def test_errors_map_to_http_statuses(client):
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}}}
    with pytest.raises(openai.BadRequestError) as e:  # the engine answers INVALID_ARG: the schema does not compile
        client.chat.completions.create(model="tritonllm", messages=[{"role": "user", "content": "Name?"}],
                                       max_tokens=8, response_format=bad)
    assert "json_schema" in str(e.value)
    with pytest.raises(openai.BadRequestError):  # streaming too: the error comes before the first event
        client.chat.completions.create(model="tritonllm", messages=[{"role": "user", "content": "Name?"}],
                                       max_tokens=8, stream=True, response_format=bad)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as e:  # this server was started without a tool-call parser
        client.chat.completions.create(model="tritonllm", messages=[{"role": "user", "content": "Name?"}],
                                       max_tokens=4, tools=[{"type": "function", "function": {"name": "f"}}])
    assert "--tool-call-parser" in str(e.value)


API_KEY = "sk-test-7f3a9c"  # what the keyed server requires (given through TRITONLLM_API_KEY, not argv)


@pytest.fixture(scope="module")
def keyed_server(triton_server):
    yield from openai_server(triton_server, {"TRITONLLM_API_KEY": API_KEY})


def test_an_api_key_guards_every_v1_route_and_is_never_logged(keyed_server):
    url, log_path = keyed_server
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.completions.create(model="tritonllm", prompt=PROMPT, max_tokens=2)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key", e.value
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=b"{}", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:  # no Authorization header (the SDK always sends one)
        urllib.request.urlopen(req, timeout=10)
    body = json.loads(e.value.read())
    assert e.value.code == 401 and body["error"]["code"] == "invalid_api_key" and API_KEY not in json.dumps(body)
    good = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    out = good.completions.create(model="tritonllm", prompt=PROMPT, max_tokens=4, temperature=0)
    assert out.usage.completion_tokens == 4
    assert [m.id for m in good.models.list().data][0] == "tritonllm"
    with urllib.request.urlopen(f"{url}/health", timeout=10) as r:  # probes need no key
        assert r.status == 200
    log = log_path.read_text()
    assert "API key required" in log and API_KEY not in log


def test_health_generate_runs_one_token_through_triton(openai_url, keyed_server):
    for url in (openai_url, keyed_server[0]):
        with urllib.request.urlopen(f"{url}/health_generate", timeout=60) as r:
            body = json.loads(r.read())
        assert r.status == 200 and body["status"] == "ok" and body["completion_tokens"] == 1, body


def test_health_generate_is_503_with_the_reason_when_triton_is_down(tmp_path):
    """Started before (or without) Triton: a warning at start, and /health and a request name the unreachable
    address (not "no ready model")."""
    port, dead = find_free_ports(2)  # nothing listens on `dead`
    log = tmp_path / "openai.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "clients.openai_server", "--host", "127.0.0.1", "--port",
                                 str(port), "--triton-url", f"127.0.0.1:{dead}", "--tokenizer-dir", "",
                                 "--log-level", "warning"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=40)
                pytest.fail("health_generate answered 200 with no Triton behind it")
            except urllib.error.HTTPError as e:
                body = json.loads(e.read())
                assert e.code == 503 and body["status"] == "error" and body["error"], body
                break
            except OSError:  # not listening yet
                assert proc.poll() is None and time.monotonic() < deadline, "OpenAI server did not start"
                time.sleep(0.3)
        assert f"warning: cannot reach Triton at 127.0.0.1:{dead}" in log.read_text()
        completion = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", method="POST",
                                            data=json.dumps({"model": "tritonllm", "prompt": "hi"}).encode(),
                                            headers={"Content-Type": "application/json"})
        for req in (f"http://127.0.0.1:{port}/health", completion):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=40)
            assert e.value.code == 503
            assert f"cannot reach Triton at 127.0.0.1:{dead}" in e.value.read().decode(), req
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_lora_adapter_loaded_and_unloaded_at_run_time(toy_server):
    """vLLM's /v1/load_lora_adapter with a folder under the toy's lora_root: the name is a model (listed with parent
    and root) whose text equals the fixed adapter's; errors in vLLM's words and codes; unloaded, the name is gone."""
    from types import SimpleNamespace

    from test_llm_pipeline import generate, http_post
    from toy_repository import TOY

    def post(path: str, body: dict):
        status, text = http_post(SimpleNamespace(http_url=url.removeprefix("http://")), path, body)
        return SimpleNamespace(status_code=status, text=text)

    for url, _ in openai_server(toy_server, args=("--tokenizer-dir", str(TOY), "--enable-lora-loading")):
        load = lambda **body: post("/v1/load_lora_adapter", body)  # noqa: E731
        r = load(lora_name="py", lora_path="python")
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'py' added successfully."
        client = sdk_client(url)
        listed = {m.id: m.model_dump() for m in client.models.list().data}
        assert listed["py"]["parent"] == "tritonllm" and listed["py"]["root"] == "python"
        text = client.completions.create(model="py", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
        direct = generate(toy_server, "tensorrt_llm_bls", text_input=PROMPT, max_tokens=24, lora_task_id=1)
        assert text == direct["text_output"]
        r = load(lora_name="py", lora_path="python")
        assert r.status_code == 400 and "The lora adapter 'py' has already been loaded." in r.text
        r = load(lora_name="evil", lora_path="../demo")
        assert r.status_code == 400 and "not a folder inside lora_root" in r.text
        assert load(lora_name="x").status_code == 400
        unload = lambda name: post("/v1/unload_lora_adapter", {"lora_name": name})  # noqa: E731
        assert unload("py").text == "Success: LoRA adapter 'py' removed successfully."
        r = unload("py")
        assert r.status_code == 404 and "The lora adapter 'py' cannot be found." in r.text
        assert "py" not in {m.id for m in client.models.list().data}
