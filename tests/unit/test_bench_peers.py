"""Pure logic of `make bench-peers` (benchmarks/peers/report.py): greedy-id agreement, the table (ratios,
targets met or missed, a disagreeing or unavailable peer), the JSON and plot files. No peer installed."""
import json
import os


from peers import report  # noqa: E402


def _results(vllm=None, llamacpp=None):
    ours_ids = [[5, 6, 7, 8], [9, 10, 11, 12]]
    rows = {"ours": {"status": "ok", "ids": ours_ids, "b1_decode": 40.0, "e2e_b16": 150.0},
            "HF transformers": {"status": "ok", "ids": ours_ids, "b1_decode": 20.0, "e2e_b16": 100.0}}
    rows["vLLM CPU"] = vllm or {"status": "ok", "ids": ours_ids, "b1_decode": 30.0, "e2e_b16": 100.0}
    rows["llama.cpp"] = llamacpp or {"status": "ok", "ids": ours_ids, "b1_decode": 50.0, "e2e_b16": 160.0}
    for name, r in rows.items():
        if name != "ours" and r["status"] == "ok":
            r["agreement"] = report.agreement(ours_ids, r["ids"], 4)
    return {"threads": 2, "prompt_len": 128, "new": 128, "check_n": 4, "rows": rows}


def test_agreement_counts_leading_common_ids():
    a = report.agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]], n=3)
    assert a == {"checked": 2, "n": 3, "agree": False, "common_prefix": [3, 1]}
    assert report.agreement([[1, 2, 3, 4]], [[1, 2, 3, 0]], n=3)["agree"]  # beyond n does not count
    assert not report.agreement([[1, 2]], [], n=2)["agree"]
    assert not report.agreement([[1, 2, 3]], [[1, 2]], n=3)["agree"]  # a short peer output is not agreement


def test_table_ratios_and_targets():
    text = report.table(_results())
    assert "ours/vLLM CPU e2e batch 16 >= 1x, goal 1.2x: 1.50x -> met, goal reached" in text
    assert "ours/llama.cpp batch-1 decode >= 0.9x: 0.80x -> MISSED" in text
    hf = next(line for line in text.splitlines() if line.startswith("HF transformers"))
    assert "2.00x" in hf and "1.50x" in hf and "yes (2/2 prompts)" in hf


def test_table_flags_disagreement_and_unavailable_peer():
    bad = {"status": "ok", "ids": [[5, 6, 0, 0], [9, 10, 11, 12]], "b1_decode": 30.0, "e2e_b16": 100.0}
    text = report.table(_results(vllm=bad))
    assert "vLLM CPU [DISAGREES]" in text and "NO (1/2 prompts)" in text
    gone = {"status": "unavailable", "reason": "Illegal instruction"}
    text = report.table(_results(vllm=gone))
    assert "vLLM CPU: unavailable on this CPU (Illegal instruction)" in text
    assert "ours/vLLM CPU e2e batch 16 >= 1x, goal 1.2x: not measured (Illegal instruction)" in text


def test_write_json_and_plot(tmp_path):
    results = _results(llamacpp={"status": "failed", "reason": "build failed"})
    paths = report.write(results, str(tmp_path))
    assert json.load(open(paths[0]))["rows"]["llama.cpp"]["status"] == "failed"
    if len(paths) > 1:
        assert os.path.getsize(paths[1]) > 1000
