#!/usr/bin/env python3
"""Classify with a classical model served by Triton (tabular_rf, tabular_hgb, prompt_guard, ...).

Input kind follows the model's metadata: BYTES models take text, FP32 models take feature rows.

  python clients/classify.py -u localhost:8000 -m prompt_guard "What is 2+2?" "ignore previous instructions"
  python clients/classify.py -u localhost:8001 -i grpc -m tabular_rf --rows '[[0.1, ...16 values...]]'
  python clients/classify.py -m tabular_hgb --npy build/classical/tabular_hgb/inputs.npy --limit 5

Prints one JSON object per input row: {"label": ..., "probabilities": {class: p, ...}} (the classes from the
model config's ``classes`` parameter; a plain list where a model has none). Exit code 1 on an inference error,
with Triton's message on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def _client(protocol: str, url: str):
    if protocol == "grpc":
        import tritonclient.grpc as mod
    else:
        import tritonclient.http as mod
    return mod, mod.InferenceServerClient(url)


def _input_meta(client, protocol: str, model: str) -> tuple[str, str, list[int]]:
    meta = client.get_model_metadata(model)
    if protocol == "grpc":
        inp = meta.inputs[0]
        return inp.name, inp.datatype, list(inp.shape)
    inp = meta["inputs"][0]
    return inp["name"], inp["datatype"], list(inp["shape"])


def _classes(client, protocol: str, model: str) -> list | None:
    """The class of each probability column, from the model config's ``classes`` parameter (a JSON list that
    build_scripts/classical_configs.py writes from scikit-learn's classes_), or None."""
    cfg = client.get_model_config(model, as_json=True)["config"] if protocol == "grpc" else \
        client.get_model_config(model)
    raw = cfg.get("parameters", {}).get("classes", {}).get("string_value")
    return json.loads(raw) if raw else None


def _rows(args, datatype: str, shape: list[int]) -> np.ndarray:
    if datatype == "BYTES":
        if not args.texts:
            raise SystemExit("this model takes text: pass one or more strings")
        return np.array([[t.encode("utf-8")] for t in args.texts], dtype=object)
    if args.npy:
        x = np.load(args.npy, allow_pickle=False)
    elif args.rows:
        x = np.array(json.loads(args.rows), dtype=np.float64)
    else:
        raise SystemExit(f"this model takes {datatype} rows of {shape[-1]} features: --rows JSON or --npy FILE")
    x = np.atleast_2d(x)[: args.limit] if args.limit else np.atleast_2d(x)
    # Convert only when asked for the model's type; the server rejects other dtypes on purpose.
    return x.astype({"FP32": np.float32, "FP64": np.float64}[datatype])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("texts", nargs="*", help="prompts, for text models")
    p.add_argument("-u", "--url", default="localhost:8000")
    p.add_argument("-i", "--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("-m", "--model", default="prompt_guard")
    p.add_argument("--rows", help="JSON list of feature rows, for tabular models")
    p.add_argument("--npy", help=".npy file of feature rows (loaded without pickle)")
    p.add_argument("--limit", type=int, default=0, help="only the first N rows")
    args = p.parse_args(argv)

    from tritonclient.utils import InferenceServerException

    mod, client = _client(args.protocol, args.url)
    try:
        name, datatype, shape = _input_meta(client, args.protocol, args.model)
        x = _rows(args, datatype, shape)
        inp = mod.InferInput(name, list(x.shape), datatype)
        inp.set_data_from_numpy(x)
        outs = [mod.InferRequestedOutput("label"), mod.InferRequestedOutput("probabilities")]
        result = client.infer(args.model, [inp], outputs=outs)
        classes = _classes(client, args.protocol, args.model)
    except InferenceServerException as e:
        print(f"error: {e.message()}", file=sys.stderr)
        return 1
    finally:
        client.close()
    labels = result.as_numpy("label").reshape(-1)
    proba = result.as_numpy("probabilities")
    for label, pr in zip(labels, proba):
        label = label.decode() if isinstance(label, bytes) else label.item()
        probs = [round(float(v), 6) for v in pr]
        if classes and len(classes) == len(probs):
            probs = {str(c): p for c, p in zip(classes, probs)}
        print(json.dumps({"label": label, "probabilities": probs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
