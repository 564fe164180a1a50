"""Pure logic of `make bench-peers`: greedy-id agreement, the printed table with ratios and targets, the
JSON file and the bar plot. No peer needed (tests/unit/test_bench_peers.py)."""
from __future__ import annotations

import json
import math
import os

# (peer, metric, minimum ours/peer ratio, goal) from issue #9
TARGETS = [("vLLM CPU", "e2e_b16", 1.0, 1.2), ("llama.cpp", "b1_decode", 0.9, None)]


def agreement(ours: list[list[int]], peer: list[list[int]], n: int = 12) -> dict:
    """Leading greedy ids in common, per prompt, over the first n; agree = all equal on all checked prompts."""
    if not peer:
        return {"checked": 0, "n": n, "agree": False, "common_prefix": []}
    prefix = []
    for a, b in zip(ours, peer):
        a, b = a[:n], b[:n]
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix.append(k)
    agree = len(prefix) == len(peer) and all(k == n for k in prefix)
    return {"checked": len(prefix), "n": n, "agree": agree, "common_prefix": prefix}


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def _ratio(a, b) -> float | None:
    return a / b if a and b else None


def _agree_text(row: dict) -> str:
    a = row.get("agreement")
    if row.get("status") != "ok":
        return "-"
    if a is None:
        return "ours"
    if not a["checked"]:
        return "not checked"
    txt = f"{'yes' if a['agree'] else 'NO'} ({sum(k == a['n'] for k in a['common_prefix'])}/{a['checked']} prompts)"
    return txt


def table(results: dict, batch: int = 16) -> str:
    """The comparison table (rows: ours, HF, each peer) and the issue's targets, met or missed."""
    rows = results["rows"]
    ours = rows["ours"]
    w = 34
    lines = [f"fp32, {results['threads']} threads, {results['prompt_len']}-token prompts, {results['new']} new "
             f"tokens (EOS ignored), best of {results.get('repeat', 1)} runs; first {results['check_n']} greedy ids "
             "checked against ours",
             f"{'engine':{w}} {'b1 decode tok/s':>15} {f'e2e b{batch} tok/s':>15} {'ours/it b1':>11} "
             f"{f'ours/it b{batch}':>11}  greedy ids agree"]
    for name, r in rows.items():
        if r.get("status") != "ok":
            how = "unavailable on this CPU" if r.get("status") == "unavailable" else "failed"
            lines.append(f"{name}: {how} ({r.get('reason', '?')})")
            continue
        label = name + (" [DISAGREES]" if r.get("agreement") and not r["agreement"]["agree"] else "")
        b1, bb = r.get("b1_decode"), r.get(f"e2e_b{batch}")
        r1 = _ratio(ours.get("b1_decode"), b1) if name != "ours" else None
        rb = _ratio(ours.get(f"e2e_b{batch}"), bb) if name != "ours" else None
        lines.append(f"{label:{w}} {_fmt(b1):>15} {_fmt(bb):>15} {_fmt_ratio(r1):>11} {_fmt_ratio(rb):>11}  "
                     f"{_agree_text(r)}")
    if "loadavg_1m_start" in results:
        loads = [results["loadavg_1m_start"], results.get("loadavg_1m_end", 0.0)]
        loads += [x for r in rows.values() for x in r.get("loadavg_1m", [])]
        busy = max(loads) > (os.cpu_count() or 2) + 0.5
        lines.append(f"machine load (1-min average, {os.cpu_count()} cores): {loads[0]:.1f} at start, {loads[1]:.1f} "
                     f"at end, {max(loads):.1f} at most" + (": other work shared the CPU, figures are low and noisy"
                                                             if busy else ""))
    lines.append("targets (issue #9):")
    for peer, metric, minimum, goal in TARGETS:
        r = rows.get(peer)
        what = "batch-1 decode" if metric == "b1_decode" else f"e2e batch {batch}"
        want = f">= {minimum:g}x" + (f", goal {goal:g}x" if goal else "")
        if not r or r.get("status") != "ok":
            lines.append(f"  ours/{peer} {what} {want}: not measured ({r.get('reason', '?') if r else 'not run'})")
            continue
        ratio = _ratio(ours.get(metric), r.get(metric))
        verdict = "MISSED" if ratio is None or ratio < minimum else "met"
        if goal and ratio is not None and ratio >= goal:
            verdict = "met, goal reached"
        elif goal and verdict == "met":
            verdict = "met, goal not reached"
        lines.append(f"  ours/{peer} {what} {want}: {_fmt_ratio(ratio)} -> {verdict}")
    return "\n".join(lines)


def _fmt_ratio(r) -> str:
    return "-" if r is None else f"{r:.2f}x"


def write(results: dict, out_dir: str, batch: int = 16) -> list[str]:
    """build/bench/peers.json and peers.png (two bar groups: batch-1 decode, e2e batch 16)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "peers.json")]
    with open(paths[0], "w") as f:
        json.dump(results, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return paths
    names = [n for n, r in results["rows"].items() if r.get("status") == "ok"]
    metrics = [("b1_decode", "batch-1 decode"), (f"e2e_b{batch}", f"e2e batch {batch}")]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, (key, title) in zip(axes, metrics):
        vals = [results["rows"][n].get(key) or 0.0 for n in names]
        bars = ax.bar(range(len(names)), vals, color=[f"C{i}" for i in range(len(names))])
        ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("output tokens/s")
        ax.grid(axis="y", alpha=0.3)
    missing = [n for n, r in results["rows"].items() if r.get("status") != "ok"]
    fig.suptitle(f"fp32, {results['threads']} threads" + (f" (unavailable: {', '.join(missing)})" if missing
                                                           else ""), fontsize=9)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "peers.png"))
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths
