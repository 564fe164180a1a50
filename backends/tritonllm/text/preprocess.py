"""The `preprocessing` step as plain numpy: NVIDIA's input tensors in, NVIDIA's output tensors out.

Inputs (batch dim first, as Triton delivers them with max_batch_size > 0): QUERY (BYTES [B, 1]),
REQUEST_OUTPUT_LEN (INT32 [B, 1]); optional BAD_WORDS_DICT / STOP_WORDS_DICT (BYTES [B, K], one word
per element), EMBEDDING_BIAS_WORDS (BYTES [B, K]) + EMBEDDING_BIAS_WEIGHTS (FP32 [B, K]),
END_ID / PAD_ID (INT32 [B, 1]).
Outputs: INPUT_ID (INT32 [B, L], right-padded with the pad id), REQUEST_INPUT_LEN (INT32 [B, 1]),
DECODER_INPUT_ID (INT32 [B, 1] of the pad id) and REQUEST_DECODER_INPUT_LEN (INT32 [B, 1] of 1), which
NVIDIA's preprocessing emits for a decoder-only model and the engine ignores,
BAD_WORDS_IDS / STOP_WORDS_IDS (INT32 [B, 2, N], TensorRT-LLM word lists; N may be 0),
EMBEDDING_BIAS (FP32 [B, V] or [B, 0] when no bias words), REQUEST_OUTPUT_LEN (INT32 [B, 1]),
OUT_END_ID / OUT_PAD_ID (INT32 [B, 1]); ENSEMBLE_NAMES (BOOL [B, 1], true; ours, see contract.ENGINE_WIRING).

Invariants: every rejection is ``InvalidInput`` (a ValueError) whose message starts with the name of
the offending input; nothing here imports Triton. Stop words become token-level word lists so the
engine ends generation (encoded in context, see ``word_lists``); cutting the exact stop string out of
the text is the BLS's job (``stop_strings``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import InvalidInput  # noqa: F401  (re-exported: the text steps' bad input)
from .tokenizer import TextTokenizer
from .word_lists import parse_words, stack_word_lists, words_to_word_list



def _text(value: object, name: str) -> str:
    if isinstance(value, (bytes, bytearray, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidInput(f"{name} is not valid UTF-8: {e.reason} at byte {e.start}") from None
    if isinstance(value, str):
        return value
    raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")


def _rows(arr: np.ndarray | None, name: str, batch: int) -> np.ndarray | None:
    """``arr`` as [batch, -1], or None; a batch size that differs from QUERY's is an error."""
    if arr is None:
        return None
    arr = np.asarray(arr)
    if arr.ndim == 0 or arr.shape[0] != batch:
        raise InvalidInput(f"{name} must have batch size {batch} (like QUERY), got shape {list(arr.shape)}")
    return arr.reshape(batch, -1)


def _ids_column(arr: np.ndarray | None, name: str, batch: int, default: int) -> np.ndarray:
    rows = _rows(arr, name, batch)
    if rows is None:
        return np.full((batch, 1), default, dtype=np.int32)
    if rows.shape[1] != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise InvalidInput(f"{name} must be one integer per request, got {rows.dtype} {list(rows.shape)}")
    return rows.astype(np.int32)


def _word_lists(tok: TextTokenizer, arr: np.ndarray | None, name: str, batch: int, in_context: bool) -> np.ndarray:
    rows = _rows(arr, name, batch)
    if rows is None:
        return np.zeros((batch, 2, 0), dtype=np.int32)
    try:
        return stack_word_lists([words_to_word_list(tok.encode_plain, row, what=name, in_context=in_context)
                                 for row in rows])
    except InvalidInput:
        raise
    except ValueError as e:
        raise InvalidInput(str(e) if str(e).startswith(name) else f"{name}: {e}") from None


def _embedding_bias(tok: TextTokenizer, words: np.ndarray | None, weights: np.ndarray | None, batch: int) -> np.ndarray:
    if words is None and weights is None:
        return np.zeros((batch, 0), dtype=np.float32)
    if words is None or weights is None:
        raise InvalidInput("EMBEDDING_BIAS_WORDS and EMBEDDING_BIAS_WEIGHTS must be given together")
    w_rows = _rows(words, "EMBEDDING_BIAS_WORDS", batch)
    f_rows = _rows(weights, "EMBEDDING_BIAS_WEIGHTS", batch).astype(np.float32)
    if w_rows.shape != f_rows.shape:
        raise InvalidInput(f"EMBEDDING_BIAS_WEIGHTS must have one weight per word: {list(f_rows.shape)} "
                           f"vs EMBEDDING_BIAS_WORDS {list(w_rows.shape)}")
    bias = np.zeros((batch, tok.vocab_size), dtype=np.float32)
    for b in range(batch):
        for raw, weight in zip(w_rows[b], f_rows[b]):
            for word in parse_words([raw], "EMBEDDING_BIAS_WORDS"):
                bias[b, tok.encode_plain(word)] += weight
    return bias


def preprocess(tok: TextTokenizer, inputs: Mapping[str, np.ndarray | None], *, in_context_words: bool = True) -> dict[str, np.ndarray]:
    """One request's input arrays -> its output arrays (see module docstring)."""
    query = inputs.get("QUERY")
    if query is None:
        raise InvalidInput("QUERY is required")
    query = np.asarray(query, dtype=object)
    if query.ndim == 0 or query.shape[0] == 0:
        raise InvalidInput(f"QUERY must have shape [batch, 1], got {list(query.shape)}")
    batch = query.shape[0]
    query = query.reshape(batch, -1)
    if query.shape[1] != 1:
        raise InvalidInput(f"QUERY must hold one string per request, got shape {list(query.shape)}")
    if inputs.get("REQUEST_OUTPUT_LEN") is None:
        raise InvalidInput("REQUEST_OUTPUT_LEN is required")
    out_len = _ids_column(inputs.get("REQUEST_OUTPUT_LEN"), "REQUEST_OUTPUT_LEN", batch, 0)
    if (out_len <= 0).any():
        raise InvalidInput(f"REQUEST_OUTPUT_LEN must be > 0, got {int(out_len.min())}")

    prompts: list[list[int]] = []
    for b in range(batch):
        name = "QUERY" if batch == 1 else f"QUERY[{b}]"
        try:
            prompts.append(tok.encode_prompt(_text(query[b, 0], name)).ids)
        except InvalidInput:
            raise
        except ValueError as e:
            raise InvalidInput(f"{name}: {e}") from None

    end_id = _ids_column(inputs.get("END_ID"), "END_ID", batch, tok.eos_id)
    pad_id = _ids_column(inputs.get("PAD_ID"), "PAD_ID", batch, tok.pad_id)
    width = max(len(p) for p in prompts)
    input_id = np.empty((batch, width), dtype=np.int32)
    for b, p in enumerate(prompts):
        input_id[b, : len(p)] = p
        input_id[b, len(p):] = pad_id[b, 0]
    return {
        "INPUT_ID": input_id,
        "REQUEST_INPUT_LEN": np.array([[len(p)] for p in prompts], dtype=np.int32),
        "BAD_WORDS_IDS": _word_lists(tok, inputs.get("BAD_WORDS_DICT"), "BAD_WORDS_DICT", batch, in_context_words),
        "STOP_WORDS_IDS": _word_lists(tok, inputs.get("STOP_WORDS_DICT"), "STOP_WORDS_DICT", batch, in_context_words),
        "EMBEDDING_BIAS": _embedding_bias(tok, inputs.get("EMBEDDING_BIAS_WORDS"),
                                          inputs.get("EMBEDDING_BIAS_WEIGHTS"), batch),
        "REQUEST_OUTPUT_LEN": out_len,
        "OUT_END_ID": end_id,
        "OUT_PAD_ID": pad_id,
        "DECODER_INPUT_ID": pad_id.copy(),
        "REQUEST_DECODER_INPUT_LEN": np.ones((batch, 1), dtype=np.int32),
        "ENSEMBLE_NAMES": np.ones((batch, 1), dtype=np.bool_),
    }
