"""vLLM's guided-decoding options -> the engine's (guide type, guide). The OpenAI server (its guided_* extras) and
the Dynamo worker (sampling_options.guided_decoding) convert with this one function; no torch, no Triton, so the
OpenAI server imports it without the engine."""
from __future__ import annotations

import json
import re

from .errors import InvalidInput

VLLM_GUIDES = {"json": "json_schema", "regex": "regex", "choice": "regex", "grammar": "ebnf_grammar"}


def vllm_guide(**given) -> tuple[str, str] | None:
    """vLLM's guided-decoding fields (its ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
    ``guided_grammar`` extras, Dynamo's ``sampling_options.guided_decoding``), at most one set, -> the engine's
    (guide type, guide): a JSON schema (object or text) as json_schema, a choice as the regex of its escaped
    alternatives, a grammar as EBNF. InvalidInput naming the field otherwise."""
    set_ = {k: v for k, v in given.items() if v is not None}
    unknown = sorted(set(set_) - set(VLLM_GUIDES))
    if unknown:
        raise InvalidInput(f"guided decoding {unknown[0]!r} is not supported (supported: {', '.join(VLLM_GUIDES)})")
    if len(set_) > 1:
        raise InvalidInput(f"give one guided decoding field, got {sorted(set_)}")
    if not set_:
        return None
    (name, value), = set_.items()
    if name == "json":
        return "json_schema", value if isinstance(value, str) else json.dumps(value)
    if name == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise InvalidInput("guided choice needs a non-empty list of strings")
        return "regex", "|".join(re.escape(c) for c in value)
    if not isinstance(value, str):
        raise InvalidInput(f"guided {name} must be a string")
    return VLLM_GUIDES[name], value
