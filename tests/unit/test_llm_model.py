"""The shared Triton part of `tensorrt_llm` (tritonllm.serving.llm_model) through the real thin adapter
backends/trtllm_llmapi/model.py, with a fake triton_python_backend_utils and the RECORDING STAND-IN for
tensorrt_llm (tests/unit/llmapi_standin.py; not TensorRT-LLM): the rendered llmapi config loads, responses
carry our tensor contract (output_ids, request_key, is_final), stop requests and client cancellation abort
the LLM API request, errors map to Triton codes, metrics are published. Our engine's path through the
same module is covered by the integration tests (tests/integration/test_engine_server.py, ...)."""
from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[2]

import llmapi_standin as S  # noqa: E402
from tritonllm.serving.generator import GeneratorBackend  # noqa: E402

FINAL = 1


def fake_pb_utils(log: list) -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    pb.Logger = types.SimpleNamespace(**{f"log_{k}": (lambda k: lambda m: log.append((k, m)))(k)
                                         for k in ("info", "warn", "error", "verbose")})

    class Metric:
        def __init__(self, labels=None, buckets=None):
            self.labels, self.value = labels, 0.0

        def increment(self, v):
            self.value += v

        def set(self, v):
            self.value = v

        def observe(self, v):
            self.value += v

    class MetricFamily:
        COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
        made: dict = {}

        def __init__(self, name, description, kind):
            self.name = name

        def Metric(self, labels=None, buckets=None):  # noqa: N802 (Triton's name)
            m = Metric(labels, buckets)
            MetricFamily.made.setdefault(self.name, []).append(m)
            return m

    pb.MetricFamily = MetricFamily
    pb.using_decoupled_model_transaction_policy = (
        lambda cfg: cfg.get("model_transaction_policy", {}).get("decoupled", False))

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def as_numpy(self):
            return self.array

    pb.Tensor = Tensor
    pb.get_input_tensor_by_name = lambda req, name: Tensor(name, req.inputs[name]) if name in req.inputs else None

    class TritonError:
        INVALID_ARG, UNAVAILABLE, INTERNAL, CANCELLED = "INVALID_ARG", "UNAVAILABLE", "INTERNAL", "CANCELLED"

        def __init__(self, message, code):
            self.message, self.code = message, code

    pb.TritonError = TritonError
    pb.InferenceResponse = lambda output_tensors=None, error=None: types.SimpleNamespace(
        tensors={t.name: t.array for t in output_tensors or []}, error=error)
    return pb


class Sender:
    def __init__(self):
        self.responses, self.cancelled, self.cv = [], False, threading.Condition()

    def send(self, response=None, flags=0):
        with self.cv:
            self.responses.append((response, flags))
            self.cv.notify_all()

    def is_cancelled(self):
        return self.cancelled

    def final(self, timeout=5.0):
        with self.cv:
            assert self.cv.wait_for(lambda: any(f == FINAL for _, f in self.responses), timeout)
        return self.responses


class Request:
    def __init__(self, inputs, rid="", parameters=None):
        self.inputs, self._rid, self.sender, self._parameters = inputs, rid, Sender(), parameters or {}

    def parameters(self):
        return json.dumps(self._parameters)

    def requested_output_names(self):  # Triton marks every output requested when a client names none
        cfg = text_format.Parse((ROOT / "model_repository/tensorrt_llm/configs/llmapi.pbtxt").read_text(), mc.ModelConfig())
        return [o.name for o in cfg.output]

    def get_response_sender(self):
        return self.sender

    def request_id(self):
        return self._rid


def row(ids, out_len=4, **extra):
    inputs = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
              "request_output_len": np.array([[out_len]], np.int32)}
    inputs.update({k: np.array([[v]]) for k, v in extra.items()})
    return inputs


@pytest.fixture()
def model(monkeypatch):
    rec = S.install(monkeypatch)
    log: list = []
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb_utils(log))
    spec = importlib.util.spec_from_file_location("trtllm_llmapi_model", ROOT / "backends/trtllm_llmapi/model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = text_format.Parse((ROOT / "model_repository/tensorrt_llm/configs/llmapi.pbtxt").read_text(), mc.ModelConfig())
    cfg.parameters["hf_model_id"].string_value = "nvidia/Llama-3.1-8B-Instruct-FP8"  # no checkout path needed
    cfg.parameters["max_queue_size"].string_value = "0"
    config = json_format.MessageToDict(cfg, preserving_proto_field_name=True)
    m = module.TritonPythonModel()
    m.initialize({"model_config": json.dumps(config), "model_name": "tensorrt_llm", "model_version": "1",
                  "model_repository": str(ROOT / "model_repository/tensorrt_llm")})
    m.rec, m.log = rec, log
    yield m
    m.finalize()


def test_the_rendered_config_loads_the_llm_api_backend(model):
    assert isinstance(model.backend, GeneratorBackend)
    (kw,) = model.rec.llm_kwargs
    assert kw["model"] == "nvidia/Llama-3.1-8B-Instruct-FP8" and kw["backend"] == "pytorch"
    assert kw["kv_cache_config"].kwargs["dtype"] == "fp8"
    assert any(k == "info" and "tensorrt_llm: engine ready (nvidia/Llama" in m and m.endswith("decoupled)")
               for k, m in model.log)


def test_a_stream_answers_deltas_with_our_tensor_contract(model):
    model.rec.scripts.append([{"ids": [5, 6]}, {"ids": [7, S.EOS], "finish": "stop", "done": True}])
    req = Request(row([1, 3, 4], streaming=True, return_num_output_tokens=True), rid="s1")
    model.execute([req])
    responses = req.sender.final()
    assert [r.error for r, _ in responses] == [None, None] and [f for _, f in responses] == [0, FINAL]
    assert [r.tensors["output_ids"].tolist() for r, _ in responses] == [[[[5, 6]]], [[[7]]]]
    assert [r.tensors["is_final"].item() for r, _ in responses] == [False, True]
    assert len({r.tensors["request_key"].item() for r, _ in responses}) == 1
    assert responses[-1][0].tensors["num_output_tokens"].item() == 1


def test_a_stop_request_ends_the_target_and_aborts_the_llm_request(model):
    model.rec.scripts.append([{"ids": [5]}, "hold"])
    target = Request(row([1, 2], out_len=50), rid="abc")
    model.execute([target])
    assert model.rec.holding.wait(5)  # the target answered [5] and waits: the stop finds it running
    stop = Request({"stop": np.array([[True]])}, rid="abc")
    model.execute([stop])
    assert stop.sender.final()[-1][0].error is None
    (response, flags), = target.sender.final()
    assert response.error is None and response.tensors["output_ids"].tolist() == [[[5]]] and flags == FINAL
    assert model.rec.aborts == [1]


def test_client_cancellation_answers_cancelled(model):
    model.rec.scripts.append(["hold"])
    req = Request(row([1, 2], out_len=50), rid="c")
    model.execute([req])
    req.sender.cancelled = True
    (response, _), = req.sender.final()
    assert response.error.code == "CANCELLED" and model.rec.aborts == [1]


def test_errors_map_to_triton_codes(model):
    bad = Request(row([1, 2], lora_task_id=np.uint64(1)))
    beam = Request(row([1, 2], beam_width=np.int32(2)))
    model.rec.scripts += [["hold"]] * 64
    full = [Request(row([1])) for _ in range(65)]  # llm_args max_batch_size 64, max_queue_size 0
    model.execute([bad, beam, *full])
    assert bad.sender.final()[0][0].error.code == "INVALID_ARG"
    assert bad.sender.responses[0][0].error.message.startswith("lora_task_id 1: LoRA adapters are not supported")
    assert beam.sender.final()[0][0].error.code == "INVALID_ARG"
    assert beam.sender.responses[0][0].error.message == "beam_width 2 is not supported (only 1)"
    err = full[-1].sender.final()[0][0].error
    assert err.code == "UNAVAILABLE" and err.message.startswith("Maximum queue size of 0 has been reached")
    for r in full[:-1]:
        r.sender.cancelled = True
    for r in full[:-1]:
        r.sender.final()


def test_failures_go_to_callers_of_ours_as_data_with_their_code(model):
    """Triton 2.51 hands a BLS caller every error as INTERNAL and a gRPC stream only its text: a caller of ours
    (request parameter errors_as_data) gets the failure as data, the code exact; anyone else a Triton error."""
    ours = {"errors_as_data": True}
    model.rec.scripts += [[RuntimeError("illegal memory access")], [RuntimeError("illegal memory access")]]
    crash, plain = Request(row([1, 2]), parameters=ours), Request(row([1, 2]))
    refused = Request(row([1, 2], beam_width=np.int32(2)), parameters=ours)
    model.execute([crash, plain, refused])

    def data(request):
        (response, flags), = request.sender.final()
        assert flags == FINAL and response.error is None
        return {k: v.reshape(-1)[0].decode() for k, v in response.tensors.items()}

    got = data(crash)
    assert got["error_code"] == "INTERNAL" and "illegal memory access" in got["error_message"]
    assert plain.sender.final()[0][0].error.code == "INTERNAL"
    assert data(refused) == {"error_code": "INVALID_ARG", "error_message": "beam_width 2 is not supported (only 1)"}


def test_metrics_follow_the_llm_api_stats(model):
    model.rec.stats.append([{"iter": 3, "iterLatencyMS": 10.0, "numActiveRequests": 1, "maxNumActiveRequests": 64,
                             "kvCacheStats": {"maxNumBlocks": 10, "usedNumBlocks": 5, "freeNumBlocks": 5},
                             "inflightBatchingStats": {"numScheduledRequests": 1}}])
    model.rec.scripts.append([{"ids": [5], "finish": "length", "done": True}])
    req = Request(row([1, 2], out_len=1))
    model.execute([req])
    req.sender.final()
    families = sys.modules["triton_python_backend_utils"].MetricFamily.made
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kv = [m for m in families["nv_trt_llm_kv_cache_block_metrics"] if m.labels["kv_cache_block_type"] == "fraction"]
        logged = any(k == "verbose" and '"Iteration Counter": 3' in m for k, m in model.log)
        if kv[-1].value == 0.5 and families["llm_generation_tokens_total"][-1].value == 1 and logged:
            break
        time.sleep(0.02)
    assert kv[-1].value == 0.5 and families["llm_generation_tokens_total"][-1].value == 1
    assert any(k == "verbose" and '"Iteration Counter": 3' in m for k, m in model.log)


def test_a_reply_carries_only_the_outputs_the_caller_asked_for(model):
    """Python_backend r24.10 drops unrequested outputs inside send() without the GIL, which corrupts the stub's heap
    (triton_kit.requested_outputs): replies never carry them."""
    model.rec.scripts.append([{"ids": [7, 8], "lps": [-0.5, -0.25], "finish": "length", "done": True}])
    request = Request(row([1, 2], out_len=2))
    request.requested_output_names = lambda: ["output_ids", "sequence_length"]
    model.execute([request])
    (response, flags), = request.sender.final()
    assert flags == FINAL and set(response.tensors) == {"output_ids", "sequence_length"}


def test_a_final_response_that_cannot_be_sent_still_ends_the_stream(model):
    """A send that fails (a fault between the stub and the server) is logged, and a final one is followed by the
    final flag alone: the caller (an ensemble step, the BLS, a gRPC stream) must not wait forever."""
    model.rec.scripts.append([{"ids": [5]}, {"ids": [7], "finish": "length", "done": True}])
    req = Request(row([1, 3], streaming=True), rid="f")
    deliver = req.sender.send

    def send(response=None, flags=0):
        if flags == FINAL and response is not None:
            raise RuntimeError("shared memory exhausted")
        deliver(response, flags)

    req.sender.send = send
    model.execute([req])
    responses = req.sender.final()
    assert [f for _, f in responses] == [0, FINAL] and responses[-1][0] is None
    assert any(k == "error" and "(final) for" in m and "was not sent: shared memory exhausted" in m for k, m in model.log)
