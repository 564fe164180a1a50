"""One short device run for the CUDA path of our engine (issue #6 item 5). Not run in CI (no GPU).

1. parity: greedy tokens of our engine on CUDA (fp32) equal HF transformers on CUDA, tiny random Llama;
2. throughput: an 8B-shape random Llama (hidden 4096, 32 layers, 32/8 heads, intermediate 14336, vocab
   128256) in bf16, 64 requests of ISL 128 / OSL 128, output tokens/s (weights made on the GPU: nothing
   16 GB is written to disk);
3. the same with FP8 weights through `torch._scaled_mm` (fp8_matmul auto: scaled on SM >= 8.9), plus the
   scaled matmul's error against bf16 on one 4096 x 14336 layer.
4. the GPU profiles on this GPU, without TensorRT-LLM: which of ``trtllm``'s quantized formats this
   architecture builds (build_trtllm_engine's gates), whether ``llmapi``'s FP8 KV cache fits it, both
   profiles render; and where ``tensorrt_llm`` *is* installed, that every name of
   ``tritonllm/trtllm/names.py`` exists in it (LLM arguments, KvCacheConfig and SamplingParams fields).
Prints one JSON line and writes it to $OUT/gpu_check.json when OUT is set.

    python benchmarks/gpu_check.py [--skip-8b] [--batch 64]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "backends"), os.path.join(ROOT, "tests", "unit")]

SHAPE_8B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5,
                rope_theta=500000.0, tie_word_embeddings=False)


def parity(device: str) -> dict:
    import torch
    import transformers as tf
    from engine_helpers import make_checkpoint, random_prompts, run_staggered
    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.engine import LLMEngine
    from tritonllm.engine.request import SamplingParams

    path = make_checkpoint(tempfile.mkdtemp(), "llama")
    engine = LLMEngine(path, EngineConfig(block_size=16, max_kv_tokens=4096, device=device, dtype="float32"))
    prompts = random_prompts(8, 211, 4, 40)
    ours, _ = run_staggered(engine, prompts, lambda i: SamplingParams(max_tokens=16, end_id=-1))
    hf = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    same = 0
    for i, p in enumerate(prompts):
        ids = torch.tensor([p], device=device)
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, min_new_tokens=16,
                          do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        same += out == ours[str(i)]
    return {"parity_prompts_equal": same, "parity_prompts": len(prompts)}


def throughput_8b(device: str, batch: int, isl: int = 128, osl: int = 128, fp8: bool = False) -> dict:
    import torch
    from transformers import LlamaConfig
    from tritonllm.engine.config import EngineConfig
    from tritonllm.engine.engine import LLMEngine
    from tritonllm.engine.hf_config import load_spec
    from tritonllm.engine.model import Transformer
    from tritonllm.engine.request import SamplingParams

    d = tempfile.mkdtemp()
    cfg = LlamaConfig(**SHAPE_8B)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(d)
    spec = load_spec(d)
    H, I, L = spec.hidden_size, spec.intermediate_size, spec.num_layers
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=g) * 0.02)

    w = {"model.embed_tokens.weight": rnd(spec.vocab_size, H), "lm_head.weight": rnd(spec.vocab_size, H),
         "model.norm.weight": torch.ones(H, device=device, dtype=torch.bfloat16)}
    for i in range(L):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": torch.ones(H, device=device, dtype=torch.bfloat16),
                  p + "post_attention_layernorm.weight": torch.ones(H, device=device, dtype=torch.bfloat16),
                  p + "self_attn.q_proj.weight": rnd(q, H), p + "self_attn.k_proj.weight": rnd(kv, H),
                  p + "self_attn.v_proj.weight": rnd(kv, H), p + "self_attn.o_proj.weight": rnd(H, q),
                  p + "mlp.gate_proj.weight": rnd(I, H), p + "mlp.up_proj.weight": rnd(I, H),
                  p + "mlp.down_proj.weight": rnd(H, I)})
    model = Transformer(spec, w, torch.device(device), torch.bfloat16, fp8_weights=fp8)
    del w
    engine = LLMEngine(d, EngineConfig(max_kv_tokens=batch * (isl + osl) + 256, max_num_tokens=8192,
                                       max_num_seqs=batch, device=device, dtype="bfloat16"), model=model)
    rng = random.Random(0)
    for i in range(batch):
        engine.add_request(str(i), [rng.randrange(3, spec.vocab_size) for _ in range(isl)],
                           SamplingParams(max_tokens=osl, end_id=-1))
    torch.cuda.synchronize()
    t, n = time.perf_counter(), 0
    while engine.has_work():
        n += sum(len(o.new_token_ids) for o in engine.step())
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    tag = "8b_fp8" if fp8 else "8b"
    out = {f"{tag}_batch": batch, f"{tag}_output_tokens": n, f"{tag}_seconds": dt, f"{tag}_output_tok_s": n / dt}
    if fp8:
        out["8b_fp8_scaled_mm"] = bool(model.layers[0].qkv.scaled_mm)  # False: fell back to dequant
    return out


def fp8_layer_error(device: str) -> dict:
    import torch
    from tritonllm.engine.fp8 import FP8Weight, scaled_linear

    g = torch.Generator(device=device).manual_seed(1)
    w = torch.randn(14336, 4096, device=device, generator=g, dtype=torch.bfloat16) * 0.02
    x = torch.randn(64, 4096, device=device, generator=g, dtype=torch.bfloat16)
    ref = (x.float() @ w.float().t())
    y = scaled_linear(x, FP8Weight(w, scaled_mm=True)).float()
    return {"fp8_layer_rel_err": float((y - ref).norm() / ref.norm())}


def profiles_check(cap: tuple[int, int]) -> dict:
    """Step 4 (see the module docstring): what both GPU profiles would do on this GPU."""
    import importlib.util

    sys.path.insert(0, os.path.join(ROOT, "build_scripts"))
    import build_trtllm_engine as b
    import render_configs as rc

    files = rc.render_files(rc.load_deployment())
    out = {"profiles_rendered": sorted(f for f in files if f.endswith(("/configs/trtllm.pbtxt", "/configs/llmapi.pbtxt")))}
    buildable = []
    for qformat in b.QFORMATS:
        try:
            b.check_gpus([cap], fp8=qformat in b.FP8_QFORMATS)
            buildable.append(qformat)
        except b.BuildError:
            pass
    out["trtllm_buildable_qformats"] = buildable
    out["trtllm_fp8_context_fmha"] = b.resolve_fp8_context_fmha("auto", [cap])[0]
    out["llmapi_fp8_kv_cache_ok"] = cap >= b.FP8_MIN_SM
    if importlib.util.find_spec("tensorrt_llm") is None:
        out["tensorrt_llm"] = None  # the lender has none: the names are checked against NVIDIA's source only
        return out
    import dataclasses

    import tensorrt_llm
    from tensorrt_llm.llmapi import KvCacheConfig
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs
    from tritonllm.trtllm import names

    have = {"LLM": set(TorchLlmArgs.model_fields), "KvCacheConfig": set(KvCacheConfig.model_fields),
            "SamplingParams": {f.name for f in dataclasses.fields(tensorrt_llm.SamplingParams)}}
    out["tensorrt_llm"] = tensorrt_llm.__version__
    out["names_missing"] = {kind: sorted(names.fields(kind) - fields) for kind, fields in have.items()
                            if names.fields(kind) - fields}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_check: CUDA is not available on this machine")
    result = {"device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
              "torch": torch.__version__}
    result.update(parity("cuda"))
    print(json.dumps(result), flush=True)
    result.update(profiles_check(tuple(torch.cuda.get_device_capability(0))))
    print(json.dumps(result), flush=True)
    result.update(fp8_layer_error("cuda"))
    print(json.dumps(result), flush=True)
    if not args.skip_8b:
        result.update(throughput_8b("cuda", args.batch))
        print(json.dumps(result), flush=True)
        torch.cuda.empty_cache()
        result.update(throughput_8b("cuda", args.batch, fp8=True))
    line = json.dumps(result)
    print(line)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_check.json"), "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
