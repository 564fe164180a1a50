"""TensorRT-LLM's LLM API as a generator backend of the ``tensorrt_llm`` model (profile ``llmapi``).

``names`` holds every tensorrt_llm name used (with its NVIDIA source), ``llmapi_runner`` calls the LLM API,
``llmapi_outputs`` converts its results, ``llmapi_settings`` builds the runner from config parameters.
Nothing here imports tensorrt_llm at import time.
"""
