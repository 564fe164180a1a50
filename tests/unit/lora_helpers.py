"""PEFT adapters for the tiny test checkpoints, made with peft itself, and HF checkpoints with them merged."""
from __future__ import annotations

import torch

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_dir: str, out_dir: str, *, r: int = 4, alpha: int = 8, targets=ALL, seed: int = 1,
                 rslora: bool = False, std: float = 0.2) -> str:
    """A PEFT LoRA adapter with random A and B (PEFT initialises B to zero, which would be a no-op)."""
    import peft
    import transformers as tf

    base = tf.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                          use_rslora=rslora, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def merged_checkpoint(base_dir: str, adapter_dir: str, out_dir: str) -> str:
    """The base checkpoint with the adapter merged by peft (W + scaling * B A), saved as a plain HF model."""
    import peft
    import transformers as tf

    base = tf.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = peft.PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
