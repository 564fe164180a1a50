"""vLLM CPU on the bench workload; runs in build/peers/vllm's python, reads a JSON spec on stdin, prints one
JSON object on the last line of stdout (vLLM logs on stderr).

Same measurements as benchmarks/bench_engine.py does for ours: batch-1 decode = (new - 1) tokens over the
time beyond a 1-token run; batch-N e2e = N x new / wall time of one generate() call, prefill included.
Prefix caching is off (the prompts are repeated between runs). Run under `if __name__ == "__main__"`: the
V1 engine core is a child process.
"""
import json
import os
import sys
import time


def main() -> None:
    spec = json.load(sys.stdin)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{spec['threads'] - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    prompts, new = spec["prompts"], spec["new"]
    llm = LLM(model=spec["model"], dtype=spec.get("dtype", "float32"), max_model_len=len(prompts[0]) + new + 16,
              max_num_seqs=max(spec["batches"]), max_num_batched_tokens=spec.get("max_num_tokens", 2048), enable_prefix_caching=False,
              seed=0)

    def run(batch: list, n: int) -> tuple:
        sp = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in batch], sp, use_tqdm=False)
        dt = time.perf_counter() - t
        return [list(o.outputs[0].token_ids) for o in outs], dt

    res = {"engine": "vLLM CPU"}
    run(prompts[:1], 4)  # warm-up (compilation, first allocations)
    ids, _ = run(prompts[: max(spec["check_prompts"], 1)], spec["check_n"])
    res["ids"] = ids[: spec["check_prompts"]]
    for _ in range(spec.get("repeat", 1)):  # best of `repeat`
        t1 = run(prompts[:1], 1)[1]
        tn = run(prompts[:1], new)[1]
        res["b1_decode"] = max(res.get("b1_decode", 0.0), (new - 1) / max(tn - t1, 1e-9))
        res["e2e_b1"] = max(res.get("e2e_b1", 0.0), new / tn)
    for b in spec["batches"]:
        for _ in range(spec.get("repeat", 1)):
            outs, dt = run(prompts[:b], new)
            res[f"e2e_b{b}"] = max(res.get(f"e2e_b{b}", 0.0), sum(len(o) for o in outs) / dt)
    print("\n" + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
