"""NVIDIA's LLM-API text contract (``contract_llmapi``) on top of the BLS pipeline (``bls_stream``).

A request of model ``llmapi`` becomes one BLS row: ``to_bls_arrays`` renames its inputs to the
ensemble's (``sampling_param_max_tokens`` -> ``max_tokens``, ...), ``bls_stream.parse_request``
validates them, and ``LlmapiGeneration`` turns the engine's tokens into NVIDIA's responses. Error
messages carry the client's names back (``client_names``). No Triton imports.

Semantics, as NVIDIA's ``llmapi/tensorrt_llm/1/model.py`` gives them (read from their source):
- ``text_output`` is ``CompletionOutput.text``: the whole text so far, in every streamed response too
  (not a delta), with the prompt in front unless ``sampling_param_exclude_input_from_output`` is true
  (default false). Ours: the prompt's decoded ids, then the exact generated text (stop strings cut
  unless ``include_stop_words``).
- ``finish_reason``: "length" when max_tokens were generated, "stop" for EOS or a stop string, "timeout" when the
  request's deadline ended it, "cancelled" when it was stopped (the engine's own reason, TensorRT-LLM's words),
  "None" while unfinished; ``stop_reason``: the stop string that ended it, else "None";
  ``cumulative_logprob``: the generated tokens' summed log probability (NVIDIA's model cannot ask for
  log probs and sends "None"; we ask the engine when it is requested).
- ``stop`` with the request id of running requests cancels them: each answers CANCELLED, and so does
  the stop request itself ("Request cancelled by client").
- ``lora_id`` / ``lora_name`` / ``lora_path`` come together or not at all, as NVIDIA's model takes them
  (a ``LoRARequest``): ``lora_id`` becomes ``lora_task_id`` and ``lora_path`` goes to the engine, which loads
  the PEFT folder from under its ``lora_root`` parameter and caches it under the id (engine/lora_loader.py:
  confined there, never opened here); an id of a fixed adapter (deployment.yaml ``lora_adapters``) serves
  that adapter. ``lora_name`` is a label; ``lora_ckpt_source`` "nemo" is refused (PEFT folders only).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import contract_llmapi as L
from .bls_stream import BlsRequest, parse_request
from .text_generation import TextGeneration
from .bls_stream import scalar as _scalar
from .preprocess import InvalidInput

STOP_MESSAGE = "Request cancelled by client"
NO_ID_MESSAGE = "A request id must be provided for request cancellation"
_FROM_TEXT = {text: ours for ours, text in L.TO_TEXT_INPUTS.items()}
_NAME = re.compile(r"\b(" + "|".join(sorted(map(re.escape, _FROM_TEXT), key=len, reverse=True)) + r")\b")


def client_names(message: str) -> str:
    """A BLS / engine message in the LLM-API names (max_tokens -> sampling_param_max_tokens, ...)."""
    return _NAME.sub(lambda m: _FROM_TEXT[m.group(1)], message)


@dataclass
class LlmapiRequest(BlsRequest):
    """A BLS request plus what NVIDIA's contract adds: outputs asked for, prompt echo."""

    returns: frozenset = field(default_factory=frozenset)  # finish_reason, stop_reason, cumulative_logprob
    perf: bool = False
    echo_prompt: bool = True


def _text(value, name: str) -> str:
    if isinstance(value, (bytes, bytearray, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{name} is not valid UTF-8") from None
    if isinstance(value, str):
        return value
    raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")


def is_stop(arrays: Mapping[str, np.ndarray]) -> bool:
    value = _scalar(arrays, "stop")
    return bool(value) if value is not None else False


def to_bls_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The request's inputs as one BLS row (every tensor ``[1, ...]``). InvalidInput names LLM-API inputs."""
    arrays = {k: np.asarray(v) for k, v in arrays.items() if v is not None}
    query = arrays.get("text_input")
    if query is None:
        raise InvalidInput("text_input is missing from the request")
    if query.ndim != 1 or query.size == 0:
        raise InvalidInput(f"text_input must be a 1-D tensor of strings, got shape {list(query.shape)}")
    best_of = _scalar(arrays, "sampling_param_best_of")
    if best_of is not None and int(best_of) != 1:
        raise InvalidInput(f"sampling_param_best_of = {best_of}: only 1 is supported (one sequence per request)")
    given = [name for name in L.LORA_INPUTS if name in arrays]
    if given and len(given) != len(L.LORA_INPUTS):
        raise InvalidInput("lora_id, lora_name, and lora_path must all be provided together")
    if given:
        for name in ("lora_name", "lora_path"):
            if not _text(_scalar(arrays, name), name):
                raise InvalidInput(f"{name} is empty")
        source = _scalar(arrays, "lora_ckpt_source")
        if source is not None and _text(source, "lora_ckpt_source") not in L.LORA_CKPT_SOURCES:
            raise InvalidInput(f"lora_ckpt_source must be one of {', '.join(L.LORA_CKPT_SOURCES)}")
        if source is not None and _text(source, "lora_ckpt_source") != "hf":
            raise InvalidInput("lora_ckpt_source nemo: this server loads PEFT (hf) adapter folders only")
    out = {"text_input": query.reshape(-1)[:1].astype(object).reshape(1, 1),
           "max_tokens": np.array([[L.DEFAULT_MAX_TOKENS]], dtype=np.int32)}
    for ours, text_name in L.TO_TEXT_INPUTS.items():
        if ours in arrays:
            value = arrays[ours]
            if ours != "sampling_param_stop":
                _scalar(arrays, ours)  # one value, as NVIDIA's get_input_scalar_by_name wants
            out[text_name] = value.reshape(1, -1)
    if _scalar(arrays, "return_cumulative_logprob"):
        out["return_log_probs"] = np.array([[True]])
    return out


def parse(arrays: Mapping[str, np.ndarray]) -> LlmapiRequest:
    """Validate one LLM-API request; InvalidInput (in the client's names) when bad."""
    try:
        bls = parse_request(to_bls_arrays(arrays))
    except InvalidInput as e:
        raise InvalidInput(client_names(str(e))) from None
    exclude = _scalar(arrays, "sampling_param_exclude_input_from_output")
    returns = frozenset(out for flag, out in L.REASON_OUTPUTS.items() if _scalar(arrays, flag))
    fields = {k: getattr(bls, k) for k in BlsRequest.__dataclass_fields__}
    return LlmapiRequest(**fields, returns=returns, perf=bool(_scalar(arrays, "sampling_param_return_perf_metrics")),
                         echo_prompt=not (L.DEFAULT_EXCLUDE_INPUT if exclude is None else bool(exclude)))


def _string(value) -> np.ndarray:
    return np.array([str(value).encode("utf-8")], dtype=object)


class LlmapiGeneration:
    """tensorrt_llm responses in, NVIDIA's LLM-API responses out (same protocol as TextGeneration:
    ``on_response`` returns a chunk to send now, ``finish`` the final one, ``stopped`` when a stop string
    completed). Not thread-safe."""

    def __init__(self, tokenizer: Any, req: LlmapiRequest, prompt: list[int] | None = None, *,
                 skip_special_tokens: bool = True, **kwargs: Any) -> None:
        # Deltas underneath, whatever the client asked: the text here is cumulative, as NVIDIA's is.
        self._gen = TextGeneration(tokenizer, replace(req, stream=True, exclude_input=True), prompt,
                                   skip_special_tokens=skip_special_tokens, **kwargs)
        self._req = req
        self._text = tokenizer.decode(prompt or [], skip_special_tokens=skip_special_tokens) if req.echo_prompt else ""
        self._latest: dict[str, np.ndarray] = {}

    @property
    def stopped(self) -> bool:
        return self._gen.stopped

    def _take(self, chunk) -> None:
        if chunk is not None:
            self._text += chunk.text
            self._latest.update(chunk.outputs)

    def on_response(self, arrays: Mapping[str, np.ndarray]) -> "LlmapiChunk | None":
        self._take(self._gen.on_response(arrays))
        if self._req.stream and not self._gen.stopped:
            return LlmapiChunk(self._response(finished=False))
        return None

    def finish(self) -> "LlmapiChunk":
        self._take(self._gen.finish())
        return LlmapiChunk(self._response(finished=True))

    def _finish_reason(self) -> tuple[str, str]:
        """TensorRT-LLM's CompletionOutput.finish_reason: the engine's when it sent one ("timeout" for a request
        deadline, "cancelled" for an abort), else from the counts."""
        if self._gen.stopped:
            return "stop", self._gen.matched or "None"
        engine = self._latest.get("finish_reason")
        engine = np.asarray(engine).reshape(-1)[0].decode() if engine is not None else ""
        if engine:
            return {"abort": "cancelled"}.get(engine, engine), "None"
        return ("length" if self._gen.num_tokens >= self._req.max_tokens else "stop"), "None"

    def _response(self, finished: bool) -> dict[str, np.ndarray]:
        out = {"text_output": np.array([self._text.encode("utf-8")], dtype=object)}
        reason, stop = self._finish_reason() if finished else ("None", "None")
        if "finish_reason" in self._req.returns:
            out["finish_reason"] = _string(reason)
        if "stop_reason" in self._req.returns:
            out["stop_reason"] = _string(stop)
        if "cumulative_logprob" in self._req.returns:
            cum = self._latest.get("cum_log_probs")
            out["cumulative_logprob"] = _string(float(np.asarray(cum).reshape(-1)[0]) if cum is not None else None)
        if self._req.perf and "kv_cache_reused_blocks" in self._latest:
            out.update(self._perf())
        return out

    def _perf(self) -> dict[str, np.ndarray]:
        def value(name):
            v = np.asarray(self._latest[name]).reshape(-1)[0]
            return float(v) if np.issubdtype(v.dtype, np.floating) else int(v)

        out = {}
        for name, ours in L.PERF_FROM.items():
            if ours:
                out[name] = _string(value(ours))
        reused, missed = value("kv_cache_reused_blocks"), value("kv_cache_alloc_new_blocks")
        out["kv_cache_hit_rate"] = _string(reused / (reused + missed) if reused + missed else 0.0)
        return out


@dataclass
class LlmapiChunk:
    outputs: dict[str, np.ndarray]
    empty: bool = False  # always a data response: the text is cumulative

    def arrays(self) -> dict[str, np.ndarray]:
        return self.outputs


def generation_for(tokenizer: Any, req: BlsRequest, prompt: list[int], **kwargs: Any):
    """The generation object for a parsed request of either contract."""
    cls = LlmapiGeneration if isinstance(req, LlmapiRequest) else TextGeneration
    return cls(tokenizer, req, prompt, **kwargs)
