"""The benchmark checkpoint of issue #9: a random-weight Llama (hidden 768, 12 layers, 12 heads, 4 KV heads,
intermediate 2048, vocab 32000, untied: 124.7M parameters), seed 0, cached under build/models/bench."""
from __future__ import annotations

import hashlib
import os
import sys

BENCH_CONFIG = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                    intermediate_size=2048, vocab_size=32000, max_position_embeddings=2048,
                    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def build_bench_model(out_dir: str = "build/models/bench", dtype: str = "float32") -> str:
    import torch
    import transformers as tf

    stamp = hashlib.sha256(repr((BENCH_CONFIG, dtype, tf.__version__)).encode()).hexdigest()[:16]
    stamp_path = os.path.join(out_dir, ".stamp")
    if os.path.isfile(stamp_path) and open(stamp_path).read() == stamp:
        return out_dir
    print(f"building benchmark model in {out_dir} ...", file=sys.stderr)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**BENCH_CONFIG)).to(getattr(torch, dtype))
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(stamp_path, "w") as f:
        f.write(stamp)
    return out_dir


if __name__ == "__main__":
    print(build_bench_model(*sys.argv[1:]))
