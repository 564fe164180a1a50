"""Resolve path-valued config parameters (``gpt_model_path``, ``tokenizer_dir``, ...).

Convention (the renderer writes them so): a relative path in a config.pbtxt parameter is relative to the
*model's directory* (``args["model_repository"]`` in a Python backend's ``initialize``, i.e. the folder
holding config.pbtxt), e.g. ``gpt_model_path: "../../build/models/demo"``. An absolute path stays as is.
The server's working directory never matters.

Invariants:
- ``resolve_param_path`` returns an absolute, normalised path (symlinks resolved).
- With ``confine=<root>`` (the repository root), a *relative* path that resolves outside ``root`` (by
  ``..`` or through a symlink) raises ``ValueError`` naming the parameter. An absolute path is the
  operator's explicit choice (e.g. ``/models/Llama-3.1-8B``) and is not confined.
- An empty value raises ``ValueError`` naming the parameter (NVIDIA's fill_template leaves ``${...}``
  or empty strings behind; those are caught here too).
"""
from __future__ import annotations

import os
from pathlib import Path


def resolve_param_path(
    value: str,
    model_dir: str | os.PathLike,
    *,
    name: str = "path",
    confine: str | os.PathLike | None = None,
    must_exist: bool = False,
) -> Path:
    """Resolve ``value`` (relative to ``model_dir``) to an absolute path; see the module docstring."""
    raw = (value or "").strip()
    if not raw or raw.startswith("${"):
        raise ValueError(f"parameter '{name}' is empty or an unfilled template: {value!r}")
    path = Path(os.path.expanduser(raw))
    relative = not path.is_absolute()
    if relative:
        path = Path(model_dir) / path
    resolved = path.resolve()
    if confine is not None and relative:
        root = Path(confine).resolve()
        if resolved != root and root not in resolved.parents:
            raise ValueError(f"parameter '{name}' points outside {root}: {value!r} -> {resolved}")
    if must_exist and not resolved.exists():
        raise ValueError(f"parameter '{name}' points to a missing path: {value!r} -> {resolved}")
    return resolved


def project_root(model_dir: str | os.PathLike) -> Path:
    """The checkout that holds `<root>/<repository>/<model>`: relative path parameters stay inside it."""
    return Path(model_dir).resolve().parent.parent


def model_dir_from_args(args: dict) -> Path:
    """The model's directory from a Python backend's ``initialize(args)``."""
    return Path(args["model_repository"]).resolve()


def relative_to_model_dir(target: str | os.PathLike, model_dir: str | os.PathLike) -> str:
    """The string to write in a config so that ``resolve_param_path`` finds ``target`` again."""
    return os.path.relpath(Path(target).resolve(), Path(model_dir).resolve())


def model_parameters(args: dict) -> tuple[dict, dict[str, str]]:
    """(model config, its string parameters) from a Python backend's ``initialize(args)``."""
    import json

    config = json.loads(args["model_config"])
    return config, {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def model_path_param(args: dict, params: dict[str, str], name: str, *, must_exist: bool = True) -> Path:
    """A path parameter of the model, resolved against its directory and confined to the checkout."""
    return model_path_value(args, params.get(name, ""), name, must_exist=must_exist)


def model_path_value(args: dict, value: str, name: str, *, must_exist: bool = True) -> Path:
    """A path value from the model's config (``name`` for errors), resolved and confined as above."""
    model_dir = model_dir_from_args(args)
    return resolve_param_path(value, model_dir, name=name, confine=project_root(model_dir), must_exist=must_exist)
