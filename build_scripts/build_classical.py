#!/usr/bin/env python3
"""Train scikit-learn models on seeded local data, export to ONNX, write Triton configs + test data.

Models (all exported with ZipMap off, so every output is a plain tensor):
- tabular_rf   RandomForestClassifier, make_classification (16 features, 3 classes); NaN rejected.
- tabular_hgb  HistGradientBoostingClassifier, breast_cancer (30 features, 2 classes) with 5% of
               values missing; NaN is a legal input (allow_nan: true).
- prompt_guard TF-IDF + LogisticRegression on a templated prompt corpus (classical_corpus.py);
               labels simple / complex / unsafe; input `text` is a BYTES string.

Outputs:
- model_repository/<name>/1/model.onnx (gitignored), model_repository/<name>/config.pbtxt (CPU,
  backend onnxruntime_cpu) and configs/onnxruntime_gpu.pbtxt (Triton's native onnxruntime).
- build/classical/<name>/: held-out inputs and scikit-learn's own predict / predict_proba on them
  (inputs.npy or inputs.json, labels.npy or labels.json, probabilities.npy, meta.json), so tests
  compare Triton to scikit-learn without loading pickles. Nothing is ever pickled.

Invariants: deterministic for SEED; idempotent (a stamp hashing this script, the corpus module and
library versions skips rebuilding when nothing changed; --force rebuilds); the export is checked
against scikit-learn with onnxruntime before anything is written, and the build fails on mismatch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from classical_corpus import EXTRA_TEST_PROMPTS, build_corpus  # siblings: the script's folder is on sys.path
from classical_configs import write_configs

SEED = 20261130
OPSET = 17
ML_OPSET = 3
PROBA_ATOL = 1e-5  # float32 ONNX vs float64 scikit-learn; labels must match exactly
MODELS = ("tabular_rf", "tabular_hgb", "prompt_guard")
DEFAULT_REPO = ROOT / "model_repository"
DEFAULT_OUT = ROOT / "build" / "classical"


def _log(msg: str) -> None:
    print(f"[build_classical] {msg}", flush=True)


def _stamp() -> str:
    """Hash of everything that determines the outputs."""
    import onnx
    import skl2onnx
    import sklearn

    h = hashlib.sha256()
    for f in ("build_classical.py", "classical_corpus.py", "classical_configs.py"):
        h.update((Path(__file__).resolve().parent / f).read_bytes())
    h.update(f"{SEED} {OPSET} {sklearn.__version__} {skl2onnx.__version__} {onnx.__version__} {np.__version__}".encode())
    return h.hexdigest()


# ---------------------------------------------------------------- training (returns model, X_test)


def _train_tabular_rf():
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier

    X, y = make_classification(
        n_samples=3000, n_features=16, n_informative=10, n_redundant=2, n_classes=3, random_state=SEED % 2**31
    )
    # Trees compare float32 features in both scikit-learn and ONNX: train on float32 to match.
    X = X.astype(np.float32)
    model = RandomForestClassifier(n_estimators=60, max_depth=10, n_jobs=1, random_state=SEED % 2**31)
    model.fit(X[:2400], y[:2400])
    return model, X[2400:2600]


def _train_tabular_hgb():
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import HistGradientBoostingClassifier

    data = load_breast_cancer()
    rng = np.random.default_rng(SEED)
    X = data.data.astype(np.float32)
    X[rng.random(X.shape) < 0.05] = np.nan  # missing values the model learns to route
    order = rng.permutation(len(X))
    X, y = X[order], data.target[order]
    model = HistGradientBoostingClassifier(max_iter=80, random_state=SEED % 2**31)
    model.fit(X[:450], y[:450])
    return model, X[450:]


def _train_prompt_guard():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    texts, labels = build_corpus(SEED)
    cut = int(len(texts) * 0.8)
    model = Pipeline(
        [
            # Unigrams, linear tf: skl2onnx's TF-IDF graph diverges from scikit-learn with
            # bigrams (up to 0.035 in probability) and with sublinear_tf (0.004), measured here.
            ("tfidf", TfidfVectorizer(lowercase=True, ngram_range=(1, 1))),
            ("clf", LogisticRegression(C=5.0, max_iter=2000)),
        ]
    )
    model.fit(texts[:cut], labels[:cut])
    return model, np.array(texts[cut:] + EXTRA_TEST_PROMPTS, dtype=object)


# ---------------------------------------------------------------- export


def _fix_string_normalizer_locale(onx) -> None:
    """onnxruntime's StringNormalizer defaults to locale en_US.UTF-8, absent on slim images (session
    creation fails). C.UTF-8 ships with glibc and still lower-cases non-ASCII like Python does."""
    from onnx import helper

    for node in onx.graph.node:
        if node.op_type == "StringNormalizer" and not any(a.name == "locale" for a in node.attribute):
            node.attribute.append(helper.make_attribute("locale", "C.UTF-8"))


def _export(name: str, model, X_test: np.ndarray):
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType

    if name == "prompt_guard":
        initial = [("text", StringTensorType([None, 1]))]
        options = {id(model.steps[-1][1]): {"zipmap": False}}
    else:
        initial = [("input", FloatTensorType([None, X_test.shape[1]]))]
        options = {id(model): {"zipmap": False}}
    onx = convert_sklearn(
        model, initial_types=initial, options=options, target_opset={"": OPSET, "ai.onnx.ml": ML_OPSET}
    )
    onx.doc_string = f"{name}: exported by build_scripts/build_classical.py (seed {SEED})"
    _fix_string_normalizer_locale(onx)
    return onx


def _verify(name: str, onx, model, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run the export on the test set with onnxruntime; fail unless it matches scikit-learn."""
    import onnxruntime as ort

    sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = X_test.reshape(-1, 1) if name == "prompt_guard" else X_test
    label, proba = sess.run(["label", "probabilities"], {sess.get_inputs()[0].name: feed})
    want_label, want_proba = model.predict(X_test), model.predict_proba(X_test)
    bad = np.flatnonzero(np.asarray(label) != want_label)
    if bad.size:
        raise SystemExit(f"{name}: ONNX labels differ from scikit-learn on rows {bad[:10].tolist()}")
    err = float(np.abs(proba - want_proba).max())
    if err > PROBA_ATOL:
        raise SystemExit(f"{name}: ONNX probabilities differ from scikit-learn by {err:.2e} > {PROBA_ATOL}")
    _log(f"  {name}: onnxruntime == scikit-learn on {len(X_test)} rows (max |dp| {err:.1e})")
    return want_label, want_proba


# ---------------------------------------------------------------- writing


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _save_npy(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".tmp"), "wb") as f:
        np.save(f, arr, allow_pickle=False)
    os.replace(path.with_suffix(".tmp"), path)


def _write_test_data(out: Path, name: str, model, X_test, label, proba) -> dict:
    d = out / name
    classes = [c.item() if hasattr(c, "item") else c for c in model.classes_]
    if name == "prompt_guard":
        _write_atomic(d / "inputs.json", json.dumps([str(t) for t in X_test], ensure_ascii=False, indent=0).encode())
        _write_atomic(d / "labels.json", json.dumps([str(v) for v in label]).encode())
        meta = {"input": "text", "input_dtype": "BYTES", "allow_nan": False}
    else:
        _save_npy(d / "inputs.npy", X_test.astype(np.float32))
        _save_npy(d / "labels.npy", np.asarray(label, dtype=np.int64))
        meta = {"input": "input", "input_dtype": "FP32", "n_features": int(X_test.shape[1]),
                "allow_nan": name == "tabular_hgb"}
    _save_npy(d / "probabilities.npy", np.asarray(proba, dtype=np.float64))
    meta.update({"name": name, "classes": classes, "outputs": ["label", "probabilities"],
                 "proba_atol": PROBA_ATOL, "rows": int(len(X_test))})
    _write_atomic(d / "meta.json", json.dumps(meta, indent=2).encode())
    return meta


TRAINERS = {"tabular_rf": _train_tabular_rf, "tabular_hgb": _train_tabular_hgb, "prompt_guard": _train_prompt_guard}


def train(name: str):
    """(fitted scikit-learn model, held-out inputs) for `name`; deterministic, so the benchmark's
    baseline server can retrain the very model that was exported instead of unpickling it."""
    return TRAINERS[name]()


def _outputs_exist(repo: Path, out: Path) -> bool:
    return all((repo / n / "1" / "model.onnx").is_file() and (out / n / "meta.json").is_file() for n in MODELS)


def build(repo: Path = DEFAULT_REPO, out: Path = DEFAULT_OUT, force: bool = False) -> bool:
    """Build every model unless the stamp says they are current. Returns True if it rebuilt."""
    stamp_file = out / "stamp.json"
    stamp = _stamp()
    if not force and stamp_file.is_file() and _outputs_exist(repo, out):
        if json.loads(stamp_file.read_text()).get("stamp") == stamp:
            write_configs(repo, out)  # cheap; keeps configs in step if someone edited them by hand
            _log(f"up to date (stamp {stamp[:12]}); --force to rebuild")
            return False
    for i, name in enumerate(MODELS, 1):
        t0 = time.perf_counter()
        _log(f"[{i}/{len(MODELS)}] {name}: training")
        model, X_test = TRAINERS[name]()
        _log(f"  {name}: exporting to ONNX (opset {OPSET}, zipmap off)")
        onx = _export(name, model, X_test)
        label, proba = _verify(name, onx, model, X_test)
        _write_atomic(repo / name / "1" / "model.onnx", onx.SerializeToString())
        _write_test_data(out, name, model, X_test, label, proba)
        _log(f"  {name}: done in {time.perf_counter() - t0:.1f}s")
    write_configs(repo, out)
    _write_atomic(stamp_file, json.dumps({"stamp": stamp, "models": list(MODELS)}).encode())
    _log(f"wrote {len(MODELS)} models to {repo} and test data to {out}")
    return True


def ensure_built() -> None:
    """For test fixtures: build if missing or stale (no-op, well under a second, when current)."""
    build()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", type=Path, default=DEFAULT_REPO, help="model repository to write into")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where test inputs/expected outputs go")
    p.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    args = p.parse_args(argv)
    build(args.repo, args.out, args.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
