"""Error messages in the client's input names: an inner model's input (``QUERY``, ``request_output_len``,
``runtime_top_k``, ...) -> the ensemble / BLS input it is made from (``text_input``, ``max_tokens``,
``top_k``, ...), by NVIDIA's ensemble wiring (``contract.NVIDIA_ENSEMBLE_STEPS``).

An ensemble forwards a step's error verbatim, so ``with_client_names`` annotates the inner name with the
client's; the BLS, whose client never sees the inner models, replaces it (``to_client_names``).
Library code: no Triton import.
"""
from __future__ import annotations

import re

from .contract import NVIDIA_ENSEMBLE_STEPS

# Which client input each preprocessing output is made from (None: no client input; the decoder ids come
# from decoder_text_input, which this decoder-only contract does not declare).
_PRE_OUTPUT_SOURCE = {"INPUT_ID": "QUERY", "REQUEST_INPUT_LEN": "QUERY", "REQUEST_OUTPUT_LEN": "REQUEST_OUTPUT_LEN",
                      "STOP_WORDS_IDS": "STOP_WORDS_DICT", "BAD_WORDS_IDS": "BAD_WORDS_DICT",
                      "EMBEDDING_BIAS": "EMBEDDING_BIAS_WORDS", "OUT_END_ID": "END_ID", "OUT_PAD_ID": "PAD_ID",
                      "DECODER_INPUT_ID": None, "REQUEST_DECODER_INPUT_LEN": None}


def client_input_names() -> dict[str, str]:
    """Input name of preprocessing / tensorrt_llm -> the ensemble / BLS input it comes from, by NVIDIA's
    wiring (QUERY -> text_input, request_output_len -> max_tokens, runtime_top_k -> top_k, ...). Names
    that are the same on both sides, and ``streaming`` (set by the BLS itself), are left out."""
    pre_step, llm_step = NVIDIA_ENSEMBLE_STEPS[0], NVIDIA_ENSEMBLE_STEPS[1]
    pre_map = dict(pre_step[1])
    pre_out = {internal: out for out, internal in pre_step[2].items()}
    names = dict(pre_map)
    for dst, src in llm_step[1].items():
        if src not in pre_out:
            names[dst] = src
        elif _PRE_OUTPUT_SOURCE[pre_out[src]] is not None:
            names[dst] = pre_map[_PRE_OUTPUT_SOURCE[pre_out[src]]]
    return {k: v for k, v in names.items() if k != v and k != "streaming"}


_CLIENT_NAMES = client_input_names()
# Longest first, so that a name is never rewritten inside a longer one; an index ("[0]") travels along.
_NAME_PATTERNS = [(re.compile(rf"\b{re.escape(k)}\b(\[\d+\])?"), k, v)
                  for k, v in sorted(_CLIENT_NAMES.items(), key=lambda kv: -len(kv[0]))]


def with_client_names(message: str) -> str:
    """Annotate inner input names in an error message with the client's: ``request_output_len`` ->
    ``request_output_len (max_tokens)``, ``STOP_WORDS_DICT[0]`` -> ``STOP_WORDS_DICT[0] (stop_words[0])``.
    An ensemble forwards a step's error verbatim, so this is how its client learns which of *its*
    inputs was wrong. Idempotent."""
    for pattern, inner, client in _NAME_PATTERNS:
        def annotate(m, text=message, client=client):
            idx = m.group(1) or ""
            note = f" ({client}{idx})"
            return m.group(0) if text.startswith(note, m.end()) else m.group(0) + note
        message = pattern.sub(annotate, message)
    return message


def to_client_names(message: str) -> str:
    """Replace inner input names by the client's (for the BLS, whose client never sees the inner
    models): ``request_output_len`` and ``request_output_len (max_tokens)`` both become ``max_tokens``."""
    for pattern, inner, client in _NAME_PATTERNS:
        message = re.sub(rf"\b{re.escape(inner)}(\[\d+\])? \({re.escape(client)}(?(1)\1)\)",
                         lambda m, client=client: client + (m.group(1) or ""), message)
        message = pattern.sub(lambda m, client=client: client + (m.group(1) or ""), message)
    return message
