"""The BLS's text steps in the OpenAI server's own process, over Triton's token-level ``tensorrt_llm`` model.

Why: through ``tensorrt_llm_bls`` every streamed token crosses one more process (the BLS stub) and Triton routes it
twice; on 2 cores that CPU is taken from the engine, whose two OpenMP threads wait for each other (SmolLM2-135M at
one stream: 0.6 ms in the BLS stub and 0.3 ms more in tritonserver per token, of a ~9 ms token). Here the same
library functions the BLS runs (``tritonllm.text``: ``bls_stream.parse_request``, ``preprocess``,
``Sequences`` of ``TextGeneration`` = exact incremental text, stop strings, n sequences, log probs) run on the
OpenAI server's event loop, and the request goes straight to ``tensorrt_llm`` through Triton, so nothing the BLS
gives is lost and no text logic is written twice.

The deployment's text knobs are read from the served models' configs over gRPC, once: ``preprocessing``
(add_special_tokens, chat_template / apply_chat_template, stop_words_in_context) and ``tensorrt_llm_bls``
(skip_special_tokens, include_stop_words, engine_finish_reason); unset ones take the models' defaults.

Invariants: what the BLS refuses is refused here with the same message (INVALID_ARG -> 400); an inner error's
message is put in the client's names (``bls_stream.client_message``); once every sequence completed a stop string
the gRPC call is cancelled, which cancels the engine request (tensorrt_llm watches its senders); the stream's last
chunk of each sequence carries its finish reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from clients.openai_server.protocol import ApiError
from clients.triton_llm import Chunk, GenerationParams, chunk_from
from tritonllm import contract as C
from tritonllm.errors import ERROR_OUTPUTS, ERRORS_AS_DATA, InvalidInput
from tritonllm.text import bls_stream as B
from tritonllm.text import llmapi_text as LT
from tritonllm.text.detokenizer import tokenizer_traits
from tritonllm.text.preprocess import preprocess
from tritonllm.text.sequences import Sequences
from tritonllm.text.tokenizer import TextTokenizer, chat_mode_from_params, parse_bool


@dataclass
class Knobs:
    """The text knobs of the served deployment (see the module docstring)."""

    add_special_tokens: bool = True
    chat: dict[str, str] | None = None  # preprocessing's chat_template / apply_chat_template parameters
    stop_words_in_context: bool = True
    skip_special_tokens: bool = True
    include_stop_words: bool = False
    engine_finish_reason: bool = True

    @classmethod
    def from_configs(cls, pre: dict[str, str], bls: dict[str, str]) -> "Knobs":
        return cls(add_special_tokens=parse_bool(pre.get("add_special_tokens"), True),
                   chat={k: pre[k] for k in ("chat_template", "apply_chat_template") if k in pre},
                   stop_words_in_context=parse_bool(pre.get("stop_words_in_context"), True),
                   skip_special_tokens=parse_bool(bls.get("skip_special_tokens"), True),
                   include_stop_words=parse_bool(bls.get("include_stop_words"), False),
                   engine_finish_reason=parse_bool(bls.get("engine_finish_reason"), True))


def parameters(config: dict) -> dict[str, str]:
    """A model config's parameters (tritonclient's JSON form) as name -> string value."""
    return {k: v.get("string_value", "") for k, v in (config.get("config", config).get("parameters") or {}).items()}


class TextSteps:
    """The tokenizer and knobs of one deployment: a request's tensorrt_llm inputs and its per-sequence text."""

    def __init__(self, tokenizer: Any, tokenizer_dir: str, knobs: Knobs) -> None:
        """``tokenizer``: the HF tokenizer the server already loaded from ``tokenizer_dir`` (for its chat template)."""
        self.knobs = knobs
        self.tok = TextTokenizer(tokenizer, model_dir=tokenizer_dir, add_special_tokens=knobs.add_special_tokens,
                                 chat_mode=chat_mode_from_params(knobs.chat or {}))
        self.traits = tokenizer_traits(self.tok.hf)

    def request(self, params: GenerationParams, prompt: str, stream: bool):
        """(tensorrt_llm inputs, requested outputs, Sequences) of one request, or ApiError 400 as the BLS refuses."""
        arrays = {name: array for name, (array, _) in params.arrays(prompt, stream).items()}
        try:
            req = B.parse_request(arrays, None, vocab_size=len(self.tok.hf))
            pre = preprocess(self.tok, B.preprocessing_inputs(req), in_context_words=self.knobs.stop_words_in_context)
        except (InvalidInput, ValueError) as e:
            raise ApiError(400, B.client_message(str(e))) from None
        ids = B.prompt_ids(pre)
        seqs = Sequences(req.num_return_sequences, lambda index: LT.generation_for(
            self.tok.hf, req, ids, skip_special_tokens=self.knobs.skip_special_tokens, traits=self.traits,
            include_stop_words=self.knobs.include_stop_words, sequence_index=index))
        return B.llm_inputs(req, pre, stream=True), B.llm_outputs(req, self.knobs.engine_finish_reason), seqs


def grpc_request(inputs: dict[str, np.ndarray], outputs: list[str], request_id: str,
                 timeout_us: int | None) -> dict[str, Any]:
    """tritonclient's stream_infer request for tensorrt_llm (the contract's dtypes)."""
    tensors = []
    for name, value in inputs.items():
        array = np.asarray(value)
        t = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        t.set_data_from_numpy(array)
        tensors.append(t)
    request = {"model_name": C.TENSORRT_LLM, "inputs": tensors, "request_id": request_id,
               "outputs": [grpcclient.InferRequestedOutput(n) for n in outputs],
               "parameters": {"triton_enable_empty_final_response": True}}
    if ERROR_OUTPUTS[0] in outputs:  # our tensorrt_llm (B.llm_outputs): its failures as data
        request["parameters"][ERRORS_AS_DATA] = True
    if timeout_us:
        request["timeout"] = timeout_us
    return request


def chunks_of(seqs: Sequences, arrays: dict[str, np.ndarray]) -> list[Chunk]:
    """The client chunks of one tensorrt_llm response (what the BLS would have sent for it)."""
    return [chunk_from(chunk.arrays().get) for chunk, _final in seqs.on_response(arrays) if not chunk.empty]
