"""Local, deterministic English text for the demo model (nothing is downloaded).

Sources, all present on any Debian + CPython machine of the project image:
  1. docstrings of the Python standard library (parsed with ``ast``, never imported,
     so no module side effects and no dependence on what happens to be importable);
  2. the Python language reference shipped as ``pydoc_data.topics``;
  3. the license texts in /usr/share/common-licenses (if present).

Invariant: for a fixed CPython version and Debian image the returned text is
byte-identical across runs and machines (files and docstrings are visited in
sorted order, symlinked duplicates are read once).
"""

from __future__ import annotations

import ast
import re
import sysconfig
from pathlib import Path

_LICENSES = Path("/usr/share/common-licenses")
# Test suites and tool GUIs are mostly code or terse strings, not prose.
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages",
              "ensurepip", "turtledemo", "tkinter", "__pycache__"}
_CODE = re.compile(r"\w_\w|\w\(|\.\w+\(|>>>|::=")  # snake_case, calls, doctests, grammar rules
_MIN_DOC_CHARS = 80  # short docstrings are "Return x." noise that teaches little English


def _is_prose(paragraph: str) -> bool:
    """Mostly letters and sentence punctuation, several words, no identifiers or calls."""
    if len(paragraph) < 30 or paragraph.count(" ") < 6:
        return False
    wordy = sum(c.isalpha() or c in " ,.;:'-?!" for c in paragraph)
    return wordy > 0.95 * len(paragraph) and not _CODE.search(paragraph)


def _clean(text: str) -> str:
    """Join wrapped lines into paragraphs and keep only the prose ones (one per line)."""
    paragraphs, current = [], []
    for line in text.splitlines() + [""]:
        line = " ".join(line.split())  # also collapses runs of spaces: no lone-space tokens to learn
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return "\n".join(p for p in paragraphs if _is_prose(p))


def _stdlib_docstrings(stdlib: Path) -> list[str]:
    docs = []
    for path in sorted(stdlib.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(stdlib).parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= _MIN_DOC_CHARS:
                    docs.append(_clean(doc))
    return docs


def _language_reference() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # stripped Python builds may lack it; the other sources remain
        return []
    return [_clean(topics[k]) for k in sorted(topics)]


def _licenses() -> list[str]:
    if not _LICENSES.is_dir():
        return []
    seen, texts = set(), []
    for path in sorted(_LICENSES.iterdir()):
        real = path.resolve()
        if real in seen or not real.is_file():
            continue
        seen.add(real)
        texts.append(_clean(real.read_text(encoding="utf-8", errors="replace")))
    return texts


def load_corpus(max_chars: int = 6_000_000) -> str:
    """Return the concatenated corpus (documents separated by blank lines), at most max_chars.

    Sources are read lazily in a fixed order, so a small max_chars skips the slow stdlib parse.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs, total = [], 0
    for source in (_language_reference, _licenses, lambda: _stdlib_docstrings(stdlib)):
        for doc in source():
            if doc:
                docs.append(doc)
                total += len(doc) + 2
        if total >= max_chars:
            break
    text = "\n\n".join(docs)
    if len(text) < min(max_chars, 100_000):
        raise RuntimeError(f"demo corpus too small ({len(text)} chars); stdlib at {stdlib}?")
    return text[:max_chars]


if __name__ == "__main__":
    corpus = load_corpus()
    print(f"{len(corpus)} chars")
    print(corpus[:3000])
