"""Static security checks over the server-side code (backends/): no remote code, no pickles, no request-
controlled paths. These read the source with ``ast`` (not regexes over text), so a call split over lines
or a keyword given by position is still seen.

Invariants checked:
- every ``from_pretrained`` call passes ``trust_remote_code=False`` and ``local_files_only=True``;
- nothing imports pickle, joblib, dill, cloudpickle, calls ``torch.load``, or ``np.load`` without
  ``allow_pickle=False``;
- checkpoints are read only through safetensors: a directory with only a pickled ``.bin`` is refused;
- no tensor a client may send names a path (every path comes from config.pbtxt, never a request);
- a relative path parameter that escapes the repository is refused by ``tritonllm.paths``.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for p in (ROOT / "backends").rglob("*.py") if "__pycache__" not in p.parts)
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "joblib", "dill", "cloudpickle", "shelve", "marshal"}


def _calls():
    for path in SOURCES:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                yield path, node


def _func_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Attribute):
        base = f.value.id if isinstance(f.value, ast.Name) else "?"
        return f"{base}.{f.attr}"
    return f.id if isinstance(f, ast.Name) else "?"


def _kw(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return "<absent>"


def test_sources_were_found():
    assert len(SOURCES) > 20 and any(p.name == "loader.py" for p in SOURCES)


def test_every_from_pretrained_is_local_and_runs_no_remote_code():
    seen = []
    for path, call in _calls():
        if _func_name(call).endswith(".from_pretrained"):
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            seen.append(where)
            assert _kw(call, "trust_remote_code") is False, f"{where}: trust_remote_code must be False"
            assert _kw(call, "local_files_only") is True, f"{where}: local_files_only must be True"
    assert len(seen) >= 3, seen  # tokenizer, config and grammar loading at least


def test_no_pickle_loading():
    for path in SOURCES:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            else:
                continue
            bad = names & PICKLE_MODULES
            assert not bad, f"{path.relative_to(ROOT)}:{node.lineno} imports {bad}"
    for path, call in _calls():
        name, where = _func_name(call), f"{path.relative_to(ROOT)}:{call.lineno}"
        assert name != "torch.load", f"{where}: torch.load unpickles"
        if name in ("np.load", "numpy.load"):
            assert _kw(call, "allow_pickle") is False, f"{where}: np.load needs allow_pickle=False"


def test_pickled_checkpoint_is_refused(tmp_path):
    from tritonllm.engine.loader import load_weights

    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_weights(str(tmp_path))


def test_corrupt_safetensors_names_the_file(tmp_path):
    from tritonllm.engine.loader import load_weights

    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="model.safetensors"):
        load_weights(str(tmp_path))


def test_no_client_tensor_names_a_path():
    from tritonllm import contract

    names = set()
    for value in vars(contract).values():
        if isinstance(value, tuple) and value and all(hasattr(t, "name") and hasattr(t, "dtype") for t in value):
            names.update(t.name for t in value)
    assert "text_input" in names and "input_ids" in names
    pathlike = {n for n in names if any(w in n.lower() for w in ("path", "dir", "file", "url", "repo"))}
    # NVIDIA's LLM-API contract carries lora_path; ours reads it as a label only (text/llmapi_text.py).
    assert pathlike == {"lora_path"}, pathlike
    import inspect

    from tritonllm.text import llmapi_text
    source = inspect.getsource(llmapi_text)
    assert "os.path" not in source and "open(" not in source and "Path(" not in source


def test_relative_path_parameters_cannot_escape_the_repository(tmp_path):
    from tritonllm.paths import resolve_param_path

    repo = tmp_path / "repo"
    model_dir = repo / "tensorrt_llm"
    model_dir.mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (model_dir / "link").symlink_to(tmp_path / "secret")
    for value in ("../../secret", "link", "../tensorrt_llm/../../secret"):
        with pytest.raises(ValueError, match="gpt_model_path"):
            resolve_param_path(value, model_dir, name="gpt_model_path", confine=repo)


PATHLIKE = ("_path", "_dir", "_file", "lora_adapters", "lora_root")
CONFINING = {"model_path_param", "model_path_value", "resolve_param_path", "resolve_path", "_repo_path"}
# Read without confinement, and why that is safe: a bare file name, separators refused (tested in test_classical_*).
BARE_NAMES = {("backends/tritonllm/classical/settings.py", "model_file")}


def _path_reads():
    """(file, function, parameter, confining calls in that function) for every read of a path-like parameter in
    backends/, adapters and library alike: ``params.get("x_dir")``, ``params["x_path"]``."""
    for path in SOURCES:
        tree = ast.parse(path.read_text(), filename=str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            reads, calls = set(), set()
            for n in ast.walk(fn):
                key = None
                if isinstance(n, ast.Call):
                    calls.add(_func_name(n).rpartition(".")[2])
                    if _func_name(n).endswith(".get") and n.args and isinstance(n.args[0], ast.Constant):
                        key = n.args[0].value
                elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
                    key = n.slice.value
                if isinstance(key, str) and key.endswith(PATHLIKE):
                    reads.add(key)
            for key in reads:
                yield str(path.relative_to(ROOT)), fn.name, key, calls & CONFINING


def test_every_path_parameter_read_is_confined():
    """Wherever the code lives (an adapter's model.py or the library it delegates to), the function that reads a
    path parameter resolves it through the confining helpers."""
    seen = set()
    for where, fn, key, confining in _path_reads():
        seen.add(key)
        assert confining or (where, key) in BARE_NAMES, f"{where}:{fn} reads {key!r} without confining it"
    assert {"tokenizer_dir", "lora_adapters", "draft_model_path", "gpt_model_path"} <= seen, seen


@pytest.mark.parametrize("builder, name, value", [
    ("torchllm", "gpt_model_path", "../../../outside"), ("torchllm", "tokenizer_dir", "../../../outside"),
    ("torchllm", "draft_model_path", "../../../outside"), ("torchllm", "lora_adapters", "1=../../build, 2=../../../outside"),
    ("trtllm_llmapi", "gpt_model_path", "../../../outside"),  # its only path: the rest are LLM() arguments
])
def test_adapters_that_delegate_refuse_escaping_paths(tmp_path, builder, name, value):
    """The two adapters whose model.py holds no path code (backends/torchllm, backends/trtllm_llmapi) build through
    library functions: those refuse a path parameter that leaves the checkout, naming it, before opening anything."""
    import json

    from tritonllm.serving.engine_backend import build_engine_backend
    from tritonllm.trtllm.llmapi_settings import build_llmapi_backend

    model_dir = tmp_path / "checkout" / "model_repository" / "tensorrt_llm"
    model_dir.mkdir(parents=True)
    (tmp_path / "checkout" / "build").mkdir()
    (tmp_path / "outside").mkdir()
    params = {"gpt_model_path": "../../build", "speculative_decoding_mode": "draft_tokens_external",
              "draft_model_path": "../../build", "max_draft_len": "2", name: value}
    args = {"model_repository": str(model_dir), "model_config": json.dumps({})}
    build = build_llmapi_backend if builder == "trtllm_llmapi" else build_engine_backend
    with pytest.raises(ValueError, match=f"'{re.escape(name)}(\\[2\\])?' points outside"):
        build(args, params, lambda out: None)


def test_model_path_param_confines_relative_paths(tmp_path):
    import json

    from tritonllm.paths import model_path_param

    model_dir = tmp_path / "checkout" / "model_repository" / "m"
    model_dir.mkdir(parents=True)
    (tmp_path / "checkout" / "build").mkdir()
    args = {"model_repository": str(model_dir), "model_config": json.dumps({})}
    assert model_path_param(args, {"p": "../../build"}, "p") == (tmp_path / "checkout" / "build").resolve()
    with pytest.raises(ValueError, match="'p' points outside"):
        model_path_param(args, {"p": "../../../elsewhere"}, "p", must_exist=False)
