"""Throughput of the `tensorrt_llm` model through a real tritonserver: B concurrent gRPC streams of
token-id prompts, output tokens / wall time. The server gets a throwaway repository whose config is the
rendered one with the checkpoint, dtype and capacity overridden."""
from __future__ import annotations

import os
import queue
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _repository(model_dir: str, dtype: str, batch: int, seq: int) -> str:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    tmp = tempfile.mkdtemp(prefix="bench-repo-")
    dst = os.path.join(tmp, "tensorrt_llm")
    os.makedirs(os.path.join(dst, "1"))
    cfg = model_config_pb2.ModelConfig()
    with open(os.path.join(ROOT, "model_repository", "tensorrt_llm", "config.pbtxt")) as f:
        text_format.Parse(f.read(), cfg)
    overrides = {"gpt_model_path": os.path.abspath(model_dir), "engine_dtype": dtype,
                 "max_tokens_in_paged_kv_cache": str(batch * seq + 256), "max_num_sequences": str(batch),
                 "max_num_tokens": "2048", "lora_adapters": ""}
    for k, v in overrides.items():
        cfg.parameters[k].string_value = v
    cfg.max_batch_size = max(cfg.max_batch_size, batch)
    with open(os.path.join(dst, "config.pbtxt"), "w") as f:
        f.write(text_format.MessageToString(cfg))
    return tmp


def triton_e2e(model_dir: str, dtype: str, batch: list[list[int]], new: int) -> float:
    import tritonclient.grpc as grpcclient

    sys.path.insert(0, os.path.join(ROOT, "backends"))
    from tritonllm.serving.launcher import TritonServer, find_free_ports

    repo = _repository(model_dir, dtype, len(batch), len(batch[0]) + new)
    ports = find_free_ports(3)
    server = TritonServer(*ports, repositories=[repo], log_path=os.path.join(repo, "server.log"))
    server.start(timeout=300)
    try:
        client = grpcclient.InferenceServerClient(f"localhost:{ports[1]}")
        done: queue.Queue = queue.Queue()
        counts = [0]

        def callback(result, error):
            if error is not None:
                done.put(error)
                return
            counts[0] += int(result.as_numpy("sequence_length").reshape(-1)[0])
            if result.get_response().parameters["triton_final_response"].bool_param:
                done.put(None)

        client.start_stream(callback=callback)

        def send(prompt, rid):
            inputs = []
            for name, arr in (("input_ids", np.array([prompt], np.int32)),
                              ("input_lengths", np.array([[len(prompt)]], np.int32)),
                              ("request_output_len", np.array([[new]], np.int32)),
                              ("end_id", np.array([[-1]], np.int32))):
                t = grpcclient.InferInput(name, list(arr.shape), "INT32")
                t.set_data_from_numpy(arr)
                inputs.append(t)
            client.async_stream_infer("tensorrt_llm", inputs, request_id=rid)

        send(batch[0], "warmup")
        if (err := done.get(timeout=600)) is not None:
            raise RuntimeError(err)
        counts[0] = 0
        t = time.perf_counter()
        for i, p in enumerate(batch):
            send(p, str(i))
        for _ in batch:
            if (err := done.get(timeout=600)) is not None:
                raise RuntimeError(err)
        rate = counts[0] / (time.perf_counter() - t)
        client.stop_stream()
        return rate
    finally:
        server.stop()
        shutil.rmtree(repo, ignore_errors=True)
