"""Text side of the LLM pipeline (no Triton imports): tokenizer + chat template (``tokenizer``),
stop/bad word lists (``word_lists``), exact incremental detokenization (``detokenizer``), stop strings
(``stop_strings``), per-stream detokenizer state (``stream_registry``), and the numpy-level
``preprocessing`` / ``postprocessing`` steps (``preprocess``, ``postprocess``) that the thin Triton
adapters backends/tokenizer and backends/detokenizer call."""
