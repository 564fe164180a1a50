"""Tiny random HF checkpoints and a driver that runs the engine to completion (shared by engine tests)."""
from __future__ import annotations

import random

import torch

TINY = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
            intermediate_size=80, vocab_size=211, max_position_embeddings=512, rms_norm_eps=1e-6)


def make_checkpoint(path, arch: str = "llama", seed: int = 0, **overrides) -> str:
    import transformers as tf

    cfg_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "llama3": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM),
        "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM),
    }[arch]
    kw = dict(TINY)
    if arch == "llama3":
        kw["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        kw["rope_theta"] = 500000.0
    if arch == "qwen3":
        kw["head_dim"] = 16
    if arch == "qwen2":
        kw["tie_word_embeddings"] = True
    if arch == "phi3":  # Phi3Config's defaults are Phi-3-mini's ids (pad 32000): outside the tiny vocabulary
        kw.update(pad_token_id=0, bos_token_id=1)
    if arch == "gemma":  # GemmaConfig's default head_dim is 256
        kw.update(head_dim=16, pad_token_id=0, bos_token_id=1)
    kw.update(overrides)
    torch.manual_seed(seed)
    cfg = cfg_cls(**kw)
    cfg.eos_token_id = 2
    model = model_cls(cfg).eval()
    with torch.no_grad():  # larger weights than the 0.02 init: peaked logits, no argmax near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)
            elif arch == "gemma":  # its norm weights are offsets from 1 (zeros at init): make them matter
                p.normal_(0, 0.3)
    model.save_pretrained(str(path), safe_serialization=True)
    return str(path)


def hf_greedy(path: str, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos, pad_token_id=0, min_new_tokens=0 if eos is not None else n)
    return out[0, len(prompt):].tolist()


def engine_greedy(path: str, prompt: list[int], n: int, **config) -> list[int]:
    """Greedy tokens of our engine on a checkpoint (float path unless ``cpu_kernels`` is given); asserts every
    KV block is back afterwards."""
    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.engine import LLMEngine
    from tritonllm.engine.request import SamplingParams

    eng = LLMEngine(path, EngineConfig(**{"max_kv_tokens": 256, "cpu_kernels": "torch", **config}))
    eng.add_request("r", prompt, SamplingParams(max_tokens=n, end_id=-1))
    out = []
    while eng.has_work():
        for o in eng.step():
            out += o.new_token_ids
    assert eng.pool.num_free == eng.pool.num_blocks
    return out


def random_prompts(count: int, vocab: int, lo: int, hi: int, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(count)]


def run_staggered(engine, prompts, params_of, arrive_every: int = 1, max_steps: int = 100000):
    """Adds one prompt every `arrive_every` steps; returns {request_id: output ids} and the outputs seen."""
    results: dict[str, list[int]] = {}
    finished: dict[str, str] = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_work():
        if pending and step % arrive_every == 0:
            i, p = pending.pop(0)
            engine.add_request(str(i), p, params_of(i))
            results[str(i)] = []
        for out in engine.step():
            results[out.request_id].extend(out.new_token_ids)
            if out.finished:
                finished[out.request_id] = out.finish_reason
        step += 1
        assert step < max_steps, "engine did not converge"
    return results, finished


def last_logits(engine, prompt: list[int]) -> torch.Tensor:
    """The fp32 logits the engine computes for the prompt's last position (its prefill forward)."""
    from tritonllm.engine.request import SamplingParams

    seen = []
    forward = engine.model.forward
    engine.model.forward = lambda *a, **kw: seen.append(forward(*a, **kw)) or seen[-1]
    try:
        engine.add_request("logits", prompt, SamplingParams(max_tokens=1, end_id=-1))
        while engine.has_work():
            engine.step()
    finally:
        engine.model.forward = forward
    return seen[0][0][-1]  # forward returns (logits, hidden states)


def byte_level_model(path):
    """A llama checkpoint in ``path`` over the byte-level test tokenizer, saved beside it (guided decoding needs the
    model's own tokenizer); returns the tokenizer."""
    from text_helpers import byte_level

    tok = byte_level()
    tok.save_pretrained(str(path))
    make_checkpoint(path, "llama", vocab_size=len(tok))
    return tok
