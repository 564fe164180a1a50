"""Read tritonserver's log: which models failed to load and why, or which port was already taken.

Triton reports a load failure twice: an error line ``failed to load '<name>' version N: <reason>`` and a
row ``| <name> | N | UNAVAILABLE: <reason> |`` in the model status table printed at startup. Both are
parsed so a failure is named even when one of them is missing (e.g. the log was cut short).
"""
from __future__ import annotations

import re

_FAILED_LINE = re.compile(r"failed to load '([^']+)'(?: version \d+)?: (.*?)\"?$")
_TABLE_ROW = re.compile(r"^\|\s*([^|\s]+)\s*\|\s*(-?\d+)\s*\|\s*(UNAVAILABLE[^|]*?)\s*\|?\s*$")
# Triton probes each endpoint's port before serving: "failed to start HTTP service: Unavailable - Socket
# '0.0.0.0:8000' already in use" (likewise GRPC and Metrics).
_PORT_IN_USE = re.compile(r"Socket '[^']*:(\d+)' already in use")


def _first_line(reason: str) -> str:
    # Triton escapes newlines inside its quoted log messages; a Python traceback follows the first line.
    return reason.replace("\\n", "\n").strip().split("\n")[0].strip()


def failed_models(log_text: str) -> dict[str, str]:
    """Model name -> reason, from Triton's "failed to load" lines and its model status table."""
    found: dict[str, str] = {}
    for line in log_text.splitlines():
        m = _FAILED_LINE.search(line)
        if m:
            found.setdefault(m.group(1), _first_line(m.group(2)))
            continue
        m = _TABLE_ROW.match(line.strip())
        if m:
            found.setdefault(m.group(1), _first_line(m.group(3)))
    return found


def ports_in_use(log_text: str) -> list[int]:
    """The ports tritonserver found taken, in the log's order."""
    return list(dict.fromkeys(int(p) for p in _PORT_IN_USE.findall(log_text)))


def port_in_use(port: int, port_options: dict[int, str] | None = None) -> str:
    """One line: ``port`` is taken, by whom (the processes listening there now), and how to choose another."""
    from tritonllm.serving.orphans import describe_holders  # reads /proc

    held = describe_holders(port) or f" (another server listens there: `ss -ltnp | grep :{port}` shows it)"
    return (f"port {port} is already in use{held}; stop it or choose another port"
            + (f": {port_options[port]}" if port_options and port in port_options else ""))


def failure_summary(log_text: str, port_options: dict[int, str] | None = None) -> str:
    """What kept tritonserver from becoming ready, in a line each: a port already in use (with
    ``port_options[port]``, how to choose another), or the models that failed to load and their reasons."""
    taken = ports_in_use(log_text)
    if taken:
        return "\n".join(port_in_use(p, port_options) for p in taken)
    failed = failed_models(log_text)
    if not failed:
        return "tritonserver did not become ready (no model reported a load failure)"
    return "tritonserver failed to load: " + ", ".join(failed) + "".join(
        f"\n  - {name}: {why}" for name, why in failed.items())


def describe_failure(log_text: str, tail_lines: int = 60, port_options: dict[int, str] | None = None) -> str:
    """The summary, then the last ``tail_lines`` lines of the log."""
    tail = "\n".join(log_text.splitlines()[-tail_lines:]) if tail_lines > 0 else ""
    return f"{failure_summary(log_text, port_options)}\n--- tritonserver log tail ---\n{tail}"
