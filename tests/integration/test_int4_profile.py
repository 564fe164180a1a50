"""Profile ``int4`` on the real server: the ``tensorrt_llm`` slot over the test toy's AWQ variant
(build/models/toy-int4-awq, written by build_scripts/quantize.py in build_all.py --toy), next to the float one.

Proven here: the profile loads the quantized checkpoint (the served config names it); greedy ids from
``tensorrt_llm`` equal our engine's in this process on the same checkpoint with the same kernels; the
ensemble answers text through it; every KV block is back after the requests.
"""
from __future__ import annotations

from toy_repository import TOY_INT4
from robustness_helpers import ids_of, ids_tensors, served_parameters, stream_request, text_of, text_tensors, wait_idle

PROMPT_IDS = [1, 415, 1739, 302, 264, 727, 2872]


def test_the_int4_profile_serves_the_awq_checkpoint_as_our_engine_does(int4_server):
    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.engine import LLMEngine
    from tritonllm.engine.request import SamplingParams

    assert served_parameters(int4_server, "tensorrt_llm")["gpt_model_path"].endswith("build/models/toy-int4-awq")

    chunks, err = stream_request(int4_server.grpc_url, "tensorrt_llm", ids_tensors(PROMPT_IDS, 16, stream=True))
    assert err is None, err.message()
    served = ids_of(chunks)
    eng = LLMEngine(str(TOY_INT4), EngineConfig(max_kv_tokens=256))
    eng.add_request("r", PROMPT_IDS, SamplingParams(max_tokens=16, end_id=-1))
    local = []
    while eng.has_work():
        for o in eng.step():
            local += o.new_token_ids
    assert served == local and len(served) == 16

    chunks, err = stream_request(int4_server.grpc_url, "ensemble", text_tensors("Once upon a time", 16))
    assert err is None, err.message()
    assert text_of(chunks).strip()
    idle = wait_idle(int4_server.metrics_url)
    assert idle.get("llm_kv_cache_usage_ratio") == 0.0 and idle.get("llm_requests_running") == 0
