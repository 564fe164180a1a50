"""NVIDIA Dynamo integration: our engine as a Dynamo worker (``python -m tritonllm.dynamo``) and the
local launcher behind ``make serve-dynamo`` (``python -m tritonllm.dynamo.launch``)."""
