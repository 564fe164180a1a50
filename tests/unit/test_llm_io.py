"""The tensorrt_llm tensor contract parsing (no server)."""
import numpy as np
import pytest

from tritonllm.engine.request import InvalidRequest
from tritonllm.llm_io import decode_word_list, engine_config_from_parameters, parse_request, response_arrays


def _req(**kw):
    base = {"input_ids": np.array([[5, 6, 7, 0]], np.int32), "input_lengths": np.array([[3]], np.int32),
            "request_output_len": np.array([[4]], np.int32)}
    base.update(kw)
    return base


def test_parse_defaults_and_lengths():
    p = parse_request(_req(), default_exclude_input=True)
    assert p.prompt_ids == [5, 6, 7] and p.params.max_tokens == 4 and p.params.greedy
    assert p.exclude_input and not p.streaming and not p.stop


def test_parse_sampling_fields():
    p = parse_request(_req(temperature=np.array([[0.7]], np.float32), runtime_top_k=np.array([[40]], np.int32),
                           runtime_top_p=np.array([[0.9]], np.float32), seed=np.array([[7]], np.uint64),
                           streaming=np.array([[True]]), end_id=np.array([[2]], np.int32)), True)
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
    ({"input_ids": np.array([[1.0, 2.0]], np.float32)}, "input_ids must be int32"),
    ({"beam_width": np.array([[4]], np.int32)}, "beam_width"),
    ({"input_lengths": np.array([[9]], np.int32)}, "input_lengths"),
    ({"temperature": np.array([[1.0, 2.0]], np.float32)}, "temperature must hold exactly one"),
])
def test_parse_errors_name_the_input(kw, needle):
    req = {k: v for k, v in _req(**kw).items() if v is not None}
    with pytest.raises(InvalidRequest, match=needle):
        parse_request(req, True)


def test_stop_only_request():
    p = parse_request({"stop": np.array([[True]])}, True)
    assert p.stop


def test_response_shapes():
    a = response_arrays([1, 2, 3], [-0.1, -0.2, -0.3], -0.6, 5, 3)
    assert a["output_ids"].shape == (1, 1, 3) and a["sequence_length"].tolist() == [[3]]
    assert a["output_log_probs"].shape == (1, 1, 3) and a["num_input_tokens"].tolist() == [[5]]


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
    assert parse_request(_req(lora_task_id=np.array([[3]], np.uint64)), True).params.lora_task_id == 3
    assert parse_request(_req(), True).params.lora_task_id is None
    with pytest.raises(InvalidRequest, match="lora_task_id must be uint64"):
        parse_request(_req(lora_task_id=np.array([[3]], np.int32)), True)
    with pytest.raises(InvalidRequest, match="lora_weights: in-request LoRA weights are not supported"):
        parse_request(_req(lora_weights=np.ones((1, 2, 4), np.float16)), True)
