"""A llama.cpp GGUF file -> ModelSpec + the engine's weights under HF names, every quantized block kept as it is.

- Config: transformers' own GGUF reader (``load_gguf_checkpoint(..., return_tensors=False)``: its metadata table
  and special cases, e.g. a ``llama`` file named Mistral is a Mistral), so the engine and transformers' GGUF
  loader (the tests' reference) agree on what the file is.
- Tensor names: gguf's ``TensorNameMap`` (llama.cpp's table) from the HF names the Architecture reads; a tensor
  the engine would not read (MoE experts, vision towers, ...) is refused by name rather than ignored.
- llama.cpp's converter permutes the q and k rows of ``llama`` files for its rotary layout
  (``LlamaModel.permute``); they are put back in HF's order here, whole rows of blocks at a time, as
  transformers' ``LlamaTensorProcessor`` does after dequantizing.
- Blocks: ``gguf_blocks.to_weight`` (which types map to which kernel, and why each is exact).
- ``rope_freqs.weight`` (Llama 3.1 files: the llama3 rope scaling as one factor per frequency) divides the rotary
  frequencies, as llama.cpp applies it (transformers' GGUF loader ignores that tensor).
"""
from __future__ import annotations

import numpy as np

from ..model_files import cached_hf_config, gguf_header
from .gguf_blocks import UnsupportedTensorError, to_weight
from .hf_config import ModelSpec, UnsupportedModelError, spec_from_config
from .models import ARCHITECTURES

# transformers' model_type of the file -> the engine's architecture. Files of other architectures are refused
# with this list; each entry needs its llama.cpp conversion quirks handled here (the q/k row permutation).
ARCHITECTURE_OF = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                   "qwen3": "Qwen3ForCausalLM"}
PERMUTED_QK = frozenset({"llama"})  # general.architecture values whose converter permutes q / k rows


def _layer_modules(arch) -> tuple[str, ...]:
    return ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm",
            *(f"self_attn.{p}" for p in (*arch.qkv, "o_proj")), *(f"mlp.{p}" for p in (*arch.gate_up, "down_proj")))


def _hf_names(gguf_arch: str, arch, num_layers: int) -> dict[str, str]:
    """GGUF tensor name (without .weight / .bias) -> HF module name, for every module the engine reads."""
    import gguf

    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[gguf_arch]
    table = gguf.get_tensor_name_map(arch_enum, num_layers)
    hf = ["model.embed_tokens", "model.norm", "lm_head"]
    hf += [f"model.layers.{i}.{m}" for i in range(num_layers) for m in _layer_modules(arch)]
    names = {}
    for name in hf:
        mapped = table.get_name(name)
        if mapped is not None:
            names[mapped] = name
    return names


def _unpermute_rows(data: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q / k projection (or its bias) from llama.cpp's rotary order back to HF's."""
    rows = data.shape[0]
    dim = rows // n_head // 2
    order = np.arange(rows).reshape(n_head, dim, 2).swapaxes(1, 2).reshape(-1)
    return data[order]


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _hf_config(path: str):
    """transformers' reading of the file's metadata as a config: from the tokenizer cache's HF view when the file has
    one (model_files: written by ``AutoConfig.from_pretrained(gguf_file=...)``, the same reading), else parsed now
    (transformers parses the whole header again, vocabulary included: ~2.5 s for a 49k vocabulary)."""
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cached = cached_hf_config(path)
    if cached is not None:
        cfg = AutoConfig.from_pretrained(str(cached.parent), local_files_only=True, trust_remote_code=False)
        return cfg.model_type, cfg
    try:
        parsed = load_gguf_checkpoint(path, return_tensors=False)
    except ValueError as e:  # transformers: "GGUF model with architecture X is not supported yet."
        raise UnsupportedModelError(f"{path}: {e}") from e
    config = dict(parsed["config"])
    model_type = config.pop("model_type")
    if ARCHITECTURE_OF.get(model_type) not in ARCHITECTURES:
        return model_type, None
    config.pop("_model_name_or_path", None)
    return model_type, AutoConfig.for_model(model_type, **config)


def _open(path: str):
    """The file's ModelSpec, its reader (a memory map), its tensors by GGUF name and its GGUF architecture."""
    model_type, cfg = _hf_config(path)
    name = ARCHITECTURE_OF.get(model_type)
    if name is None or name not in ARCHITECTURES:
        raise UnsupportedModelError(f"{path}: GGUF architecture {model_type!r} is not served; served: "
                                    f"{', '.join(sorted(ARCHITECTURE_OF))} (Mistral files are llama files)")
    reader = gguf_header(path)
    gguf_arch = _field(reader, "general.architecture")
    tensors = {t.name: t for t in reader.tensors}
    factors = tensors.pop("rope_freqs.weight", None)
    eog = [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    spec = spec_from_config(
        cfg, name, torch_dtype="float32", where=path,
        eos_token_ids=tuple(sorted({int(i) for i in eog if i is not None})),
        rope_factors=None if factors is None else tuple(float(v) for v in np.asarray(factors.data, np.float32)))
    return spec, reader, tensors, gguf_arch, model_type


def read_gguf_spec(path: str) -> ModelSpec:
    """The file's ModelSpec alone (its header: no tensor is read), for checks made before serving."""
    return _open(path)[0]


def read_gguf(path: str) -> tuple[ModelSpec, dict]:
    """The file's ModelSpec and weights (float tensors, Int4Weight / Int8Weight) under HF names; refusals name the
    file, and the tensor and its type where one is the cause."""
    spec, reader, tensors, gguf_arch, model_type = _open(path)
    names = _hf_names(gguf_arch, spec.arch, spec.num_layers)
    weights, unknown = {}, []
    for tname, t in tensors.items():
        base, _, suffix = tname.rpartition(".")
        hf = names.get(base)
        if hf is None or suffix not in ("weight", "bias"):
            unknown.append(f"{tname} ({t.tensor_type.name})")
            continue
        data = t.data
        if gguf_arch in PERMUTED_QK and hf.endswith(("self_attn.q_proj", "self_attn.k_proj")):
            data = _unpermute_rows(data, spec.num_heads if hf.endswith("q_proj") else spec.num_kv_heads)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists ne0 (the input) first
        try:
            weights[f"{hf}.{suffix}"] = to_weight(tname, t.tensor_type.name, data, shape)
        except UnsupportedTensorError as e:
            raise UnsupportedModelError(f"{path}: {e}") from e
    if unknown:
        raise UnsupportedModelError(f"{path}: tensors the engine does not read for {model_type}: "
                                    f"{', '.join(unknown[:8])}{' ...' if len(unknown) > 8 else ''}")
    del reader, tensors  # the file's memory map goes with them: the weights are copies
    return spec, weights

