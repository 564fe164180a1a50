"""The tensorrt_llm tensor contract parsing and response arrays (no server)."""
from pathlib import Path

import numpy as np
import pytest

from tritonllm import contract as C
from tritonllm.engine.request import InvalidRequest, RequestMetrics
from tritonllm.engine.config import engine_config_from_parameters
from tritonllm.llm_io import (OutputFlags, decode_word_list, parse_request,
                              response_arrays, stack_rows, wants_ensemble_names)


def _req(**kw):
    base = {"input_ids": np.array([[5, 6, 7, 0]], np.int32), "input_lengths": np.array([[3]], np.int32),
            "request_output_len": np.array([[4]], np.int32)}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def _one(**kw):
    batch = parse_request(_req(**kw), True)
    assert not batch.stop and len(batch.rows) == 1
    return batch.rows[0]


def test_parse_defaults_and_lengths():
    p = _one()
    assert p.prompt_ids == [5, 6, 7] and p.params.max_tokens == 4 and p.params.greedy
    assert p.exclude_input and not p.streaming and p.flags == OutputFlags()


def test_parse_sampling_fields():
    p = _one(temperature=np.array([[0.7]], np.float32), runtime_top_k=np.array([[40]], np.int32),
             runtime_top_p=np.array([[0.9]], np.float32), seed=np.array([[7]], np.uint64),
             streaming=np.array([[True]]), end_id=np.array([[2]], np.int32))
    assert p.params.top_k == 40 and abs(p.params.top_p - 0.9) < 1e-6 and p.params.seed == 7
    assert p.streaming and p.params.end_id == 2 and not p.params.greedy


def test_word_list_roundtrip_and_errors():
    arr = np.array([[[10, 11, 12, 13], [2, 3, -1, -1]]], np.int32)
    assert decode_word_list(arr, "stop_words_list") == [[10, 11], [12]]
    with pytest.raises(InvalidRequest, match="stop_words_list"):
        decode_word_list(np.array([[1, 2, 3]], np.int32), "stop_words_list")
    with pytest.raises(InvalidRequest, match="offsets"):
        decode_word_list(np.array([[10, 11], [3, -1]], np.int32), "stop_words_list")


@pytest.mark.parametrize("kw,needle", [
    ({"input_ids": None}, "input_ids is required"),
    ({"request_output_len": None}, "request_output_len is required"),
    ({"input_lengths": None}, "input_lengths is required"),
    ({"input_ids": np.array([[1.0, 2.0]], np.float32)}, "input_ids must be int32"),
    ({"beam_width": np.array([[4]], np.int32)}, "beam_width"),
    ({"input_lengths": np.array([[9]], np.int32)}, "input_lengths 9 does not fit input_ids of length 4$"),
    ({"temperature": np.array([[1.0, 2.0]], np.float32)}, "temperature must hold exactly one"),
    ({"runtime_top_p_decay": np.array([[0.5]], np.float32)}, "runtime_top_p_decay 0.5 is not supported"),
    ({"guided_decoding_guide": np.array([[1]], np.int32)}, "guided_decoding_guide must be BYTES"),
])
def test_parse_errors_name_the_input(kw, needle):
    with pytest.raises(InvalidRequest, match=needle):
        parse_request(_req(**kw), True)


def test_a_stop_request_ignores_every_other_input():
    """NVIDIA's client: input_ids of np.empty garbage, input_lengths 0, request_output_len 0."""
    stop = {"input_ids": np.empty([1, 1], np.int32), "input_lengths": np.zeros([1, 1], np.int32),
            "request_output_len": np.array([[0]], np.int32), "stop": np.array([[True]])}
    assert parse_request(stop, True).stop
    assert parse_request({"stop": np.array([[True]])}, True).stop
    assert not parse_request(_req(stop=np.array([[False]])), True).stop


def test_a_batch_is_one_row_per_item_and_errors_name_the_item():
    batch = parse_request(_req(input_ids=np.array([[5, 6, 7], [8, 9, 0]], np.int32),
                               input_lengths=np.array([[3], [2]], np.int32),
                               request_output_len=np.array([[4], [6]], np.int32),
                               streaming=np.array([[True], [False]])), True)
    assert [r.prompt_ids for r in batch.rows] == [[5, 6, 7], [8, 9]]
    assert [r.params.max_tokens for r in batch.rows] == [4, 6] and [r.streaming for r in batch.rows] == [True, False]
    with pytest.raises(InvalidRequest, match="request_output_len must have batch size 2"):
        parse_request(_req(input_ids=np.array([[5], [6]], np.int32), input_lengths=np.array([[1], [1]], np.int32)), True)
    with pytest.raises(InvalidRequest, match="^batch item 1: input_lengths 5"):
        parse_request(_req(input_ids=np.array([[5], [6]], np.int32), input_lengths=np.array([[1], [5]], np.int32),
                           request_output_len=np.array([[2], [2]], np.int32)), True)


def test_decoder_inputs_are_accepted_and_ignored():
    p = _one(decoder_input_ids=np.array([[3]], np.int32), decoder_input_lengths=np.array([[1]], np.int32))
    assert p.prompt_ids == [5, 6, 7]


def test_ensemble_names_marker():
    assert wants_ensemble_names({"ensemble_names": np.array([[True]])})
    assert not wants_ensemble_names({}) and not wants_ensemble_names({"ensemble_names": np.array([[False]])})


def test_outputs_appear_only_when_asked_for():
    a = response_arrays([1, 2, 3], [-0.1, -0.2, -0.3], -0.6, 5, OutputFlags())
    assert list(a)[:2] == ["output_ids", "sequence_length"]  # first: NVIDIA's benchmark reads outputs[0]
    assert a["output_ids"].shape == (1, 1, 3) and a["sequence_length"].tolist() == [[3]]
    assert set(a) == {"output_ids", "sequence_length", "request_key", "is_final", "finish_reason"}
    assert a["finish_reason"].tolist() == [[b""]]  # not a sequence's last response: no reason
    assert response_arrays([4], [], 0.0, 1, OutputFlags(), finish_reason="timeout")["finish_reason"].tolist() == [[b"timeout"]]
    flags = OutputFlags(log_probs=True, num_input_tokens=True, num_output_tokens=True, perf_metrics=True)
    m = RequestMetrics(arrival_ns=10, first_scheduled_ns=11, first_token_ns=12, last_token_ns=13,
                       kv_alloc_total_blocks=4, kv_alloc_new_blocks=3, kv_reused_blocks=2, draft_tokens=8,
                       accepted_draft_tokens=6)
    a = response_arrays([1, 2, 3], [-0.1, -0.2, -0.3], -0.6, 5, flags, m, batch_index=2)
    assert a["output_log_probs"].shape == (1, 1, 3) and a["cum_log_probs"].shape == (1, 1)
    assert a["num_input_tokens"].tolist() == [[5]] and a["num_output_tokens"].tolist() == [[3]]
    assert a["batch_index"].tolist() == [[2]]
    perf = {t.name: t for t in C.PERF_OUTPUTS}
    for name, t in perf.items():
        assert a[name].shape == (1, 1) and a[name].dtype == np.dtype(C.numpy_dtype(t.dtype)), name
    assert (a["kv_cache_alloc_total_blocks"][0, 0], a["kv_cache_alloc_new_blocks"][0, 0], a["kv_cache_reused_blocks"][0, 0]) == (4, 3, 2)
    assert a["arrival_time_ns"][0, 0] == 10 and a["last_token_time_ns"][0, 0] == 13
    assert a["acceptance_rate"][0, 0] == pytest.approx(0.75) and a["total_draft_tokens"][0, 0] == 8


def test_stacked_rows_pad_ragged_tokens_with_minus_one():
    flags = OutputFlags(log_probs=True)
    rows = [response_arrays([1, 2, 3], [-1.0] * 3, -3.0, 2, flags), response_arrays([4], [-2.0], -2.0, 2, flags)]
    out = stack_rows(rows)
    assert out["output_ids"].tolist() == [[[1, 2, 3]], [[4, -1, -1]]]
    assert out["sequence_length"].tolist() == [[3], [1]] and out["output_log_probs"].shape == (2, 1, 3)


def test_engine_config_from_parameters():
    cfg, exclude = engine_config_from_parameters({"tokens_per_block": "8", "max_tokens_in_paged_kv_cache": "1024",
                                                  "enable_chunked_context": "false", "exclude_input_in_output": "true",
                                                  "max_num_tokens": "${max_num_tokens}"})
    assert cfg.block_size == 8 and cfg.max_kv_tokens == 1024 and not cfg.enable_chunked_prefill
    assert exclude and cfg.max_num_tokens == 512
    with pytest.raises(ValueError, match="tokens_per_block"):
        engine_config_from_parameters({"tokens_per_block": "x"})


def test_speculative_modes_and_lora_inputs():
    for mode, want in (("prompt_lookup", 4), ("draft_model", 4), ("draft_tokens_external", 4), ("none", 0)):
        cfg, _ = engine_config_from_parameters({"speculative_decoding_mode": mode, "max_draft_len": "4"})
        assert cfg.max_draft_len == want, mode
    assert _one(lora_task_id=np.array([[3]], np.uint64)).params.lora_task_id == 3
    assert _one().params.lora_task_id is None
    with pytest.raises(InvalidRequest, match="lora_task_id must be uint64"):
        parse_request(_req(lora_task_id=np.array([[3]], np.int32)), True)
    src = _one(lora_weights=np.ones((1, 2, 4), np.float16), lora_config=np.ones((1, 2, 3), np.int32)).params.lora_source
    assert src.path is None and src.weights.shape == (2, 4) and src.config.shape == (2, 3)  # batch dim dropped
    assert _one(lora_path=np.array([[b"sql/v2"]], object)).params.lora_source.path == "sql/v2"
    assert _one().params.lora_source is None
    with pytest.raises(InvalidRequest, match="lora_weights must be float16"):
        parse_request(_req(lora_weights=np.ones((1, 2, 4), np.float32)), True)


def _non_default(t) -> np.ndarray:
    """A value of tensor ``t`` that differs from its default, shaped [batch 1, ...dims]."""
    if t.name.endswith("words_list"):
        return np.array([[[5], [1]]], np.int32)
    if t.name == "embedding_bias":
        return np.array([[0.0, 2.0]], np.float32)
    if t.name in ("lora_weights", "lora_config"):
        return np.ones((1, 1, 3), np.float16 if t.name == "lora_weights" else np.int32)
    if t.name == "exclude_input_in_output":  # default true here (the model's exclude_input_in_output)
        return np.array([[False]])
    if t.name == "guided_decoding_guide_type":
        return np.array([[b"json"]], object)
    if t.name == "guided_decoding_guide":
        return np.array([[b"{}"]], object)
    if t.name == "pooling":
        return np.array([[b"mean"]], object)
    if t.name == "lora_path":
        return np.array([[b"adapters/sql"]], object)
    value = {"TYPE_BOOL": True, "TYPE_FP32": 0.37, "TYPE_INT32": 3, "TYPE_UINT64": 3}[t.dtype]
    return np.full((1,) + tuple(max(d, 1) for d in t.dims), value, dtype=C.numpy_dtype(t.dtype))


def _fields(row) -> dict:
    import dataclasses

    out = {**dataclasses.asdict(row.flags), "streaming": row.streaming, "exclude_input": row.exclude_input,
           "num_sequences": row.num_sequences, "prompt": row.prompt_ids}
    for f in dataclasses.fields(row.params):
        v = getattr(row.params, f.name)
        out[f.name] = v.tolist() if hasattr(v, "tolist") else v
    return out


@pytest.mark.parametrize("tensor", [t for t in C.TENSORRT_LLM_INPUTS
                                    if t.name not in ("input_ids", "input_lengths", "request_output_len")],
                         ids=lambda t: t.name)
def test_no_declared_input_is_dropped_silently(tensor):
    """Each declared input, sent with a non-default value, changes the parsed request, is refused naming
    itself, or is listed with its reason in IGNORED_INPUTS (as NVIDIA's backend ignores it too)."""
    from tritonllm.llm_io import IGNORED_INPUTS

    base = _fields(_one())
    try:
        batch = parse_request(_req(**{tensor.name: _non_default(tensor)}), True)
    except InvalidRequest as e:
        assert tensor.name in str(e)
        return
    if batch.stop:
        assert tensor.name == "stop"
        return
    changed = _fields(batch.rows[0]) != base
    assert changed != (tensor.name in IGNORED_INPUTS), f"{tensor.name}: changed={changed}"


def test_engine_field_names_become_tensor_names_but_quoted_client_text_stays():
    from tritonllm.llm_io import in_tensor_names

    assert in_tensor_names("max_tokens must be >= 1, got 0") == "request_output_len must be >= 1, got 0"
    assert in_tensor_names("prompt_ids length 3 + max_tokens 9 exceeds max_seq_len 8") == \
        "input_ids length 3 + request_output_len 9 exceeds max_seq_len 8"
    schema_error = 'guided_decoding_guide does not compile as json_schema: unknown key "max_tokens" in guide'
    assert in_tensor_names(schema_error) == schema_error
    assert in_tensor_names("runtime_top_p must be in [0, 1]") == "runtime_top_p must be in [0, 1]"


def test_every_mode_that_drafts_from_a_model_resolves_the_draft_checkpoint():
    """One rule for Triton and Dynamo (engine.config): TensorRT-LLM's draft_tokens_external drafts from the
    draft_model_path checkpoint as draft_model does (Dynamo used to resolve it for draft_model only, so under
    Dynamo draft_tokens_external silently ran prompt lookup)."""
    resolve = lambda name, value: f"/resolved/{name}/{value}"  # noqa: E731
    for mode, want in (("draft_model", "/resolved/draft_model_path/small"),
                       ("draft_tokens_external", "/resolved/draft_model_path/small"),
                       ("prompt_lookup", None), ("none", None)):
        cfg, _ = engine_config_from_parameters({"speculative_decoding_mode": mode, "max_draft_len": "4",
                                                "draft_model_path": "small"}, resolve)
        assert cfg.draft_model_path == want, mode


def test_dynamo_resolves_the_draft_checkpoint_for_every_drafting_mode(tmp_path):
    import yaml

    from tritonllm.dynamo.settings import engine_settings

    dep = yaml.safe_load(open(Path(__file__).resolve().parents[2] / "deployment.yaml"))
    dep["models"]["tensorrt_llm"]["parameters"].update(speculative_decoding_mode="draft_tokens_external",
                                                       max_draft_len=3, draft_model_path="build/models/small")
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(dep))
    _, _, cfg = engine_settings(str(tmp_path / "d.yaml"), None)
    assert cfg.draft_model_path and cfg.draft_model_path.endswith("build/models/small") and cfg.max_draft_len == 3
