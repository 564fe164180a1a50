"""README "Your own checkpoint", as a newcomer does it: a Llama folder of one's own (random weights, made here, with
the default model's tokenizer saved beside them), deployment.yaml with only its two path lines changed, the configs
rendered by the script `make build` runs, and tritonserver over that repository: every model ready, and the
ensemble answers what our engine, run in this process on the same folder, answers."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import _serve
from test_llm_pipeline import generate

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "The capital of France is"
N = 12


def _own_checkpoint(folder: Path) -> Path:
    """A 2-layer Llama with random weights and SmolLM2's tokenizer (49,152 tokens, its chat template)."""
    import transformers as tf

    from tritonllm.model_files import load_hf_tokenizer

    deployment = (ROOT / "deployment.yaml").read_text()
    default = re.search(r"^  tokenizer_dir: (\S+)", deployment, re.M).group(1)
    tok = load_hf_tokenizer(ROOT / default)
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=2048,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # peaked logits: no greedy near-ties between this process and the server
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def own(built_repository, tmp_path_factory):
    """(the checkpoint folder, the repository root rendered for it), the deployment edited as the README says."""
    checkpoint = _own_checkpoint(tmp_path_factory.mktemp("my-llama"))
    root = tmp_path_factory.mktemp("own-repo")
    for folder in ("model_repository", "ensembles"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    text, changed = re.subn(r"^(  (?:gpt_model_path|tokenizer_dir): )\S+", lambda m: f"{m.group(1)}{checkpoint}",
                            (ROOT / "deployment.yaml").read_text(), flags=re.M)
    assert changed == 2, "deployment.yaml must hold llm.gpt_model_path and llm.tokenizer_dir lines"
    (root / "deployment.yaml").write_text(text)
    render = subprocess.run([sys.executable, str(ROOT / "build_scripts" / "render_configs.py"), "--deployment",
                             str(root / "deployment.yaml"), "--repo", str(root)],
                            capture_output=True, text=True, timeout=300)
    assert render.returncode == 0, render.stdout + render.stderr
    yield checkpoint, root


@pytest.fixture(scope="module")
def own_server(own):
    server = _serve("own-checkpoint", root=own[1])
    try:
        yield server
    finally:
        server.kill()


def _engine_text(checkpoint: Path) -> str:
    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.engine import LLMEngine
    from tritonllm.engine.request import SamplingParams
    from tritonllm.model_files import load_hf_tokenizer

    tok = load_hf_tokenizer(checkpoint)
    engine = LLMEngine(str(checkpoint), EngineConfig(max_kv_tokens=512))
    engine.add_request("own", tok(PROMPT).input_ids, SamplingParams(max_tokens=N, end_id=-1))
    ids = []
    while engine.has_work():
        for out in engine.step():
            ids.extend(out.new_token_ids)
    assert len(ids) == N
    return tok.decode(ids, skip_special_tokens=True)


def test_only_the_two_paths_changed_serves_the_checkpoint(own, own_server):
    checkpoint, root = own
    config = (root / "model_repository" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert str(checkpoint) in config and 'key: "lora_adapters"' in config
    answer = generate(own_server, "ensemble", text_input=PROMPT, max_tokens=N, end_id=-1)
    expected = _engine_text(checkpoint)
    assert expected.strip() and answer["text_output"] == expected, (answer, expected)


def test_make_perf_on_the_own_checkpoint(own, own_server, tmp_path):
    """`make perf`'s script against a server of the user's HF folder, the tokenizer read from that folder (no GGUF
    involved): every model row measured. (genai-perf reads the same folder; test_perf_llm runs it.)"""
    from test_perf_llm import check_summary

    checkpoint, _ = own
    max_tokens, requests = 6, 3
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "perf_llm.py"), "--url", own_server.grpc_url,
                           "--tokenizer-dir", str(checkpoint), "--concurrency", "1", "--requests", str(requests),
                           "--rounds", "1", "--max-tokens", str(max_tokens), "--prompt-tokens", "16",
                           "--genai-perf", "skip", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_summary(tmp_path, max_tokens, requests, genai=False)
