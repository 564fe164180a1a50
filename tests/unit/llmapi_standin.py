"""A RECORDING STAND-IN for ``tensorrt_llm`` (which cannot be installed here): NOT TensorRT-LLM, never run
against it. ``install(monkeypatch)`` puts fake ``tensorrt_llm`` / ``tensorrt_llm.llmapi`` modules into
``sys.modules``; they record every ``LLM(...)``, ``KvCacheConfig(...)`` and ``SamplingParams(...)`` call, every
``generate_async`` call (positional and keyword arguments apart), ``abort`` and ``get_stats`` call and every
attribute read of a result, and yield scripted updates shaped like NVIDIA's ``RequestOutput`` /
``CompletionOutput`` with async iteration.

The accepted names are transcribed from NVIDIA's source as /work/scratch/issue15/llmapi_contract.md lists
them (sections 2, 3.8 and 7), plus the few read directly where noted, and deliberately NOT taken from
``tritonllm.trtllm.names``: the stand-in refuses an unknown kwarg as TensorRT-LLM does ("LLM got invalid
argument", llm.py@4c05a748; dataclass ``SamplingParams(kw_only=True)`` raises TypeError).
"""
from __future__ import annotations

import asyncio
import sys
import threading
import types
from datetime import timedelta
from types import SimpleNamespace

# llm_args.py@00043967 BaseLlmArgs / TorchLlmArgs as contract section 7 lists them (+ "mpi_session" alias).
LLM_ARGS = frozenset("""
model tokenizer tokenizer_mode skip_tokenizer_init trust_remote_code dtype revision
tensor_parallel_size pipeline_parallel_size context_parallel_size gpus_per_node enable_attention_dp
enable_lora lora_config kv_cache_config enable_chunked_prefill guided_decoding_backend peft_cache_config
scheduler_config speculative_config max_batch_size max_input_len max_seq_len max_beam_width max_num_tokens
mpi_session _mpi_session backend return_perf_metrics
cuda_graph_config disable_overlap_scheduler attn_backend moe_config
""".split())
# Read directly (not in the contract): TorchLlmArgs.enable_iter_perf_stats, llm_args.py@0004396 offset ~253k.
LLM_ARGS_READ_HERE = frozenset({"enable_iter_perf_stats"})
KV_CACHE_CONFIG = frozenset("""
enable_block_reuse max_tokens max_attention_window sink_token_length free_gpu_memory_fraction host_cache_size
disk_cache_size disk_cache_path cross_kv_cache_fraction secondary_offload_min_priority event_buffer_max_size
attention_dp_events_gather_period_ms kv_events_config enable_partial_reuse copy_on_partial_reuse use_uvm
max_gpu_total_bytes iteration_stats_interval dtype mamba_ssm_cache_dtype tokens_per_block
use_kv_cache_manager_v2 max_util_for_resume
""".split())
SAMPLING_PARAMS = frozenset("""
end_id pad_id max_tokens min_tokens bad bad_token_ids stop stop_token_ids include_stop_str_in_output
embedding_bias logits_processor apply_batched_logits_processor n best_of use_beam_search
top_k top_p top_p_min top_p_reset_ids top_p_decay seed temperature beam_search_diversity_rate
repetition_penalty presence_penalty frequency_penalty length_penalty early_stopping no_repeat_ngram_size
min_p beam_width_array logprobs prompt_logprobs return_context_logits return_generation_logits
exclude_input_from_output return_encoder_output return_perf_metrics additional_model_outputs
lookahead_config guided_decoding ignore_eos detokenize add_special_tokens truncate_prompt_tokens
skip_special_tokens spaces_between_special_tokens
""".split())
GENERATE_ASYNC = ("inputs", "sampling_params", "lora_request", "prompt_adapter_request", "streaming",
                  "kv_cache_retention_config", "disaggregated_params", "_postproc_params", "scheduling_params",
                  "cache_salt")
COMPLETION_OUTPUT = frozenset("""
index text token_ids cumulative_logprob logprobs prompt_logprobs finish_reason stop_reason generation_logits
additional_context_outputs additional_generation_outputs disaggregated_params request_perf_metrics
length text_diff token_ids_diff logprobs_diff
""".split())
REQUEST_OUTPUT = frozenset("request_id prompt_token_ids finished outputs abort aborted result aresult prompt".split())
FINISH_REASONS = frozenset({"stop", "length", "timeout", "cancelled"})
PERF_METRICS = frozenset({  # contract 3.8 (NVIDIA's llmapi model.py)
    "kv_cache_metrics.num_reused_blocks", "kv_cache_metrics.kv_cache_hit_rate",
    "kv_cache_metrics.num_new_allocated_blocks", "kv_cache_metrics.num_total_allocated_blocks",
    "kv_cache_metrics.num_missed_blocks", "timing_metrics.arrival_time", "timing_metrics.first_scheduled_time",
    "timing_metrics.first_token_time", "timing_metrics.last_token_time", "speculative_decoding.acceptance_rate",
    "speculative_decoding.total_accepted_draft_tokens", "speculative_decoding.total_draft_tokens"})
LLM_METHODS = frozenset({"generate_async", "shutdown"})  # contract 3.8
LLM_METHODS_READ_HERE = frozenset({"get_stats"})           # llm.py@4c05a748 get_stats(timeout=2)
EOS = 2  # what the stand-in's "tokenizer" fills in as end_id (SamplingParams._setup)


class Recorder:
    def __init__(self) -> None:
        self.llm_kwargs: list[dict] = []
        self.kv_cache_kwargs: list[dict] = []
        self.sampling_kwargs: list[dict] = []
        self.generate_calls: list[tuple[tuple, dict]] = []
        self.aborts: list[int] = []
        self.attr_reads: dict[str, set[str]] = {"CompletionOutput": set(), "RequestOutput": set()}
        self.scripts: list = []        # one per generate_async call, in order (see StandInResult)
        self.stats: list[list] = []     # what successive get_stats calls return
        self.refuse_prompt: set[int] = set()  # first prompt ids generate_async refuses with ValueError
        self.shutdowns = 0
        self.holding = threading.Event()  # set once a result waits at a "hold" step (a test's cue to stop it)


class _Recording:
    """Records which attributes are read (to check them against NVIDIA's field lists)."""

    _kind = ""

    def __getattribute__(self, name):
        if not name.startswith("_"):
            object.__getattribute__(self, "_rec").attr_reads[object.__getattribute__(self, "_kind")].add(name)
        return object.__getattribute__(self, name)


class StandInCompletion(_Recording):
    _kind = "CompletionOutput"

    def __init__(self, rec, step: dict) -> None:
        self._rec = rec
        self.token_ids_diff = step.get("ids", [])
        self.logprobs_diff = step.get("lps", [])
        self.finish_reason = step.get("finish")
        self.stop_reason = step.get("stop_reason")
        self.cumulative_logprob = step.get("cum")
        self.request_perf_metrics = step.get("perf")


class StandInResult(_Recording):
    """Stand-in for the RequestOutput generate_async returns. Script: a list of steps, each a dict
    (ids, lps, finish, stop_reason, cum, perf, done), "hold" (wait until aborted, then a cancelled final)
    or "silent" (never answer again)."""

    _kind = "RequestOutput"

    def __init__(self, rec, request_id: int, script: list) -> None:
        self._rec = rec
        self._id = request_id
        self._script = list(script)
        self._aborted_event = asyncio.Event()
        self._was_aborted = False
        self.outputs = []
        self.finished = False

    def abort(self) -> None:
        self._rec.aborts.append(self._id)
        self._was_aborted = True
        self._aborted_event.set()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.finished:
            raise StopAsyncIteration
        await asyncio.sleep(0)
        if self._script and self._script[0] == "silent":  # never answers, not even after abort()
            await asyncio.Event().wait()
        if self._was_aborted or (self._script and self._script[0] == "hold"):
            self._rec.holding.set()
            await self._aborted_event.wait()
            step = {"finish": "cancelled", "done": True}
        elif not self._script:
            raise StopAsyncIteration
        else:
            step = self._script.pop(0)
        if isinstance(step, BaseException):
            raise step
        self.outputs = [StandInCompletion(self._rec, step)]
        self.finished = bool(step.get("done"))
        return self


def perf(arrival_us=1000, first_token_us=1500, total=3, new=2, reused=1, drafts=4, accepted=3):
    """A RequestPerfMetrics-shaped object (times as timedelta, as the bindings give steady-clock points)."""
    return SimpleNamespace(
        timing_metrics=SimpleNamespace(arrival_time=timedelta(microseconds=arrival_us),
                                       first_scheduled_time=timedelta(microseconds=arrival_us + 100),
                                       first_token_time=timedelta(microseconds=first_token_us),
                                       last_token_time=timedelta(microseconds=first_token_us + 900)),
        kv_cache_metrics=SimpleNamespace(num_total_allocated_blocks=total, num_new_allocated_blocks=new,
                                         num_reused_blocks=reused, num_missed_blocks=new, kv_cache_hit_rate=0.5),
        speculative_decoding=SimpleNamespace(total_draft_tokens=drafts, total_accepted_draft_tokens=accepted,
                                             acceptance_rate=accepted / drafts))


def install(monkeypatch) -> Recorder:
    rec = Recorder()

    class SamplingParams:
        def __init__(self, **kwargs):
            unknown = set(kwargs) - SAMPLING_PARAMS
            if unknown:
                raise TypeError(f"SamplingParams.__init__() got an unexpected keyword argument {sorted(unknown)}")
            if kwargs.get("top_p") is not None and not 0 <= kwargs["top_p"] <= 1:
                raise ValueError(f"require 0 <= top_p <= 1, got top_p={kwargs['top_p']}")
            rec.sampling_kwargs.append(dict(kwargs))
            self.end_id = kwargs.get("end_id")
            self.kwargs = kwargs

    class KvCacheConfig:
        def __init__(self, **kwargs):
            unknown = set(kwargs) - KV_CACHE_CONFIG
            if unknown:
                raise ValueError(f"KvCacheConfig: extra fields not permitted {sorted(unknown)}")
            rec.kv_cache_kwargs.append(dict(kwargs))
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs):
            unknown = set(kwargs) - LLM_ARGS - LLM_ARGS_READ_HERE
            if unknown:
                raise ValueError(f"LLM got invalid argument: {sorted(unknown)[0]}")
            rec.llm_kwargs.append(dict(kwargs))
            self._next_id = 0

        def generate_async(self, *args, **kwargs):
            rec.generate_calls.append((args, kwargs))
            bound = dict(zip(GENERATE_ASYNC, args))
            unknown = set(kwargs) - set(GENERATE_ASYNC)
            if unknown or set(bound) & set(kwargs):
                raise TypeError(f"generate_async() got an unexpected keyword argument {sorted(unknown)}")
            bound.update(kwargs)
            asyncio.get_running_loop()  # GenerationResult picks an async queue only inside a running loop
            if bound["inputs"] and bound["inputs"][0] in rec.refuse_prompt:
                raise ValueError("The sum of prompt length (9) and query length (0) should not exceed max_num_tokens")
            sp = bound["sampling_params"]
            if sp.end_id is None:
                sp.end_id = EOS  # SamplingParams._setup(tokenizer): the tokenizer's eos_token_id
            self._next_id += 1
            return StandInResult(rec, self._next_id, rec.scripts.pop(0) if rec.scripts else [{"done": True}])

        def get_stats(self, timeout=2):
            return rec.stats.pop(0) if rec.stats else []

        def shutdown(self):
            rec.shutdowns += 1

    root = types.ModuleType("tensorrt_llm")
    root.__doc__ = "RECORDING STAND-IN for tensorrt_llm (tests only)"
    root.LLM, root.SamplingParams = LLM, SamplingParams
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.KvCacheConfig = KvCacheConfig
    root.llmapi = llmapi
    monkeypatch.setitem(sys.modules, "tensorrt_llm", root)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    return rec
