"""matplotlib for the benchmarks' plots, headless; None (said once on stderr) where it is not installed."""
from __future__ import annotations

import sys


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: `pip install -e .[bench]` for the plot)", file=sys.stderr)
        return None
    return plt
