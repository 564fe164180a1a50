"""tritonllm.dynamo: Dynamo's request options -> our SamplingParams, KV events from the BlockPool, the
launcher's command lines (no Dynamo needed: it is imported only when a worker starts)."""
from __future__ import annotations

import pytest

from tritonllm.dynamo import launch
from tritonllm.dynamo.engine import dynamo_priority, fold64, parse_args, request_params
from tritonllm.engine.kv_cache import BlockPool, block_hash
from tritonllm.engine.kv_manager import KVCacheManager
from tritonllm.engine.request import InvalidRequest


def test_options_map_onto_the_engine_and_neutral_values_pass():
    p = request_params({"token_ids": [1], "sampling_options": {
        "temperature": 0.5, "top_p": 0.9, "top_k": -1, "seed": 7, "presence_penalty": 0.1,
        "frequency_penalty": 0.2, "repetition_penalty": 1.1, "n": 1, "best_of": None},
        "stop_conditions": {"max_tokens": 12, "min_tokens": 2, "ignore_eos": True, "stop_token_ids_hidden": [2, 9]},
        "output_options": {"logprobs": 0}})
    assert (p.temperature, p.top_p, p.top_k, p.seed, p.max_tokens, p.min_tokens) == (0.5, 0.9, 0, 7, 12, 2)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.1, 0.2, 1.1)
    assert p.end_id == -1 and p.stop_words == [[2], [9]] and p.return_log_probs
    assert not request_params({"token_ids": [1]}).return_log_probs
    assert request_params({"token_ids": [1], "output_options": {"logprobs": 5}}).top_logprobs == 5


@pytest.mark.parametrize("request_, name", [
    ({"sampling_options": {"use_beam_search": True}}, "use_beam_search"),
    ({"sampling_options": {"guided_decoding": {"structural_tag": "x"}}}, "structural_tag"),
    ({"sampling_options": {"guided_decoding": {"json": {}, "regex": "a"}}}, "one guided decoding field"),
    ({"sampling_options": {"min_p": 0.1}}, "min_p"),
    ({"stop_conditions": {"max_thinking_tokens": 5}}, "max_thinking_tokens"),
    ({"output_options": {"prompt_logprobs": 2}}, "prompt_logprobs"),
    ({"output_options": {"logprobs": 21}}, "top_logprobs"),  # the engine's bound
])
def test_options_the_engine_lacks_are_refused_by_name(request_, name):
    with pytest.raises(InvalidRequest, match=name):
        request_params({"token_ids": [1], **request_})


def test_block_hashes_fold_to_signed_64_bits():
    assert fold64(None) is None and fold64(5) == 5
    assert fold64((1 << 64) - 1) == -1 and fold64((7 << 64) | 3) == 3
    h = block_hash(None, [1, 2, 3])
    assert -(1 << 63) <= fold64(h) < (1 << 63)


def test_the_pool_reports_stored_blocks_with_their_tokens_and_parent_and_removes_reused_ones():
    events = []
    pool = BlockPool(2)
    KVCacheManager(pool, 2).subscribe(events.append)  # what the Dynamo worker subscribes
    a, b = pool.allocate(2)
    h1 = block_hash(None, [1, 2])
    h2 = block_hash(h1, [3, 4])
    pool.register(a, h1, None, [1, 2])
    pool.register(b, h2, h1, [3, 4])
    pool.register(b, h2, h1, [3, 4])  # already published: no second event
    assert events == [("stored", h1, None, (1, 2)), ("stored", h2, h1, (3, 4))]
    pool.release([a, b])
    pool.allocate(1)  # evicts the least recently freed cached block (the tail, released first)
    assert events[-1] == ("removed", h1) or events[-1] == ("removed", h2)
    assert len(events) == 3


def test_launch_commands_keep_everything_on_loopback():
    cmds = launch.commands(2, 8080, "kv", 1, None, None, "py")
    assert cmds[0] == ["py", "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", "8080",
                       "--router-mode", "kv", "--discovery-backend", "file"]
    assert cmds[1] == cmds[2] == ["py", "-m", "tritonllm.dynamo", "--discovery-backend", "file", "--num-threads", "1"]
    assert "--no-kv-events" in launch.commands(1, 1, "round-robin", 1, None, None, "py")[1]
    env = launch.child_env("/tmp/x", launch.broker_url(5, 6))
    assert env["DYN_ZMQ_BROKER_URL"] == "xsub=tcp://127.0.0.1:5 , xpub=tcp://127.0.0.1:6"
    assert all(env[k] == "127.0.0.1" for k in launch.LOOPBACK_ENV)
    with pytest.raises(ValueError):
        launch.commands(0, 1, "kv", 1, None, None, "py")


def test_launch_commands_with_prefill_workers_and_the_worker_roles():
    cmds = launch.commands(1, 8080, "kv", 1, None, None, "py", prefill_workers=2)
    assert [c[-1] for c in cmds[1:]] == ["decode", "prefill", "prefill"]
    assert all(c[-2] == "--disaggregation-mode" for c in cmds[1:])
    env = launch.child_env("/tmp/x", launch.broker_url(5, 6))
    assert env["UCX_NET_DEVICES"] == "lo" and "tcp" in env["UCX_TLS"]  # NIXL's UCX stays on loopback
    with pytest.raises(ValueError):
        launch.commands(1, 1, "kv", 1, None, None, "py", prefill_workers=-1)
    args = parse_args(["--disaggregation-mode", "prefill"])
    assert args.disaggregation_mode == "prefill" and args.component is None  # from_args picks "prefill"
    with pytest.raises(SystemExit):
        parse_args(["--disaggregation-mode", "encode"])  # not a role this engine takes


def test_n_and_guided_decoding_map_as_triton_serves_them():
    from tritonllm.dynamo.engine import request_params, sequence_count

    assert sequence_count({"sampling_options": {"n": 3}}) == 3 and sequence_count({}) == 1
    with pytest.raises(InvalidRequest, match=r"n must be an integer in \[1, 16\]"):
        sequence_count({"sampling_options": {"n": 17}})
    for guided, want in (({"json": {"type": "object"}}, ("json_schema", '{"type": "object"}')),
                         ({"regex": "[ab]+", "backend": "xgrammar"}, ("regex", "[ab]+")),
                         ({"choice": ["yes", "no."]}, ("regex", "yes|no\\.")),
                         ({"grammar": 'root ::= "a"'}, ("ebnf_grammar", 'root ::= "a"'))):
        assert request_params({"sampling_options": {"guided_decoding": guided}}).guide == want, guided


def test_dynamos_priority_keeps_its_order_on_tensorrt_llms_scale():
    values = [-2**31, -1000, -2, -1, 0, 1, 2, 1000, 2**31 - 1]
    mapped = [dynamo_priority(v) for v in values]
    assert mapped == sorted(mapped) and len(set(mapped)) == len(mapped) and all(0 < m < 1 for m in mapped)
    assert dynamo_priority(0) == 0.5  # Dynamo's default is TensorRT-LLM's
    assert request_params({"routing": {"priority": 3}}).priority == dynamo_priority(3)
    assert request_params({"routing": {}}).priority == 0.5
    for bad in (2**31, 1.5, "1", True):
        with pytest.raises(InvalidRequest, match="priority"):
            request_params({"routing": {"priority": bad}})
