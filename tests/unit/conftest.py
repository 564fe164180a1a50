"""Fixtures shared by the engine's unit tests: a tiny random Llama checkpoint and an engine over it that
must give every KV block back (a leak fails the test)."""
import pytest

from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine

from engine_helpers import make_checkpoint


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture()
def small_engine(llama_ckpt):
    eng = LLMEngine(llama_ckpt, EngineConfig(block_size=4, max_kv_tokens=2048, max_num_tokens=64))
    initial = eng.num_free_blocks
    yield eng
    assert eng.num_free_blocks == initial, "KV blocks leaked"
