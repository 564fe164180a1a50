"""The engine's deployment knobs: one row per ``models.tensorrt_llm.parameters`` key of deployment.yaml.

Each ``Knob`` is the one definition of its parameter (NVIDIA's name where theirs exists): the EngineConfig
field it sets, its type, default, allowed values or range, and its documentation line. Everything else is
derived from this table: ``EngineConfig``'s defaults and checks (``engine/config.py``), the parsing of a
model config's string parameters (``config.engine_config_from_parameters``, also used by the Dynamo
worker), the renderer's checks of deployment.yaml (``build_scripts/render_configs.py``) and the table in
docs/engine.md (``markdown_table``, kept equal by a unit test). No Triton or torch imports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Weight formats: fp8 (fp8.py), int8 per channel, int4 group-wise with zero points (AWQ / GPTQ style) or
# symmetric (quant.py).
QUANTIZATIONS = ("none", "fp8", "int8", "int4", "int4_sym")
ACTIVATION_MODES = ("auto", "none", "int8")  # loader.activation_mode resolves auto
SPECULATIVE_MODES = ("prompt_lookup", "draft_model", "draft_tokens_external")


class KnobError(ValueError):
    """A knob's value is of the wrong type or outside what it allows; the message names the parameter."""


@dataclass(frozen=True)
class Knob:
    param: str                          # the config.pbtxt / deployment.yaml parameter
    field: str | None                   # the EngineConfig field it sets (None: read by the adapter)
    kind: type                          # int, float, bool or str
    default: object
    doc: str
    allowed: tuple | None = None        # the only values it takes
    minimum: float | None = None        # inclusive lower bound
    above: float | None = None          # exclusive lower bound
    maximum: float | None = None        # inclusive upper bound

    def parse(self, text: str | None):
        """The typed value of a string parameter (Triton's string_value); the default when unset ("" or an
        unfilled ``${...}`` template)."""
        if text is None or text == "" or text.startswith("${"):
            return self.default
        try:
            if self.kind is bool:
                low = text.lower()
                if low not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                    raise ValueError("expected true or false")
                value = low in ("1", "true", "yes", "on")
            else:
                value = self.kind(text)
        except ValueError as e:
            raise KnobError(f"parameter {self.param}={text!r}: {e}") from None
        self.check(value)
        return value

    def check(self, value) -> None:
        """Raises KnobError when ``value`` (typed; None = unset) is not one this knob takes."""
        if value is None:
            if self.default is not None:
                raise KnobError(f"{self.param} must be set")
            return
        ok_type = isinstance(value, self.kind) and not (self.kind is not bool and isinstance(value, bool))
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok_type = True
        if not ok_type:
            raise KnobError(f"{self.param} = {value!r}; must be {self.kind.__name__}")
        if self.allowed is not None and value not in self.allowed:
            raise KnobError(f"{self.param} = {value!r}; allowed: {', '.join(map(str, self.allowed))}")
        if self.kind is float and not math.isfinite(value):
            raise KnobError(f"{self.param} = {value!r}; must be finite")
        if self.minimum is not None and value < self.minimum:
            raise KnobError(f"{self.param} = {value!r}; must be >= {self.minimum}")
        if self.above is not None and value <= self.above:
            raise KnobError(f"{self.param} = {value!r}; must be > {self.above}")
        if self.maximum is not None and value > self.maximum:
            raise KnobError(f"{self.param} = {value!r}; must be <= {self.maximum}")


KNOBS: tuple[Knob, ...] = (
    Knob("tokens_per_block", "block_size", int, 16, "KV block size in tokens", minimum=1),
    Knob("max_tokens_in_paged_kv_cache", "max_kv_tokens", int, None,
         "KV capacity in tokens (unset: kv_cache_free_gpu_mem_fraction of free memory)", minimum=1),
    Knob("kv_cache_free_gpu_mem_fraction", "kv_mem_fraction", float, 0.9,
         "share of free device memory (CUDA) or available RAM (CPU) for the KV cache", above=0.0, maximum=1.0),
    Knob("max_num_tokens", "max_num_tokens", int, 512, "per-step token budget (prefill chunks + decodes)",
         minimum=1),
    Knob("max_num_sequences", "max_num_seqs", int, 64, "sequences running at once", minimum=1),
    Knob("max_queue_size", "max_queue_size", int, 1024,
         "waiting requests beyond the running ones; more get UNAVAILABLE", minimum=0),
    Knob("enable_chunked_context", "enable_chunked_prefill", bool, True,
         "prefill long prompts in chunks next to decodes"),
    Knob("enable_kv_cache_reuse", "enable_prefix_caching", bool, False,
         "prefix caching: prompts share cached KV blocks"),
    Knob("priority_aging_s", "priority_aging_s", float, 30.0,
         "a waiting request's priority grows by 1 per this many seconds (0: no aging)", minimum=0.0),
    Knob("speculative_decoding_mode", None, str, "", "lossless drafts: prompt_lookup (n-grams) or draft_model",
         allowed=("", "none", *SPECULATIVE_MODES)),
    Knob("max_draft_len", "max_draft_len", int, 0, "draft tokens per step (with speculative_decoding_mode)",
         minimum=0),
    Knob("prompt_lookup_ngram", "ngram_max", int, 3, "longest n-gram matched for a prompt-lookup draft",
         minimum=1),
    Knob("max_input_len", "max_input_len", int, None, "longest prompt (unset: the checkpoint's context)",
         minimum=1),
    Knob("max_seq_len", "max_seq_len", int, None, "prompt + output (unset: the checkpoint's context)", minimum=1),
    Knob("engine_device", "device", str, "auto", "auto | cpu | cuda", allowed=("auto", "cpu", "cuda")),
    Knob("engine_dtype", "dtype", str, "auto", "compute dtype (auto: fp32 on CPUs without bf16 instructions)",
         allowed=("auto", "float32", "bfloat16", "float16")),
    Knob("num_threads", "num_threads", int, 0, "torch intra-op threads; 0 = torch's default", minimum=0),
    Knob("cpu_kernels", "cpu_kernels", str, "auto", "fp32 CPU kernels: auto (ours, AVX2) | native | torch",
         allowed=("auto", "native", "torch")),
    Knob("quantization", "quantization", str, "none", "weights quantized at load", allowed=QUANTIZATIONS),
    Knob("quant_group_size", "quant_group_size", int, 32, "int4: weights per scale / zero point",
         allowed=(32, 64, 128)),
    Knob("activation_quantization", "activation_quantization", str, "auto",
         "int8 / int4 weights' matmuls on CPU: none = fp32 activations against the weights dequantized in "
         "registers (the float model of those weights: HF-exact greedy); int8 = activations rounded per 32-block "
         "for integer dot products (llama.cpp's way: faster; perplexity +0.17% over none's on the default file, "
         "make eval); auto = int8 on a GGUF file's quantized tensors (as llama.cpp computes them), none elsewhere",
         allowed=ACTIVATION_MODES),
    Knob("fp8_matmul", "fp8_matmul", str, "auto", "fp8: scaled FP8 matmuls (SM >= 8.9) or dequantize",
         allowed=("auto", "scaled", "dequant")),
    Knob("kv_cache_dtype", "kv_cache_dtype", str, "auto",
         "KV cache: compute dtype, fp16, fp8 or int8 (fp16 and int8 read by the native CPU "
         "decode kernels: half / ~quarter of fp32's bytes a step)", allowed=("auto", "fp16", "fp8", "int8")),
    Knob("guided_decoding_max_guide_bytes", "guide_max_bytes", int, 65536,
         "a longer guided_decoding_guide (JSON schema, regex, grammar) is refused at once", minimum=1),
    Knob("guided_decoding_compile_timeout_s", "guide_compile_timeout_s", float, 10.0,
         "a guide not compiled by then fails its request; other requests never wait for a compile", above=0.0),
    Knob("guided_decoding_cache_bytes", "guide_cache_bytes", int, 64 * 1024 * 1024,
         "compiled guides kept (xgrammar's cache, least recently used evicted first)", minimum=0),
    Knob("max_loras", "max_loras", int, 8,
         "LoRA adapters loaded at run time (a request's lora_path or lora_weights) kept at once; the least recently "
         "used idle one is evicted first (lora_adapters are kept apart, always)", minimum=0),
    Knob("lora_root", None, str, "",
         "folder a request's lora_path is opened under (relative paths; nothing outside it, symlinks included); "
         "unset: adapters by path are refused", ),
    Knob("exclude_input_in_output", None, bool, True, "default of the request input of the same name"),
    Knob("stream_coalescing", None, bool, False,
         "streamed deltas that queue while sending lags merge into one response (fewer, larger deltas)"),
    Knob("stream_interval", None, int, 1,
         "streamed tokens per response after the first (SGLang's name): 1 = every token; n = fewer, larger "
         "deltas (less work per token for the server and the client)", minimum=1),
)
BY_PARAM: dict[str, Knob] = {k.param: k for k in KNOBS}
BY_FIELD: dict[str, Knob] = {k.field: k for k in KNOBS if k.field}


def default(field: str):
    """EngineConfig's default of ``field`` (its knob's)."""
    return BY_FIELD[field].default


def markdown_table() -> str:
    rows = ["| parameter | default | allowed | what it sets |", "|---|---|---|---|"]
    for k in KNOBS:
        allowed = " / ".join(f"`{a}`" for a in k.allowed if a != "") if k.allowed else _range(k)
        shown = "unset" if k.default in (None, "") else f"`{str(k.default).lower() if k.kind is bool else k.default}`"
        rows.append(f"| `{k.param}` | {shown} | {allowed} | {k.doc} |")
    return "\n".join(rows) + "\n"


def _range(k: Knob) -> str:
    parts = []
    if k.minimum is not None:
        parts.append(f">= {k.minimum:g}")
    if k.above is not None:
        parts.append(f"> {k.above:g}")
    if k.maximum is not None:
        parts.append(f"<= {k.maximum:g}")
    return ", ".join(parts) or ("true / false" if k.kind is bool else k.kind.__name__)
