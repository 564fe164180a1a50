"""Read tritonserver's log: which models failed to load and why.

Triton reports a load failure twice: an error line ``failed to load '<name>' version N: <reason>`` and a
row ``| <name> | N | UNAVAILABLE: <reason> |`` in the model status table printed at startup. Both are
parsed so a failure is named even when one of them is missing (e.g. the log was cut short).
"""
from __future__ import annotations

import re

_FAILED_LINE = re.compile(r"failed to load '([^']+)'(?: version \d+)?: (.*?)\"?$")
_TABLE_ROW = re.compile(r"^\|\s*([^|\s]+)\s*\|\s*(-?\d+)\s*\|\s*(UNAVAILABLE[^|]*?)\s*\|?\s*$")


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


def failure_summary(log_text: str) -> str:
    """One line naming the models that failed to load, then one indented line per model with its reason."""
    failed = failed_models(log_text)
    if not failed:
        return "tritonserver did not become ready (no model reported a load failure)"
    return "tritonserver failed to load: " + ", ".join(failed) + "".join(
        f"\n  - {name}: {why}" for name, why in failed.items())


def describe_failure(log_text: str, tail_lines: int = 60) -> str:
    """The summary, then the last ``tail_lines`` lines of the log."""
    tail = "\n".join(log_text.splitlines()[-tail_lines:]) if tail_lines > 0 else ""
    return f"{failure_summary(log_text)}\n--- tritonserver log tail ---\n{tail}"
