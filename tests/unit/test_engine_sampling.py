"""Sampling semantics inside one batch: seeds, stop / bad words, min_tokens, end_id, log-probs, aborts."""
import math

import pytest
import torch

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.request import InvalidRequest, SamplingParams

from engine_helpers import random_prompts, run_staggered


def _solo(small_engine, prompt, params):
    results, reasons = run_staggered(small_engine, [prompt], lambda i: params)
    return results["0"], reasons["0"]


def test_seeded_sampling_independent_of_batch(small_engine):
    prompts = random_prompts(5, small_engine.spec.vocab_size, 4, 20, seed=3)
    sampled = SamplingParams(max_tokens=10, temperature=0.9, top_k=50, top_p=0.95, seed=1234, end_id=-1)
    alone, _ = _solo(small_engine, prompts[0], sampled)

    def mixed(i):
        if i == 0:
            return sampled
        return SamplingParams(max_tokens=8 + i, temperature=1.3, top_k=0, top_p=0.8, seed=i, end_id=-1)

    results, _ = run_staggered(small_engine, prompts, mixed, arrive_every=1)
    assert results["0"] == alone
    other, _ = _solo(small_engine, prompts[0], SamplingParams(max_tokens=10, temperature=0.9, top_k=50,
                                                        top_p=0.95, seed=99, end_id=-1))
    assert other != alone  # a different seed takes another path (10 tokens from a flat-ish distribution)


def test_stop_word_ends_generation_and_stays_in_the_output(small_engine):
    prompt = [5, 6, 7, 8]
    full, _ = _solo(small_engine, prompt, SamplingParams(max_tokens=12, end_id=-1))
    word = full[3:5]
    out, reason = _solo(small_engine, prompt, SamplingParams(max_tokens=12, end_id=-1, stop_words=[word]))
    assert reason == "stop"
    first = next(i for i in range(len(full) - 1) if full[i:i + 2] == word)
    assert out == full[:first + 2]  # TensorRT-LLM semantics: the text layer cuts stop strings exactly


def test_end_id_and_min_tokens(small_engine):
    prompt = [9, 10, 11]
    full, _ = _solo(small_engine, prompt, SamplingParams(max_tokens=10, end_id=-1))
    eos = full[2]
    out, reason = _solo(small_engine, prompt, SamplingParams(max_tokens=10, end_id=eos))
    assert reason == "stop" and out == full[:full.index(eos)]
    out, _ = _solo(small_engine, prompt, SamplingParams(max_tokens=10, end_id=eos, min_tokens=6))
    assert len(out) >= 6 and eos not in out[:6]


def test_bad_words_are_never_generated(small_engine):
    prompt = [12, 13, 14]
    full, _ = _solo(small_engine, prompt, SamplingParams(max_tokens=8, end_id=-1))
    out, _ = _solo(small_engine, prompt, SamplingParams(max_tokens=8, end_id=-1, bad_words=[[full[0]], [full[1]]]))
    assert full[0] not in out and full[1] not in out


def test_penalties_change_output_and_logprobs_are_consistent(small_engine):
    prompt = [20, 21, 22, 20, 21, 22]
    base, _ = _solo(small_engine, prompt, SamplingParams(max_tokens=16, end_id=-1))
    pen, _ = _solo(small_engine, prompt, SamplingParams(max_tokens=16, end_id=-1, repetition_penalty=5.0,
                                                  presence_penalty=2.0, frequency_penalty=2.0))
    assert pen != base
    assert len(set(pen)) >= len(set(base))
    small_engine.add_request("lp", prompt, SamplingParams(max_tokens=5, end_id=-1, return_log_probs=True))
    outs = []
    while small_engine.has_work():
        outs += small_engine.step()
    lps = [lp for o in outs for lp in o.new_logprobs]
    assert len(lps) == 5 and all(lp <= 0 for lp in lps)
    assert math.isclose(outs[-1].cum_logprob, sum(lps), rel_tol=1e-5)


def test_abort_frees_blocks(small_engine):
    small_engine.add_request("x", list(range(3, 40)), SamplingParams(max_tokens=50, end_id=-1))
    small_engine.step()
    assert small_engine.num_free_blocks < small_engine.pool.num_blocks
    out = small_engine.abort("x")
    assert out.finished and out.finish_reason == "abort"
    assert not small_engine.has_work()


@pytest.mark.parametrize("prompt,params,needle,tensor", [
    ([], SamplingParams(), "prompt_ids is empty", "input_ids is empty"),
    ([1, 100000], SamplingParams(), "outside the vocabulary", "outside the vocabulary"),
    ([1, 2], SamplingParams(max_tokens=0), "max_tokens", "request_output_len"),
    ([1, 2], SamplingParams(max_tokens=10**6), "max_seq_len", "request_output_len 1000000 exceeds max_seq_len"),
    ([1, 2], SamplingParams(temperature=float("nan")), "temperature", "temperature"),
    ([1, 2], SamplingParams(temperature=-1.0), "temperature", "temperature"),
    ([1, 2], SamplingParams(top_p=1.5), "top_p", "runtime_top_p"),
    ([1, 2], SamplingParams(top_k=-2), "top_k", "runtime_top_k"),
    ([1, 2], SamplingParams(stop_words=[[]]), "stop_words", "stop_words_list"),
    ([1, 2], SamplingParams(bad_words=[[10**6]]), "bad_words", "bad_words_list"),
])
def test_invalid_requests_name_the_input(small_engine, prompt, params, needle, tensor):
    """The engine names its own fields; the tensor contract renames them to its inputs."""
    from tritonllm.llm_io import in_tensor_names

    with pytest.raises(InvalidRequest, match=needle) as e:
        small_engine.add_request("bad", prompt, params)
    assert tensor in in_tensor_names(str(e.value))
    assert not small_engine.has_work()


def test_kv_bytes_per_token(small_engine):
    s = small_engine.spec
    assert small_engine.kv_bytes_per_token == 2 * s.num_layers * s.num_kv_heads * s.head_dim * 4
    assert small_engine.kv.k[0].dtype == torch.float32


def test_runner_queue_bound_and_shutdown(llama_ckpt):
    import threading

    from tritonllm.engine.request import QueueFull
    from tritonllm.engine.runner import EngineRunner

    eng = LLMEngine(llama_ckpt, EngineConfig(block_size=4, max_kv_tokens=2048, max_num_seqs=2, max_queue_size=2))
    initial = eng.num_free_blocks
    done = threading.Event()
    finals = {}

    def on_output(out):
        if out.finished:
            finals[out.request_id] = out.finish_reason
            if len(finals) == 4:
                done.set()

    before = threading.active_count()
    runner = EngineRunner(eng, on_output)  # not started: submissions pile up, the bound is exact
    for i in range(4):
        runner.submit(str(i), [3, 4, 5], SamplingParams(max_tokens=30, end_id=-1))
    with pytest.raises(QueueFull):
        runner.submit("over", [3, 4, 5], SamplingParams(max_tokens=3))
    with pytest.raises(InvalidRequest):
        runner.submit("bad", [3, 10**6], SamplingParams(max_tokens=3))
    runner.start()
    assert done.wait(60)
    assert set(finals.values()) == {"length"}
    runner.shutdown()
    assert threading.active_count() == before
    assert eng.num_free_blocks == initial


def test_a_full_queue_says_nvidias_words_and_admits_a_batch_whole_or_not_at_all(tmp_path):
    """TensorRT-LLM's executor text and Triton's (NVIDIA's test_max_queue_size.py looks for either)."""
    from engine_helpers import make_checkpoint
    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.engine import LLMEngine
    from tritonllm.engine.request import QueueFull, SamplingParams
    from tritonllm.engine.runner import EngineRunner

    engine = LLMEngine(make_checkpoint(tmp_path / "m"), EngineConfig(max_num_seqs=1, max_queue_size=1, max_kv_tokens=512))
    runner = EngineRunner(engine, lambda out: None)  # not started: nothing leaves the queue
    runner.submit("a", [5, 6], SamplingParams(max_tokens=2))
    with pytest.raises(QueueFull) as e:
        runner.submit_all([("b", [5], SamplingParams(max_tokens=2)), ("c", [5], SamplingParams(max_tokens=2))])
    assert "Maximum queue size of 1 has been reached" in str(e.value) and "Exceeds maximum queue size" in str(e.value)
    assert runner.num_unfinished() == 1  # the batch was refused as a whole
    runner.submit("b", [5], SamplingParams(max_tokens=2))
    assert runner.num_unfinished() == 2
