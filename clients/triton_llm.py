"""Talk to the text models (`ensemble`, `tensorrt_llm_bls`) over HTTP or gRPC: one request in, text chunks out.

Shared by the CLI (llm_client.py), the concurrency example and the OpenAI-compatible server.

Invariants:
- Tensor names, dtypes and shapes are the ensemble's / BLS's (NVIDIA's contract, see
  backends/tritonllm/contract.py): every input carries the batch dimension, so a scalar is ``[1, 1]`` and
  a word list ``[1, N]``; an option left at ``None`` is not sent and the server's default applies.
- Both models are decoupled by default (deployment.yaml ``llm.decoupled_mode``), so gRPC goes through the
  bidirectional stream (plain ModelInfer is refused) and HTTP through ``/generate`` (one response) or
  ``/generate_stream`` (server-sent events). A unary server (``--model-config-name unary``) takes plain
  ``infer()`` instead, which NVIDIA's tools use; the stream works there too, without ``stream=true``.
- In streaming mode each ``Chunk.text`` is the *new* text only; concatenated they equal the
  non-streamed text (exact per-request detokenization in the BLS and the ensemble's postprocessing).
  ``num_output_tokens`` counts the tokens of that response (NVIDIA's semantics: sum them over a stream),
  ``log_probs`` the new tokens' log probabilities. The counts come only when asked for
  (``return_num_input_tokens`` / ``return_num_output_tokens``, which every request here sends).
- A failed request raises ``TritonError`` whose message is Triton's, unchanged.
"""
from __future__ import annotations

import json
import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

try:
    from tritonllm import contract as C
except ImportError:  # run from a checkout without `pip install -e .`: the library sits in backends/
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
    from tritonllm import contract as C

TEXT_MODELS = ("ensemble", "tensorrt_llm_bls")
_OUTPUTS = ("text_output", "num_input_tokens", "num_output_tokens")
BLS_ONLY_OUTPUTS = ("finish_reason",)  # ours: the BLS passes the engine's reason on (the ensemble has none)
_LOGPROB_OUTPUTS = ("output_log_probs", "cum_log_probs")
_LOGPROB_IDS = C.LOGPROB_TOKEN_IDS.name  # ours: the BLS names the token of each log prob (the ensemble cannot)
_TOP_OUTPUTS = tuple(t.name for t in C.TOP_LOGPROB_OUTPUTS)

# name -> (numpy dtype, Triton dtype) of every optional scalar the text models accept, from the contract.
_TRITON_DTYPE = {"TYPE_STRING": "BYTES"}
_OPTIONS = ("temperature", "top_k", "top_p", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty",
            "min_tokens", "end_id", "pad_id", "return_log_probs", "exclude_input_in_output", "lora_task_id",
            "num_return_sequences", "top_logprobs", "priority")
_SCALARS: dict[str, tuple[Any, str]] = {
    t.name: (np.dtype(C.numpy_dtype(t.dtype)).type, _TRITON_DTYPE.get(t.dtype, t.dtype[len("TYPE_"):]))
    for t in C.BLS_INPUTS if t.name in _OPTIONS}  # the BLS's: NVIDIA's ensemble inputs and ours


class OutOfRange(ValueError):
    """A value that does not fit the input tensor it is sent in (refused: a tensor never wraps it around)."""

    def __init__(self, name: str, value, low, high):
        super().__init__(f"{name} = {value} does not fit the model's input (from {low} to {high})")
        self.name = name


def integer_bounds(name: str) -> tuple[int, int]:
    """(min, max) of the integer tensor ``name`` (a text-model input: max_tokens, seed, top_k, ...)."""
    np_type = np.int32 if name in ("max_tokens", "logit_bias_ids") else _SCALARS[name][0]
    info = np.iinfo(np_type)
    return int(info.min), int(info.max)


def _fitting(name: str, value, np_type):
    """``value`` checked against ``np_type`` before conversion: integers within the type's range, floats finite
    (numpy would wrap an int around, or raise OverflowError, and turn a huge float into inf)."""
    if np.issubdtype(np_type, np.integer) and not isinstance(value, bool):
        low, high = (int(v) for v in (np.iinfo(np_type).min, np.iinfo(np_type).max))
        if not low <= int(value) <= high:
            raise OutOfRange(name, value, low, high)
    elif np.issubdtype(np_type, np.floating) and not np.isfinite(np.asarray(value, dtype=np.float64)).all():
        raise OutOfRange(name, value, "finite", "values")
    elif np.issubdtype(np_type, np.floating) and abs(float(value)) > float(np.finfo(np_type).max):
        raise OutOfRange(name, value, -float(np.finfo(np_type).max), float(np.finfo(np_type).max))
    return value


def default_tokenizer_dir() -> Path:
    """$TOKENIZER_DIR, else deployment.yaml's ``llm.tokenizer_dir`` (what the server tokenizes with)."""
    if os.environ.get("TOKENIZER_DIR"):
        return Path(os.environ["TOKENIZER_DIR"])
    root = Path(__file__).resolve().parents[1]
    try:
        import yaml

        configured = yaml.safe_load((root / "deployment.yaml").read_text())["llm"]["tokenizer_dir"]
    except (OSError, KeyError, TypeError, ImportError):
        configured = "build/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    path = Path(configured)
    return path if path.is_absolute() else root / path


class TritonError(RuntimeError):
    """Triton (or the transport) refused or failed a request. ``status`` is the gRPC status name or HTTP
    code when the transport gave one (Triton's in-stream errors carry only a message)."""

    def __init__(self, message: str, status: str | int | None = None):
        super().__init__(message)
        self.message, self.status = message, status


@dataclass
class GenerationParams:
    """Sampling options of one request, by the ensemble's input names. None = not sent (server default)."""

    max_tokens: int = 64
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int | None = None
    end_id: int | None = None
    pad_id: int | None = None
    return_log_probs: bool | None = None
    exclude_input_in_output: bool | None = None
    stop_words: list[str] = field(default_factory=list)
    bad_words: list[str] = field(default_factory=list)
    guided_decoding_guide_type: str | None = None  # json, json_schema, regex, ebnf_grammar
    guided_decoding_guide: str | None = None
    lora_task_id: int | None = None  # a LoRA adapter loaded by tensorrt_llm (its lora_adapters parameter)
    lora_path: str | None = None  # ... or loaded by it at run time from this folder under its lora_root
    num_return_sequences: int | None = None  # n sequences, told apart by Chunk.sequence_index
    # Ours (tensorrt_llm_bls only, not NVIDIA's ensemble): alternatives per token, priority in [0, 1],
    # OpenAI's logit_bias by token id.
    top_logprobs: int | None = None
    priority: float | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)

    def arrays(self, prompt: str, stream: bool) -> dict[str, tuple[np.ndarray, str]]:
        """Input name -> (array with the batch dimension, Triton dtype)."""
        out: dict[str, tuple[np.ndarray, str]] = {
            "text_input": (np.array([[prompt.encode("utf-8")]], dtype=object), "BYTES"),
            "max_tokens": (np.array([[_fitting("max_tokens", self.max_tokens, np.int32)]], dtype=np.int32), "INT32"),
            "stream": (np.array([[stream]], dtype=np.bool_), "BOOL"),
            "return_num_input_tokens": (np.array([[True]], dtype=np.bool_), "BOOL"),
            "return_num_output_tokens": (np.array([[True]], dtype=np.bool_), "BOOL"),
        }
        for name, (np_type, triton_type) in _SCALARS.items():
            value = getattr(self, name)
            if value is not None:
                out[name] = (np.array([[_fitting(name, value, np_type)]], dtype=np_type), triton_type)
        for name, words in (("stop_words", self.stop_words), ("bad_words", self.bad_words)):
            if words:
                out[name] = (np.array([[w.encode("utf-8") for w in words]], dtype=object), "BYTES")
        for name in ("guided_decoding_guide_type", "guided_decoding_guide", "lora_path"):
            value = getattr(self, name)
            if value is not None:
                out[name] = (np.array([[value.encode("utf-8")]], dtype=object), "BYTES")
        if self.logit_bias:
            ids = [_fitting("logit_bias_ids", i, np.int32) for i in self.logit_bias]
            out["logit_bias_ids"] = (np.array([ids], dtype=np.int32), "INT32")
            out["logit_bias_weights"] = (np.array([list(self.logit_bias.values())], dtype=np.float32), "FP32")
        return out

    def generate_json(self, prompt: str, stream: bool) -> dict[str, Any]:
        """Body of ``/v2/models/<m>/generate[_stream]``: the same inputs as plain JSON values."""
        body: dict[str, Any] = {}
        for name, (array, _) in self.arrays(prompt, stream).items():
            values = array.reshape(-1).tolist()
            values = [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]
            body[name] = values if name in ("stop_words", "bad_words", "logit_bias_ids", "logit_bias_weights") \
                else values[0]
        return body

    def requested_outputs(self, model: str = "tensorrt_llm_bls") -> tuple[str, ...]:
        return (_OUTPUTS + (BLS_ONLY_OUTPUTS if model == "tensorrt_llm_bls" else ())
                + (_LOGPROB_OUTPUTS if self.return_log_probs else ())
                + ((_LOGPROB_IDS,) if self.return_log_probs and model == "tensorrt_llm_bls" else ())
                + (("sequence_index",) if (self.num_return_sequences or 1) > 1 else ())
                + (_TOP_OUTPUTS if self.top_logprobs else ()))


@dataclass
class Chunk:
    """One response of the model: new text (streaming) or all of it, plus the pass-through counters."""

    text: str
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
    log_probs: list[float] | None = None
    token_ids: list[int] | None = None  # the tokens log_probs score, one each (BLS and direct path; not the ensemble)
    cum_log_prob: float | None = None
    sequence_index: int = 0
    top_log_probs: list[list[tuple[int, float]]] | None = None  # per token: (id, log prob), most likely first
    finish_reason: str | None = None  # the engine's, on a sequence's last chunk (BLS): stop, length, timeout, abort


def chunk_from(get: Callable[[str], Any]) -> Chunk:
    """Build a Chunk from ``get(name) -> array or None`` (gRPC ``as_numpy``, or an HTTP JSON lookup)."""
    def first(name):
        value = get(name)
        if value is None:
            return None
        flat = np.asarray(value).reshape(-1)
        return flat[0] if flat.size else None

    text = first("text_output")
    n_in, n_out, cum = first("num_input_tokens"), first("num_output_tokens"), first("cum_log_probs")
    lp, lp_ids = get("output_log_probs"), get(_LOGPROB_IDS)
    seq = first("sequence_index")
    top_ids, top_lps = get("top_log_prob_ids"), get("top_log_probs")
    top = None
    if top_ids is not None and top_lps is not None:
        k = np.asarray(top_ids).shape[-1]
        ids, lps = np.asarray(top_ids).reshape(-1, k), np.asarray(top_lps).reshape(-1, k)
        top = [[(int(i), float(v)) for i, v in zip(ri, rv) if i >= 0] for ri, rv in zip(ids, lps)]
    return Chunk(
        text=(text.decode("utf-8") if isinstance(text, bytes) else str(text)) if text is not None else "",
        num_input_tokens=int(n_in) if n_in is not None else None,
        num_output_tokens=int(n_out) if n_out is not None else None,
        log_probs=[float(x) for x in np.asarray(lp).reshape(-1)] if lp is not None else None,
        token_ids=[int(x) for x in np.asarray(lp_ids).reshape(-1)] if lp_ids is not None else None,
        cum_log_prob=float(cum) if cum is not None else None,
        sequence_index=int(seq) if seq is not None else 0,
        top_log_probs=top,
        finish_reason=_text(first("finish_reason")) or None,
    )


def _text(value) -> str:
    return "" if value is None else value.decode("utf-8") if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- gRPC

def grpc_inputs(params: GenerationParams, prompt: str, stream: bool, model: str = "tensorrt_llm_bls"):
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, (array, dtype) in params.arrays(prompt, stream).items():
        t = grpcclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        inputs.append(t)
    outputs = [grpcclient.InferRequestedOutput(n) for n in params.requested_outputs(model)]
    return inputs, outputs


def grpc_generate(url: str, model: str, prompt: str, params: GenerationParams, stream: bool = True,
                  timeout_s: float = 600.0) -> Iterator[Chunk]:
    """Yield the chunks of one request over a gRPC bidirectional stream (one connection per call)."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        # No triton_grpc_error header: it would give in-stream errors a status, but on Triton 2.51 it
        # crashed the server under some sequences of errors (docs/nvidia_clients.md).
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        inputs, outputs = grpc_inputs(params, prompt, stream, model)
        client.async_stream_infer(model, inputs, outputs=outputs, enable_empty_final_response=True)
        while True:
            try:
                result, error = responses.get(timeout=timeout_s)
            except queue.Empty:
                raise TritonError(f"no response from {model} within {timeout_s:.0f} s", "DEADLINE_EXCEEDED")
            if error is not None:
                raise TritonError(error.message(), error.status())
            response = result.get_response()
            if response.outputs:  # the final flag may come alone, with no outputs
                yield chunk_from(result.as_numpy)
            if response.parameters["triton_final_response"].bool_param:
                return
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


# --------------------------------------------------------------------------- HTTP

def http_generate(url: str, model: str, prompt: str, params: GenerationParams, stream: bool = True,
                  timeout_s: float = 600.0) -> Iterator[Chunk]:
    """Yield the chunks of one request over Triton's generate extension (SSE when ``stream``)."""
    import requests

    base = url if url.startswith("http") else f"http://{url}"
    endpoint = f"{base}/v2/models/{model}/generate" + ("_stream" if stream else "")
    body = params.generate_json(prompt, stream)
    wanted = set(params.requested_outputs(model))  # /generate returns every output; keep what was asked for

    def pick(event: dict):
        return lambda name: event.get(name) if name in wanted else None

    with requests.post(endpoint, json=body, stream=stream, timeout=timeout_s) as r:
        if r.status_code != 200:
            raise TritonError(_http_error(r.text), r.status_code)
        if not stream:
            yield chunk_from(pick(r.json()))
            return
        for line in r.iter_lines(decode_unicode=False):
            if not line.startswith(b"data:"):
                continue  # blank separators, comments
            event = json.loads(line[5:].decode("utf-8"))
            if "error" in event:
                raise TritonError(event["error"], r.status_code)
            yield chunk_from(pick(event))


def _http_error(text: str) -> str:
    try:
        return json.loads(text).get("error", text)
    except (ValueError, AttributeError):
        return text


def generate(protocol: str, url: str, model: str, prompt: str, params: GenerationParams,
             stream: bool = True) -> Iterator[Chunk]:
    if protocol == "grpc":
        return grpc_generate(url, model, prompt, params, stream)
    if protocol == "http":
        return http_generate(url, model, prompt, params, stream)
    raise ValueError(f"protocol must be http or grpc, not {protocol!r}")


# --------------------------------------------------------------------------- timing

@dataclass
class Timing:
    """Client-side timing of one request. ``ttft`` counts to the first chunk carrying text."""

    start: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    end: float | None = None
    output_tokens: int = 0
    input_tokens: int | None = None
    text_chunks: int = 0

    def observe(self, chunk: Chunk) -> None:
        if chunk.text:
            self.text_chunks += 1
            if self.first_token is None:
                self.first_token = time.perf_counter()
        if chunk.num_output_tokens is not None:  # this response's tokens
            self.output_tokens += chunk.num_output_tokens
        if chunk.num_input_tokens is not None:
            self.input_tokens = chunk.num_input_tokens

    def finish(self) -> "Timing":
        self.end = time.perf_counter()
        return self

    @property
    def total_s(self) -> float:
        return (self.end or time.perf_counter()) - self.start

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    def summary(self) -> dict[str, float | int | None]:
        """TTFT, end-to-end tokens/s, and decode tokens/s (tokens after the first / time after the first;
        only when the text came in several chunks, i.e. streamed: otherwise TTFT is the whole request)."""
        total = self.total_s
        decode = None
        if (self.first_token is not None and self.text_chunks > 1 and self.output_tokens > 1 and self.end
                and self.end > self.first_token):
            decode = (self.output_tokens - 1) / (self.end - self.first_token)
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "ttft_s": self.ttft_s,
            "total_s": total,
            "tokens_per_s": self.output_tokens / total if total > 0 else None,
            "decode_tokens_per_s": decode,
        }
