"""Client tools for the served models (CLI, OpenAI-compatible front end, examples).

A package so that ``python -m clients.openai_server`` and ``from clients.triton_llm import ...`` work from
the repository root; the scripts in here also run directly (``python clients/llm_client.py``).
"""
