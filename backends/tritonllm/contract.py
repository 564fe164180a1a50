"""Tensor contracts of the LLM pipeline: one source of truth for names, dtypes, dims and optional flags.

The names, dtypes, dims, ``optional`` and ``reshape`` of ``tensorrt_llm``, ``preprocessing``,
``postprocessing`` and of the client-facing ``ensemble`` / ``tensorrt_llm_bls`` are NVIDIA's
(TensorRT-LLM ``triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt``), so NVIDIA's clients,
genai-perf ``--backend tensorrtllm`` and the GPU profile (``backend: "tensorrtllm"``) work unchanged.

Invariants:
- Only the decoder-only text subset is declared. Left out on purpose (encoder-decoder, multimodal,
  p-tuning, disaggregated serving, KV retention, lookahead, draft logits): encoder_input_features,
  encoder_output_lengths, draft_logits, draft_acceptance_threshold, prompt_embedding_table,
  prompt_table_extra_ids, prompt_vocab_size, cross_attention_mask, mrope_*, context_phase_params,
  skip_cross_attn_blocks, retention_*, lookahead_*; and on the text side decoder_text_input /
  DECODER_QUERY, IMAGE_*, VIDEO_*, PROMPT_TABLE_EXTRA_ID. ``decoder_input_ids`` / ``_lengths`` *are*
  declared: NVIDIA's preprocessing always emits DECODER_INPUT_ID (``[[pad_id]]`` for a decoder-only
  model) and their ensemble always wires it; their backend ignores it unless the model is
  encoder-decoder, and so does our engine.
- ``nvidia=False`` marks the few tensors that are ours, not NVIDIA's (see ENGINE_WIRING); a profile
  serving NVIDIA's tensorrtllm backend drops them.
- ``${logits_datatype}`` in NVIDIA's templates is rendered as TYPE_FP32 (their default).
- Dims exclude the batch dimension: every model here has ``max_batch_size > 0``.
- ``reshape=()`` marks NVIDIA's ``reshape: { shape: [ ] }``: with it a batched scalar reaches the Python
  backend with shape ``[batch]``, without it ``[batch, 1]``. Adapters read scalars with
  ``array.reshape(-1)[0]`` so both work.
- Triton ensembles (2.51) tolerate a step leaving an output unproduced: a downstream *optional* input fed
  from it is simply absent, and an ensemble output fed from it is omitted from the response.

Library code: no Triton import. Dtypes are Triton config enum names (``TYPE_INT32``...).
"""
from __future__ import annotations

from .contract_llmapi import LLMAPI_INPUTS, LLMAPI_OUTPUTS
from .errors import ERROR_OUTPUTS as _ERROR_NAMES
from .tensor_spec import Tensor
from .tensor_spec import scalars as _scalars


# Model names (the ensemble's steps and the BLS's targets).
PREPROCESSING = "preprocessing"
TENSORRT_LLM = "tensorrt_llm"
POSTPROCESSING = "postprocessing"
ENSEMBLE = "ensemble"
BLS = "tensorrt_llm_bls"
PROMPT_GUARD = "prompt_guard"      # classical text classifier (build_scripts/build_classical.py)
ROUTER = "llm_router"              # BLS cascade: prompt_guard picks refuse / small / large LLM slot
MODERATED = "moderated_llm"        # BLS (llm_router, mode moderate): ensemble + prompt_guard, both answers
LLMAPI = "llmapi"                  # NVIDIA's LLM-API text contract (contract_llmapi.py), served by the BLS
# Models whose transaction policy is NVIDIA's `decoupled_mode` (deployment.yaml llm.decoupled_mode); the
# ensemble follows its tensorrt_llm step. The routers stream whatever they relay and stay decoupled.
DECOUPLED_MODE_MODELS = (TENSORRT_LLM, BLS, LLMAPI)

# --------------------------------------------------------------------------- tensorrt_llm
# Not NVIDIA's: request options of our engine that NVIDIA's tensorrt_llm model has no input for (TensorRT-LLM
# has them in its LLM API / executor): how many most likely alternatives to return per generated token
# (OpenAI's top_logprobs, TensorRT-LLM SamplingParams.logprobs), and the executor's request priority in
# [0, 1], higher first (default 0.5). The BLS takes them from the client too; the GPU profile drops them.
# The most sequences one request may ask for (num_return_sequences): tensorrt_llm, the BLS and the OpenAI
# server's `n` refuse more.
MAX_RETURN_SEQUENCES = 16
ENGINE_REQUEST_INPUTS: tuple[Tensor, ...] = (
    Tensor("top_logprobs", "TYPE_INT32", (1,), optional=True, reshape=(), nvidia=False),
    Tensor("priority", "TYPE_FP32", (1,), optional=True, reshape=(), nvidia=False),
)
# ... and their outputs: per response [1, tokens, top_logprobs], the alternatives of each new token by
# descending log prob (present when top_logprobs > 0).
TOP_LOGPROB_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("top_log_probs", "TYPE_FP32", (-1, -1), nvidia=False),
    Tensor("top_log_prob_ids", "TYPE_INT32", (-1, -1), nvidia=False),
)

# Not NVIDIA's: an embedding, not generation (vLLM's pooling types "last" / "mean"; /v1/embeddings sends it): the
# engine computes the prompt only and answers once with the pooled final hidden states (engine/pooling.py).
POOLING_INPUT = Tensor("pooling", "TYPE_STRING", (1,), optional=True, nvidia=False)
EMBEDDING_OUTPUT = Tensor("embedding", "TYPE_FP32", (-1,), nvidia=False)

# Not NVIDIA's on this model (their LLM-API model's name): a PEFT adapter folder under the lora_root parameter, loaded
# at run time and cached under lora_task_id (engine/lora_loader.py); the BLS passes it on.
LORA_PATH_INPUT = Tensor("lora_path", "TYPE_STRING", (1,), optional=True, nvidia=False)

# input_ids is optional in NVIDIA's current config only because encoder-decoder models send
# encoder_input_features instead; the decoder-only engine answers INVALID_ARG when it is missing.
TENSORRT_LLM_INPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "TYPE_INT32", (-1,), optional=True, ragged=True),
    Tensor("decoder_input_ids", "TYPE_INT32", (-1,), optional=True, ragged=True),
    Tensor("input_lengths", "TYPE_INT32", (1,), reshape=()),
    Tensor("decoder_input_lengths", "TYPE_INT32", (1,), optional=True, reshape=()),
    Tensor("request_output_len", "TYPE_INT32", (1,), reshape=()),
    *_scalars("TYPE_INT32", "num_return_sequences"),
    Tensor("draft_input_ids", "TYPE_INT32", (-1,), optional=True, ragged=True),
    *_scalars("TYPE_INT32", "end_id pad_id"),
    Tensor("stop_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    Tensor("bad_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    Tensor("embedding_bias", "TYPE_FP32", (-1,), optional=True, ragged=True),
    *_scalars("TYPE_INT32", "beam_width"),
    *_scalars("TYPE_FP32", "temperature"),
    *_scalars("TYPE_INT32", "runtime_top_k"),
    *_scalars("TYPE_FP32", "runtime_top_p runtime_top_p_min runtime_top_p_decay"),
    *_scalars("TYPE_INT32", "runtime_top_p_reset_ids"),
    *_scalars("TYPE_FP32", "len_penalty"),
    *_scalars("TYPE_BOOL", "early_stopping"),
    *_scalars("TYPE_FP32", "repetition_penalty"),
    *_scalars("TYPE_INT32", "min_tokens"),
    *_scalars("TYPE_FP32", "beam_search_diversity_rate presence_penalty frequency_penalty"),
    *_scalars("TYPE_UINT64", "seed"),
    *_scalars("TYPE_BOOL", "return_log_probs return_context_logits return_generation_logits "
                           "return_perf_metrics return_num_input_tokens return_num_output_tokens "
                           "exclude_input_in_output stop streaming"),
    *_scalars("TYPE_UINT64", "lora_task_id"),
    Tensor("lora_weights", "TYPE_FP16", (-1, -1), optional=True, ragged=True),
    Tensor("lora_config", "TYPE_INT32", (-1, 3), optional=True, ragged=True),
    Tensor("guided_decoding_guide_type", "TYPE_STRING", (1,), optional=True, ragged=True),
    Tensor("guided_decoding_guide", "TYPE_STRING", (1,), optional=True, ragged=True),
    # Not NVIDIA's (see ENGINE_WIRING): the request comes through the ensemble, so errors also name the
    # ensemble's inputs ("request_output_len (max_tokens)"); a raw request gets our names only.
    Tensor("ensemble_names", "TYPE_BOOL", (1,), optional=True, reshape=(), nvidia=False),
    *ENGINE_REQUEST_INPUTS,
    POOLING_INPUT,
    LORA_PATH_INPUT,
)

# TensorRT-LLM's per-request perf metrics (return_perf_metrics), [1]-shaped outputs.
PERF_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
)

# Per-request statistics NVIDIA's backend returns as [1]-shaped outputs (ensemble passes them through).
_STAT_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("batch_index", "TYPE_INT32", (1,)),
    Tensor("sequence_index", "TYPE_INT32", (1,)),
    *PERF_OUTPUTS,
    Tensor("num_input_tokens", "TYPE_INT32", (1,)),
    Tensor("num_output_tokens", "TYPE_INT32", (1,)),
)

# Outputs the ensemble forwards unchanged from tensorrt_llm to the client.
_PASSTHROUGH_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("cum_log_probs", "TYPE_FP32", (-1,)),
    Tensor("output_log_probs", "TYPE_FP32", (-1, -1)),
    Tensor("context_logits", "TYPE_FP32", (-1, -1)),
    Tensor("generation_logits", "TYPE_FP32", (-1, -1, -1)),
    *_STAT_OUTPUTS,
)

# output_ids: [beam, tokens]; sequence_length: [beam]. In streaming mode each response carries the new
# tokens only; otherwise all generated tokens (plus the prompt unless exclude_input_in_output).
NVIDIA_TENSORRT_LLM_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "TYPE_INT32", (-1, -1)),
    Tensor("sequence_length", "TYPE_INT32", (-1,)),
    *_PASSTHROUGH_OUTPUTS,
)

# Not NVIDIA's: our engine (backend torchllm) also emits, on every response, a key unique to the engine
# request and whether this response is the sequence's last (a finished stream always ends with a data
# response carrying is_final=true, possibly of 0 tokens). Wired into postprocessing's REQUEST_KEY /
# IS_FINAL they make ensemble streaming exact without relying on client request ids. NVIDIA's tensorrtllm
# backend emits neither: a GPU profile must declare NVIDIA_TENSORRT_LLM_OUTPUTS and render the ensemble
# with ensemble_steps(engine_stream_keys=False); postprocessing then keys its state by request id.
ENGINE_STREAM_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("request_key", "TYPE_UINT64", (1,), nvidia=False),
    Tensor("is_final", "TYPE_BOOL", (1,), nvidia=False),
)

# Not NVIDIA's either: the response's text, decoded by the engine's responder exactly as the postprocessing
# step decodes it (the same incremental detokenizer, one per sequence). Sent to requests of our ensemble
# (they carry ensemble_names) whose step maps it, i.e. the two-step ensemble (ensemble_steps(text_in_llm=
# True)): one Python round trip per streamed token fewer than NVIDIA's three steps. Direct callers get none.
LLM_TEXT_OUTPUT = Tensor("text_output", "TYPE_STRING", (-1,), nvidia=False)

# Not NVIDIA's: why a sequence ended, on its last response ("stop": end id or stop word / string, "length":
# max_tokens, "timeout": the request's deadline, "abort": stopped or cancelled), "" on the others. Data, so that
# the BLS and the OpenAI front pass the engine's reason on instead of guessing it from token counts. NVIDIA's
# backend (GPU profile) has none: its clients then infer as before.
FINISH_REASON_OUTPUT = Tensor("finish_reason", "TYPE_STRING", (1,), nvidia=False)

# Not NVIDIA's: a failure as data, for our own callers only (errors.py: they set the request parameter
# errors_as_data, because Triton 2.51 loses error codes between models); everyone else gets Triton errors.
ERROR_OUTPUTS: tuple[Tensor, ...] = tuple(Tensor(name, "TYPE_STRING", (1,), nvidia=False) for name in _ERROR_NAMES)

TENSORRT_LLM_OUTPUTS: tuple[Tensor, ...] = (*NVIDIA_TENSORRT_LLM_OUTPUTS, *ENGINE_STREAM_OUTPUTS, *TOP_LOGPROB_OUTPUTS,
                                           LLM_TEXT_OUTPUT, FINISH_REASON_OUTPUT, EMBEDDING_OUTPUT, *ERROR_OUTPUTS)

# --------------------------------------------------------------------------- preprocessing (tokenizer)
# QUERY and REQUEST_OUTPUT_LEN: optional here, required by the step itself (see TEXT_INPUTS).
PREPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("QUERY", "TYPE_STRING", (1,), optional=True),
    Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,), optional=True),
    Tensor("BAD_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
    Tensor("STOP_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
    Tensor("EMBEDDING_BIAS_WORDS", "TYPE_STRING", (-1,), optional=True),
    Tensor("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", (-1,), optional=True),
    Tensor("END_ID", "TYPE_INT32", (1,), optional=True),
    Tensor("PAD_ID", "TYPE_INT32", (1,), optional=True),
)
PREPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("INPUT_ID", "TYPE_INT32", (-1,)),
    Tensor("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)),
    Tensor("DECODER_INPUT_ID", "TYPE_INT32", (-1,)),
    Tensor("REQUEST_DECODER_INPUT_LEN", "TYPE_INT32", (1,)),
    Tensor("BAD_WORDS_IDS", "TYPE_INT32", (2, -1)),
    Tensor("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
    Tensor("EMBEDDING_BIAS", "TYPE_FP32", (-1,)),
    Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (-1,)),
    Tensor("OUT_END_ID", "TYPE_INT32", (1,)),
    Tensor("OUT_PAD_ID", "TYPE_INT32", (1,)),
    Tensor("ENSEMBLE_NAMES", "TYPE_BOOL", (1,), nvidia=False),  # see ENGINE_WIRING
    *ERROR_OUTPUTS,
)

# --------------------------------------------------------------------------- postprocessing (detokenizer)
POSTPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("TOKENS_BATCH", "TYPE_INT32", (-1, -1)),
    Tensor("SEQUENCE_LENGTH", "TYPE_INT32", (-1,)),
    # Not NVIDIA's (see ENGINE_STREAM_OUTPUTS): optional, so NVIDIA's wiring without them still loads.
    Tensor("REQUEST_KEY", "TYPE_UINT64", (1,), optional=True, nvidia=False),
    Tensor("IS_FINAL", "TYPE_BOOL", (1,), optional=True, nvidia=False),
)
POSTPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("OUTPUT", "TYPE_STRING", (-1,)),
)

# --------------------------------------------------------------------------- ensemble / BLS (client-facing)
# text_input and max_tokens are required by NVIDIA and by our models, which refuse their absence by name
# ("QUERY (text_input) is required", "max_tokens is required"); they are declared optional, as are
# preprocessing's QUERY / REQUEST_OUTPUT_LEN, because Triton 2.51 does not check an ensemble's required
# inputs by name once a request has as many inputs as the ensemble requires: with max_tokens missing (and
# another input sent) the preprocessing step never ran and the ensemble answered "unexpected deadlock"
# (unary), an empty final response (decoupled), and on a triton_grpc_error stream the second such request
# crashed tritonserver (SIGSEGV, seen here). Left open by Triton: a request with none of preprocessing's
# inputs fails inside the ensemble ("request has 0 inputs"), which on a triton_grpc_error stream crashes
# 2.51 too after a few requests (docs/nvidia_clients.md).
TEXT_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (1,), optional=True),
    Tensor("max_tokens", "TYPE_INT32", (1,), optional=True),
    Tensor("num_return_sequences", "TYPE_INT32", (1,), optional=True),
    Tensor("bad_words", "TYPE_STRING", (-1,), optional=True),
    Tensor("stop_words", "TYPE_STRING", (-1,), optional=True),
    *_scalars("TYPE_BOOL", "exclude_input_in_output", reshape=None),
    *_scalars("TYPE_INT32", "end_id pad_id top_k", reshape=None),
    *_scalars("TYPE_FP32", "top_p temperature length_penalty repetition_penalty", reshape=None),
    *_scalars("TYPE_INT32", "min_tokens", reshape=None),
    *_scalars("TYPE_FP32", "presence_penalty frequency_penalty", reshape=None),
    *_scalars("TYPE_UINT64", "seed", reshape=None),
    *_scalars("TYPE_BOOL", "return_log_probs return_context_logits return_generation_logits "
                           "return_perf_metrics return_num_input_tokens return_num_output_tokens",
              reshape=None),
    *_scalars("TYPE_INT32", "beam_width", reshape=None),
    *_scalars("TYPE_BOOL", "stream", reshape=None),
    Tensor("embedding_bias_words", "TYPE_STRING", (-1,), optional=True),
    Tensor("embedding_bias_weights", "TYPE_FP32", (-1,), optional=True),
    *_scalars("TYPE_UINT64", "lora_task_id", reshape=None),
    Tensor("lora_weights", "TYPE_FP16", (-1, -1), optional=True, ragged=True),
    Tensor("lora_config", "TYPE_INT32", (-1, 3), optional=True, ragged=True),
    Tensor("guided_decoding_guide_type", "TYPE_STRING", (1,), optional=True, ragged=True),
    Tensor("guided_decoding_guide", "TYPE_STRING", (1,), optional=True, ragged=True),
)
TEXT_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    *_PASSTHROUGH_OUTPUTS,
)
# The BLS (ours, also on GPU hosts) takes more than NVIDIA's ensemble: the engine's request options, and
# OpenAI's logit_bias by token id (added to preprocessing's EMBEDDING_BIAS: the ensemble has only
# NVIDIA's bias by words); it returns the top log probs.
BLS_INPUTS: tuple[Tensor, ...] = (
    *TEXT_INPUTS,
    *(Tensor(t.name, t.dtype, t.dims, optional=True, nvidia=False) for t in ENGINE_REQUEST_INPUTS),
    LORA_PATH_INPUT,
    Tensor("logit_bias_ids", "TYPE_INT32", (-1,), optional=True, nvidia=False),
    Tensor("logit_bias_weights", "TYPE_FP32", (-1,), optional=True, nvidia=False),
)
# Not NVIDIA's: the ids of the tokens output_log_probs scores, one per log prob, same layout, on every chunk with
# log probs: the client names each token from its id, not by re-tokenizing (a stop string's cut defeats that).
LOGPROB_TOKEN_IDS = Tensor("output_token_ids", "TYPE_INT32", (-1, -1), nvidia=False)
BLS_OUTPUTS: tuple[Tensor, ...] = (*TEXT_OUTPUTS, LOGPROB_TOKEN_IDS, *TOP_LOGPROB_OUTPUTS, FINISH_REASON_OUTPUT,
                                   *ERROR_OUTPUTS)

# --------------------------------------------------------------------------- ensemble wiring (NVIDIA's)
# Internal tensors carry NVIDIA's names (leading underscore) so their ensemble reads the same.
# NVIDIA_ENSEMBLE_STEPS is their wiring; ENSEMBLE_STEPS adds the engine's stream keys (see below).
NVIDIA_ENSEMBLE_STEPS: tuple[tuple[str, dict[str, str], dict[str, str]], ...] = (
    (PREPROCESSING,
     {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "BAD_WORDS_DICT": "bad_words",
      "STOP_WORDS_DICT": "stop_words", "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
      "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights", "END_ID": "end_id", "PAD_ID": "pad_id"},
     {"REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN", "INPUT_ID": "_INPUT_ID",
      "REQUEST_DECODER_INPUT_LEN": "_REQUEST_DECODER_INPUT_LEN", "DECODER_INPUT_ID": "_DECODER_INPUT_ID",
      "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
      "BAD_WORDS_IDS": "_BAD_WORDS_IDS", "EMBEDDING_BIAS": "_EMBEDDING_BIAS",
      "OUT_END_ID": "_PREPROCESSOR_END_ID", "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID"}),
    (TENSORRT_LLM,
     {"input_ids": "_INPUT_ID", "decoder_input_ids": "_DECODER_INPUT_ID",
      "input_lengths": "_REQUEST_INPUT_LEN", "decoder_input_lengths": "_REQUEST_DECODER_INPUT_LEN",
      "exclude_input_in_output": "exclude_input_in_output", "request_output_len": "_REQUEST_OUTPUT_LEN",
      "end_id": "_PREPROCESSOR_END_ID", "pad_id": "_PREPROCESSOR_PAD_ID", "embedding_bias": "_EMBEDDING_BIAS",
      "runtime_top_k": "top_k", "runtime_top_p": "top_p", "temperature": "temperature",
      "len_penalty": "length_penalty", "repetition_penalty": "repetition_penalty", "min_tokens": "min_tokens",
      "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "seed": "seed",
      "return_log_probs": "return_log_probs", "return_context_logits": "return_context_logits",
      "return_generation_logits": "return_generation_logits", "return_perf_metrics": "return_perf_metrics",
      "return_num_input_tokens": "return_num_input_tokens",
      "return_num_output_tokens": "return_num_output_tokens", "num_return_sequences": "num_return_sequences",
      "beam_width": "beam_width", "streaming": "stream", "stop_words_list": "_STOP_WORDS_IDS",
      "bad_words_list": "_BAD_WORDS_IDS", "lora_task_id": "lora_task_id", "lora_weights": "lora_weights",
      "lora_config": "lora_config", "guided_decoding_guide_type": "guided_decoding_guide_type",
      "guided_decoding_guide": "guided_decoding_guide"},
     {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH",
      **{t.name: t.name for t in _PASSTHROUGH_OUTPUTS}}),
    (POSTPROCESSING,
     {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
     {"OUTPUT": "text_output"}),
)

# Our additions to NVIDIA's wiring, (source model, output, internal tensor, destination model, input):
# the engine's stream keys into postprocessing (exact streamed text), and preprocessing's ENSEMBLE_NAMES
# into tensorrt_llm (errors name the ensemble's inputs). Every tensor involved has nvidia=False.
ENGINE_WIRING: tuple[tuple[str, str, str, str, str], ...] = (
    (TENSORRT_LLM, "request_key", "_REQUEST_KEY", POSTPROCESSING, "REQUEST_KEY"),
    (TENSORRT_LLM, "is_final", "_IS_FINAL", POSTPROCESSING, "IS_FINAL"),
    (PREPROCESSING, "ENSEMBLE_NAMES", "_ENSEMBLE_NAMES", TENSORRT_LLM, "ensemble_names"),
)


def ensemble_steps(*, engine_stream_keys: bool = True,
                   text_in_llm: bool = False) -> tuple[tuple[str, dict[str, str], dict[str, str]], ...]:
    """The ensemble's steps. ``engine_stream_keys=False`` (an engine that does not emit request_key /
    is_final, e.g. NVIDIA's tensorrtllm backend in the GPU profile) gives NVIDIA's wiring unchanged.
    ``text_in_llm`` (our engine only): two steps, tensorrt_llm's ``text_output`` is the ensemble's, and no
    postprocessing step; the ensemble's inputs and outputs are the same."""
    if text_in_llm:
        pre, (llm, llm_in, llm_out), _ = ensemble_steps(engine_stream_keys=engine_stream_keys)
        out = {k: v for k, v in llm_out.items() if v in {t.name for t in TEXT_OUTPUTS}}  # not the internal ones
        return pre, (llm, llm_in, {**out, LLM_TEXT_OUTPUT.name: "text_output"})
    if not engine_stream_keys:
        return NVIDIA_ENSEMBLE_STEPS
    steps = []
    for model, input_map, output_map in NVIDIA_ENSEMBLE_STEPS:
        input_map, output_map = dict(input_map), dict(output_map)
        for src_model, src, internal, dst_model, dst in ENGINE_WIRING:
            if model == src_model:
                output_map[src] = internal
            elif model == dst_model:
                input_map[dst] = internal
        steps.append((model, input_map, output_map))
    return tuple(steps)


ENSEMBLE_STEPS = ensemble_steps()

# --------------------------------------------------------------------------- moderation / routing
# prompt_guard's tensors, as build_scripts/classical_configs.py derives them from its ONNX graph (a unit
# test compares them with the built config.pbtxt).
PROMPT_GUARD_LABELS = ("complex", "simple", "unsafe")  # scikit-learn's classes_ order (sorted)
PROMPT_GUARD_INPUTS: tuple[Tensor, ...] = (Tensor("text", "TYPE_STRING", (1,)),)
PROMPT_GUARD_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("label", "TYPE_STRING", (1,)),
    Tensor("probabilities", "TYPE_FP32", (len(PROMPT_GUARD_LABELS),)),
)
# prompt_guard output -> client output name, in moderated_llm and llm_router alike.
MODERATION_OUTPUT_NAMES: dict[str, str] = {"label": "moderation_label",
                                           "probabilities": "moderation_probabilities"}
MODERATION_OUTPUTS: tuple[Tensor, ...] = tuple(
    Tensor(MODERATION_OUTPUT_NAMES[t.name], t.dtype, t.dims) for t in PROMPT_GUARD_OUTPUTS)
# Not an ensemble step: Triton (2.49-2.51) refuses an ensemble whose outputs come from a decoupled step
# (tensorrt_llm) and from another step ("receives inputs originated from different decoupled models"),
# so moderated_llm / llm_router are BLS models (backends/llm_router).
# The routers' extra output: which way the request went (routing.Route.name).
ROUTE_OUTPUT = Tensor("route", "TYPE_STRING", (1,))

# Which tensors each model of the pipeline declares, by model name.
MODEL_TENSORS: dict[str, tuple[tuple[Tensor, ...], tuple[Tensor, ...]]] = {
    PREPROCESSING: (PREPROCESSING_INPUTS, PREPROCESSING_OUTPUTS),
    TENSORRT_LLM: (TENSORRT_LLM_INPUTS, TENSORRT_LLM_OUTPUTS),
    POSTPROCESSING: (POSTPROCESSING_INPUTS, POSTPROCESSING_OUTPUTS),
    ENSEMBLE: (TEXT_INPUTS, TEXT_OUTPUTS),
    BLS: (BLS_INPUTS, BLS_OUTPUTS),
    PROMPT_GUARD: (PROMPT_GUARD_INPUTS, PROMPT_GUARD_OUTPUTS),
    ROUTER: (TEXT_INPUTS, (*TEXT_OUTPUTS, ROUTE_OUTPUT, *MODERATION_OUTPUTS)),
    MODERATED: (TEXT_INPUTS, (*TEXT_OUTPUTS, ROUTE_OUTPUT, *MODERATION_OUTPUTS)),
    LLMAPI: (LLMAPI_INPUTS, LLMAPI_OUTPUTS),
}
UNBATCHED_MODELS = (LLMAPI,)  # max_batch_size 0, as NVIDIA's LLM-API model (dims below include no batch)


def batch_rows(arrays: dict, lead: str, error: type[Exception]) -> list[dict]:
    """A request's inputs (batch dim first) as rows of batch size 1, one per row of ``lead``; an input
    whose batch size differs from lead's raises ``error`` naming it. NVIDIA's backend slices a batch so."""
    batch = arrays[lead].shape[0]
    for name, arr in arrays.items():
        if arr.ndim == 0 or arr.shape[0] != batch:
            raise error(f"{name} must have batch size {batch} (like {lead}), got shape {list(arr.shape)}")
    return [{name: arr[i:i + 1] for name, arr in arrays.items()} for i in range(batch)]


def by_name(tensors: tuple[Tensor, ...]) -> dict[str, Tensor]:
    return {t.name: t for t in tensors}


def numpy_dtype(dtype: str) -> str:
    """Triton config enum -> numpy dtype name (TYPE_STRING -> object, as the Python backend uses)."""
    return {
        "TYPE_BOOL": "bool", "TYPE_UINT8": "uint8", "TYPE_INT32": "int32", "TYPE_INT64": "int64",
        "TYPE_UINT64": "uint64", "TYPE_FP16": "float16", "TYPE_FP32": "float32", "TYPE_STRING": "object",
    }[dtype]
