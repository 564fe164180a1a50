"""The LLM API runner against a RECORDING STAND-IN for tensorrt_llm (tests/unit/llmapi_standin.py; NOT
TensorRT-LLM, which cannot be installed here): exact LLM / KvCacheConfig / SamplingParams / generate_async
arguments, delta conversion, finish reasons, abort, queue bound, perf metrics, iteration stats, and that
every tensorrt_llm name used is in the names table and is a name NVIDIA's source has."""
from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

import llmapi_standin as S  # noqa: E402
from tritonllm.engine.request import InvalidRequest, QueueFull, SamplingParams  # noqa: E402
from tritonllm.llm_io import parse_request  # noqa: E402
from tritonllm.metrics import NVIDIA_GAUGES  # noqa: E402
from tritonllm.trtllm import names as N  # noqa: E402
from tritonllm.trtllm.llmapi_runner import LLMAPIRunner, sampling_kwargs  # noqa: E402
from tritonllm.trtllm.llmapi_settings import build_llmapi_backend, llm_args_from_parameters  # noqa: E402

LLM_ARGS = {"backend": "pytorch", "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "max_batch_size": 2,
            "max_num_tokens": 256, "max_seq_len": 64, "enable_chunked_prefill": True, "trust_remote_code": False,
            "enable_iter_perf_stats": True,
            "kv_cache_config": {"dtype": "fp8", "enable_block_reuse": True, "free_gpu_memory_fraction": 0.5}}
BASE_SP = {"exclude_input_from_output": True, "detokenize": False, "return_perf_metrics": True,
           "include_stop_str_in_output": True}


class Outputs:
    def __init__(self):
        self.items, self.cv = [], threading.Condition()

    def __call__(self, out):
        with self.cv:
            self.items.append(out)
            self.cv.notify_all()

    def final(self, rid, timeout=5.0):
        with self.cv:
            assert self.cv.wait_for(lambda: any(o.finished and o.request_id == rid for o in self.items), timeout)
        return [o for o in self.items if o.request_id == rid]


@pytest.fixture()
def rec(monkeypatch):
    return S.install(monkeypatch)


@pytest.fixture()
def runner(rec):
    outs = Outputs()
    r = LLMAPIRunner({**LLM_ARGS, "model": "/models/llama"}, outs, max_queue_size=1, stats_period=0.01).start()
    r.outs = outs
    yield r
    r.shutdown(timeout=2.0)


def test_llm_is_built_with_exactly_the_rendered_arguments(runner, rec):
    (kw,) = rec.llm_kwargs
    assert set(kw) == set(LLM_ARGS) | {"model"} and kw["model"] == "/models/llama"
    assert rec.kv_cache_kwargs == [LLM_ARGS["kv_cache_config"]]
    assert kw["kv_cache_config"].kwargs == LLM_ARGS["kv_cache_config"]  # a KvCacheConfig, not a dict
    assert {k: v for k, v in kw.items() if k not in ("model", "kv_cache_config")} == \
        {k: v for k, v in LLM_ARGS.items() if k != "kv_cache_config"}


def test_sampling_params_mapping_is_exact(rec):
    greedy, multi = sampling_kwargs(SamplingParams(max_tokens=5, temperature=0.0))
    assert greedy == {**BASE_SP, "max_tokens": 5, "top_k": 1} and multi == []
    full = SamplingParams(max_tokens=7, temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.1,
                          presence_penalty=0.5, frequency_penalty=0.25, min_tokens=2, seed=11, end_id=9,
                          stop_words=[[13], [4, 5]], bad_words=[[21], [22]], return_log_probs=True)
    kw, multi = sampling_kwargs(full)
    assert kw == {**BASE_SP, "max_tokens": 7, "temperature": 0.7, "top_k": 40, "top_p": 0.9,
                  "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.25, "min_tokens": 2,
                  "seed": 11, "end_id": 9, "stop_token_ids": [13], "bad_token_ids": [21, 22], "logprobs": 1}
    assert multi == [[4, 5]]
    never_eos, _ = sampling_kwargs(SamplingParams(max_tokens=3, top_p=0.5, end_id=-1))
    assert never_eos == {**BASE_SP, "max_tokens": 3, "temperature": 1.0, "top_p": 0.5, "ignore_eos": True}


def test_generate_async_gets_keywords_and_streams(runner, rec):
    rec.scripts.append([{"ids": [5], "done": True, "finish": "length"}])
    runner.submit_all([("0", [1, 3, 4], SamplingParams(max_tokens=1))])
    runner.outs.final("0")
    ((args, kwargs),) = rec.generate_calls
    assert args == ([1, 3, 4],)  # only the prompt positionally: streaming never lands in lora_request
    assert set(kwargs) == {"sampling_params", "lora_request", "streaming"}
    assert kwargs["streaming"] is True and kwargs["lora_request"] is None
    assert kwargs["sampling_params"].kwargs == {**BASE_SP, "max_tokens": 1, "top_k": 1}


def test_updates_become_deltas_and_the_end_token_is_not_output(runner, rec):
    rec.scripts.append([{"ids": [5, 6], "lps": [{5: S.SimpleNamespace(logprob=-0.5)}, {6: -0.25}]},
                        {"ids": []},
                        {"ids": [7, S.EOS], "lps": [-1.0, -0.1], "finish": "stop", "done": True}])
    runner.submit_all([("a", [1, 2, 3], SamplingParams(max_tokens=8, return_log_probs=True))])
    outs = runner.outs.final("a")
    assert [o.new_token_ids for o in outs] == [[5, 6], [7]]
    assert [o.new_logprobs for o in outs] == [[-0.5, -0.25], [-1.0]]
    assert [o.finished for o in outs] == [False, True] and outs[-1].finish_reason == "stop"
    assert outs[-1].num_output_tokens == 3 and outs[-1].num_prompt_tokens == 3
    assert outs[-1].cum_logprob == pytest.approx(-1.75)
    assert runner.stats.generation_tokens == 3 and runner.stats.prompt_tokens == 3


@pytest.mark.parametrize("trt_reason, ours", [("length", "length"), ("cancelled", "abort"), ("timeout", "abort"),
                                              ("stop", "stop")])
def test_finish_reasons(runner, rec, trt_reason, ours):
    rec.scripts.append([{"ids": [8], "finish": trt_reason, "stop_reason": 8 if trt_reason == "stop" else None,
                         "done": True}])
    runner.submit_all([("f", [1], SamplingParams(max_tokens=1))])
    (out,) = runner.outs.final("f")
    assert out.finish_reason == ours and out.new_token_ids == [8]  # a stop token (stop_reason set) stays


def test_multi_token_stop_word_cuts_the_delta_and_aborts(runner, rec):
    rec.scripts.append([{"ids": [4, 5, 6, 7]}, "hold"])
    runner.submit_all([("s", [1], SamplingParams(max_tokens=20, stop_words=[[5, 6]]))])
    outs = runner.outs.final("s")
    assert [o.new_token_ids for o in outs] == [[4, 5, 6]] and outs[0].finish_reason == "stop"
    assert rec.aborts == [1]
    assert "stop_token_ids" not in rec.sampling_kwargs[0]  # multi-token words are matched by the runner


def test_abort_frees_the_slot_and_answers_abort(runner, rec):
    rec.scripts += [[{"ids": [5]}, "hold"], ["hold"], [{"done": True, "finish": "length", "ids": [9]}]]
    runner.submit_all([("x", [1], SamplingParams(max_tokens=10)), ("y", [1], SamplingParams(max_tokens=10))])
    runner.abort("x")
    outs = runner.outs.final("x")
    assert outs[-1].finish_reason == "abort" and outs[-1].num_output_tokens == 1
    runner.abort("x")  # finished: a no-op
    runner.abort("nope")
    assert runner.num_unfinished() == 1
    runner.submit_all([("z", [1], SamplingParams(max_tokens=1))])  # the freed slot is usable again
    runner.outs.final("z")
    runner.abort("y")
    runner.outs.final("y")
    assert sorted(rec.aborts) == [1, 2] and runner.num_unfinished() == 0


def test_abort_answers_at_once_even_if_tensorrt_llm_never_replies(runner, rec):
    rec.scripts.append([{"ids": [5, 6]}, "silent"])
    runner.submit_all([("q", [1], SamplingParams(max_tokens=10))])
    with runner.outs.cv:
        assert runner.outs.cv.wait_for(lambda: runner.outs.items, 5.0)
    runner.abort("q")
    outs = runner.outs.final("q")
    assert outs[-1].finish_reason == "abort" and outs[-1].num_output_tokens == 2 and sum(o.finished for o in outs) == 1
    assert rec.aborts == [1] and runner.num_unfinished() == 0


def test_queue_full_has_engine_runners_message(runner, rec):
    rec.scripts += [["hold"]] * 3
    runner.submit_all([(str(i), [1], SamplingParams(max_tokens=4)) for i in range(3)])  # 2 running + 1 queued
    with pytest.raises(QueueFull) as e:
        runner.submit_all([("3", [1], SamplingParams(max_tokens=4))])
    assert str(e.value) == ("Maximum queue size of 1 has been reached, please try again later (Exceeds maximum "
                            "queue size: 3 requests in flight, 2 running at most)")
    with pytest.raises(InvalidRequest, match="already in flight"):
        runner.submit_all([("0", [1], SamplingParams(max_tokens=4))])
    for i in range(3):
        runner.abort(str(i))
        runner.outs.final(str(i))


def test_perf_metrics_map_to_request_metrics(runner, rec):
    rec.scripts.append([{"ids": [5], "done": True, "finish": "length", "perf": S.perf()}])
    runner.submit_all([("p", [1], SamplingParams(max_tokens=1))])
    m = runner.outs.final("p")[-1].metrics
    assert (m.arrival_ns, m.first_scheduled_ns, m.first_token_ns, m.last_token_ns) == \
        (1_000_000, 1_100_000, 1_500_000, 2_400_000)
    assert (m.kv_alloc_total_blocks, m.kv_alloc_new_blocks, m.kv_reused_blocks) == (3, 2, 1)
    assert (m.draft_tokens, m.accepted_draft_tokens, m.acceptance_rate) == (4, 3, 0.75)
    assert (runner.stats.draft_tokens, runner.stats.accepted_draft_tokens) == (4, 3)


def test_refusals_name_the_input(runner, rec):
    for params, name in ((SamplingParams(guide=("json", "")), "guide"),
                         (SamplingParams(lora_task_id=1), "lora_task_id"),
                         (SamplingParams(bad_words=[[3, 4]]), "bad_words"),
                         (SamplingParams(max_tokens=0), "max_tokens"),
                         (SamplingParams(max_tokens=60), "max_seq_len"),
                         (SamplingParams(top_p=1.5), "top_p"),
                         (SamplingParams(top_logprobs=2), "top_logprobs"),
                         (SamplingParams(allotted_time_ms=100), "allotted_time_ms")):
        with pytest.raises(InvalidRequest, match=name):
            runner.submit_all([("r", [1] * 8, params)])
    base = {"input_ids": np.array([[1, 2]], np.int32), "input_lengths": np.array([[2]], np.int32),
            "request_output_len": np.array([[4]], np.int32)}
    with pytest.raises(InvalidRequest, match="beam_width"):  # refused before any backend (shared llm_io)
        parse_request({**base, "beam_width": np.array([[2]], np.int32)}, True)
    with pytest.raises(InvalidRequest, match="num_return_sequences"):
        parse_request({**base, "num_return_sequences": np.array([[17]], np.int32)}, True)
    assert rec.generate_calls == [] and runner.num_unfinished() == 0


def test_a_request_tensorrt_llm_refuses_fails_the_batch_at_once(runner, rec):
    rec.refuse_prompt.add(99)
    rec.scripts += [["hold"], ["hold"]]
    with pytest.raises(InvalidRequest, match="refused by TensorRT-LLM: The sum of prompt length"):
        runner.submit_all([("ok", [1], SamplingParams(max_tokens=4)), ("bad", [99], SamplingParams(max_tokens=4))])
    assert runner.outs.final("ok")[-1].finish_reason == "abort" and rec.aborts == [1]
    assert runner.num_unfinished() == 0


def test_generation_error_answers_one_error_final(runner, rec):
    rec.scripts.append([{"ids": [5]}, RuntimeError("CUDA error")])
    runner.submit_all([("e", [1], SamplingParams(max_tokens=4))])
    outs = runner.outs.final("e")
    assert outs[-1].error == "TensorRT-LLM generation failed: CUDA error" and outs[-1].finish_reason == "error"
    assert sum(o.finished for o in outs) == 1


def test_iteration_stats_load_and_counters(runner, rec):
    entry = {"timestamp": "01-02-2026 10:11:12.000123", "iter": 7, "iterLatencyMS": 250.0, "numActiveRequests": 3,
             "numQueuedRequests": 1, "maxNumActiveRequests": 2, "gpuMemUsage": 10, "cpuMemUsage": 20,
             "pinnedMemUsage": 30, "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 75, "usedNumBlocks": 25,
                                                    "tokensPerBlock": 32, "reusedBlocks": 4},
             "inflightBatchingStats": {"numScheduledRequests": 2, "numContextRequests": 1, "numGenRequests": 1,
                                       "numPausedRequests": 1, "numCtxTokens": 9, "microBatchId": 0}}
    assert runner.iteration_stats() is None  # nothing polled before a request (TensorRT-LLM would only warn)
    rec.stats += [[], ['{"iter": 6, "iterLatencyMS": 250.0}', entry]]  # older versions return JSON strings
    rec.scripts.append([{"ids": [5], "done": True, "finish": "length", "perf": S.perf(reused=1)}])
    runner.submit_all([("i", [1] * 40, SamplingParams(max_tokens=1))])
    runner.outs.final("i")
    deadline = time.monotonic() + 5
    while runner.stats.iterations < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = runner.iteration_stats()
    assert set(stats) == {key for _, _, _, values in NVIDIA_GAUGES.values() for _, key in values}
    assert stats["Active Request Count"] == 3 and stats["Waiting Requests"] == 1
    assert stats["Fraction used KV cache blocks"] == 0.25 and stats["Iteration Counter"] == 7
    assert stats["Timestamp"] == entry["timestamp"] and stats["Paused Requests"] == 1
    assert runner.iteration_stats() is None  # once per new iteration
    assert runner.load() == (3, 1, 0.25)
    assert runner.stats.busy_seconds == pytest.approx(0.5) and runner.stats.preemptions == 1


def test_shutdown_answers_every_request_and_shuts_the_llm_down(rec):
    outs = Outputs()
    r = LLMAPIRunner({**LLM_ARGS, "model": "m"}, outs, stats_period=0.01).start()
    rec.scripts += [["hold"], ["hold"]]
    r.submit_all([("1", [1], SamplingParams(max_tokens=4)), ("2", [1], SamplingParams(max_tokens=4))])
    r.shutdown(timeout=0.1)
    assert sorted(o.request_id for o in outs.items if o.finished) == ["1", "2"] and rec.shutdowns == 1
    with pytest.raises(QueueFull, match="shutting down"):
        r.submit_all([("3", [1], SamplingParams(max_tokens=4))])


def test_settings_parameters(tmp_path):
    ckpt = tmp_path / "repo" / "build" / "ckpt"
    model_dir = tmp_path / "repo" / "model_repository" / "tensorrt_llm"
    ckpt.mkdir(parents=True)
    model_dir.mkdir(parents=True)
    args = {"model_repository": str(model_dir), "model_config": "{}"}
    params = {"llm_args": '{"backend": "pytorch", "kv_cache_config": {"dtype": "fp8"}}',
              "gpt_model_path": "../../build/ckpt", "max_queue_size": "3", "exclude_input_in_output": "false"}
    r = build_llmapi_backend(args, params, print)
    assert r.llm_args == {"backend": "pytorch", "kv_cache_config": {"dtype": "fp8"}, "model": str(ckpt)}
    assert r.capacity == 2048 + 3 and r.default_exclude_input is False
    hub = build_llmapi_backend(args, {**params, "hf_model_id": "nvidia/Llama-3.1-8B-Instruct-FP8"}, print)
    assert hub.llm_args["model"] == "nvidia/Llama-3.1-8B-Instruct-FP8"
    for bad, msg in (('{"quant_config": {}}', "quant_config"), ('{"kv_cache_config": {"fp8": 1}}', "fp8"),
                     ('{"model": "x"}', "gpt_model_path"), ("[1]", "JSON object")):
        with pytest.raises(ValueError, match=msg):
            llm_args_from_parameters({"llm_args": bad})


# ---------------------------------------------------------------------------------------------- names
STANDIN = {"LLM": S.LLM_ARGS | S.LLM_ARGS_READ_HERE, "KvCacheConfig": S.KV_CACHE_CONFIG,
           "SamplingParams": S.SAMPLING_PARAMS, "generate_async": set(S.GENERATE_ASYNC),
           "CompletionOutput": S.COMPLETION_OUTPUT, "RequestOutput": S.REQUEST_OUTPUT,
           "finish_reason": S.FINISH_REASONS, "RequestPerfMetrics": S.PERF_METRICS,
           "LLM method": S.LLM_METHODS | S.LLM_METHODS_READ_HERE}


def test_names_table_holds_only_names_from_nvidias_source():
    for kind, accepted in STANDIN.items():
        assert N.fields(kind) <= accepted, (kind, N.fields(kind) - accepted)
    assert N.fields("import tensorrt_llm") == {"LLM", "SamplingParams"}  # contract 3.8
    assert N.fields("import tensorrt_llm.llmapi") == {"KvCacheConfig"}
    assert all("@" in N.source(kind) and "NVIDIA/TensorRT-LLM" in N.source(kind) for kind in N.TABLE)


def test_every_attribute_read_is_a_listed_name(runner, rec):
    rec.scripts.append([{"ids": [5], "lps": [-0.1]}, {"ids": [6], "done": True, "finish": "length",
                                                       "perf": S.perf()}])
    runner.submit_all([("n", [1], SamplingParams(max_tokens=2, return_log_probs=True))])
    runner.outs.final("n")
    for kind, read in rec.attr_reads.items():
        assert read and read <= N.fields(kind) <= STANDIN[kind], (kind, read)


def test_the_runner_uses_no_tensorrt_llm_name_outside_the_table():
    """No module imports tensorrt_llm (it is reached only through names.module) and every SamplingParams
    kwarg the runner can emit is in the table (a name outside it raises names.UnknownName)."""
    for path in (ROOT / "backends/tritonllm/trtllm").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(m.startswith("tensorrt_llm") for m in mods), path
    with pytest.raises(N.UnknownName):
        N.kwargs("SamplingParams", {"n": 2})
    with pytest.raises(N.UnknownName):
        N.attr(object(), "CompletionOutput", "text")


