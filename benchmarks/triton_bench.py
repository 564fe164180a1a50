"""Throughput through a real tritonserver, output tokens / wall time with B concurrent gRPC requests:
- `triton_e2e`: the `tensorrt_llm` model, token-id prompts, one response per request;
- `ensemble_e2e`: text through `ensemble` (preprocessing -> tensorrt_llm -> postprocessing), streamed
  token by token (or not).
The server gets a throwaway repository whose configs are the rendered ones with the checkpoint, tokenizer,
dtype and capacity overridden."""
from __future__ import annotations

import contextlib
import os
import queue
import shutil
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_SOURCES = {"tensorrt_llm": "model_repository/tensorrt_llm", "preprocessing": "model_repository/preprocessing",
            "postprocessing": "model_repository/postprocessing", "ensemble": "ensembles/ensemble"}


def _repository(model_dir: str, dtype: str, batch: int, seq: int, text: bool = False,
                tokenizer_dir: str | None = None) -> str:
    """A throwaway repository (tensorrt_llm; with ``text`` the ensemble and its steps too) over the
    rendered configs, serving ``model_dir`` (tokenizer: ``tokenizer_dir``, default the checkpoint's)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    tmp = tempfile.mkdtemp(prefix="bench-repo-")
    model_dir = os.path.abspath(model_dir)
    for name in (_SOURCES if text else ["tensorrt_llm"]):
        dst = os.path.join(tmp, name)
        os.makedirs(os.path.join(dst, "1"))
        cfg = model_config_pb2.ModelConfig()
        with open(os.path.join(ROOT, _SOURCES[name], "config.pbtxt")) as f:
            text_format.Parse(f.read(), cfg)
        overrides = {"tokenizer_dir": os.path.abspath(tokenizer_dir or model_dir)}
        if name == "tensorrt_llm":
            overrides.update({"gpt_model_path": model_dir, "engine_dtype": dtype, "lora_adapters": "",
                              "max_tokens_in_paged_kv_cache": str(batch * seq + 256),
                              "max_num_sequences": str(batch), "max_num_tokens": "2048"})
        for k, v in overrides.items():
            if k in cfg.parameters or name == "tensorrt_llm":
                cfg.parameters[k].string_value = v
        cfg.max_batch_size = max(cfg.max_batch_size, batch)
        with open(os.path.join(dst, "config.pbtxt"), "w") as f:
            f.write(text_format.MessageToString(cfg))
    return tmp


@contextlib.contextmanager
def _served(repo: str):
    """A tritonserver over `repo` on free ports; yields its gRPC url; removes `repo` afterwards."""
    from tritonllm.serving.launcher import TritonServer, find_free_ports

    ports = find_free_ports(3)
    server = TritonServer(*ports, repositories=[repo], log_path=os.path.join(repo, "server.log"))
    server.start(timeout=300)
    try:
        yield f"localhost:{ports[1]}"
    finally:
        server.stop()
        shutil.rmtree(repo, ignore_errors=True)


def ensemble_e2e(model_dir: str, dtype: str, texts: list[str], new: int, stream: bool = True) -> float:
    """`model_dir` must hold a tokenizer too. Every request asks for exactly `new` tokens (end_id -1)."""
    import tritonclient.grpc as grpcclient

    with _served(_repository(model_dir, dtype, len(texts), 512 + new, text=True)) as url:
        client = grpcclient.InferenceServerClient(url)
        done: queue.Queue = queue.Queue()

        def callback(result, error):
            if error is not None:
                done.put(error)
            elif result.get_response().parameters["triton_final_response"].bool_param:
                done.put(None)

        client.start_stream(callback=callback)

        def send(text, rid):
            inputs = []
            for name, arr, dt in (("text_input", np.array([[text.encode()]], object), "BYTES"),
                                  ("max_tokens", np.array([[new]], np.int32), "INT32"),
                                  ("end_id", np.array([[-1]], np.int32), "INT32"),
                                  ("stream", np.array([[stream]], np.bool_), "BOOL")):
                t = grpcclient.InferInput(name, list(arr.shape), dt)
                t.set_data_from_numpy(arr)
                inputs.append(t)
            client.async_stream_infer("ensemble", inputs, request_id=rid, enable_empty_final_response=True)

        send(texts[0], "warmup")
        if (err := done.get(timeout=600)) is not None:
            raise RuntimeError(err)
        t = time.perf_counter()
        for i, text in enumerate(texts):
            send(text, str(i))
        for _ in texts:
            if (err := done.get(timeout=600)) is not None:
                raise RuntimeError(err)
        rate = len(texts) * new / (time.perf_counter() - t)
        client.stop_stream()
        return rate


def triton_e2e(model_dir: str, dtype: str, batch: list[list[int]], new: int) -> float:
    import tritonclient.grpc as grpcclient

    with _served(_repository(model_dir, dtype, len(batch), len(batch[0]) + new)) as url:
        client = grpcclient.InferenceServerClient(url)
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
