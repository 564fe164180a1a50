"""llama.cpp on the bench workload; runs in build/peers/llamacpp's python, reads a JSON spec on stdin, prints
one JSON object on stdout.

- greedy ids (argmax of the last logits row, EOS ignored) of the first `check_prompts` prompts, through
  llama-cpp-python over the libllama built from the vendored source;
- batch-1 decode tok/s as benchmarks/bench_engine.decode_rate measures ours: (new - 1) tokens over the time
  beyond a 1-token run of the same prompt;
- batch-N e2e tok/s from llama-batched-bench (-npp prompt_len -ntg new -npl N): N x new / total time, prefill
  included (it decodes without sampling, which costs nothing measurable next to the forward passes).
"""
import json
import subprocess
import sys
import time


def greedy(llm, prompt: list, new: int) -> tuple:
    import numpy as np

    llm.reset()
    n_vocab = llm.n_vocab()
    out = []
    t = time.perf_counter()
    llm.eval(prompt)
    for i in range(new):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
        out.append(int(logits.argmax()))
        if i < new - 1:
            llm.eval([out[-1]])
    return out, time.perf_counter() - t


def batched_bench(exe: str, gguf: str, prompt_len: int, new: int, batches: list, threads: int) -> dict:
    ctx = max(batches) * (prompt_len + new) + 256
    cmd = [exe, "-m", gguf, "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(prompt_len), "-ntg", str(new),
           "-npl", ",".join(map(str, batches)), "-t", str(threads), "-tb", str(threads), "--output-format", "jsonl"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"llama-batched-bench exit {p.returncode}: {p.stderr[-2000:]}")
    rows = [json.loads(line) for line in (p.stdout + "\n" + p.stderr).splitlines() if line.startswith('{"n_kv_max"')]
    return {r["pl"]: r for r in rows}


def main() -> None:
    spec = json.load(sys.stdin)
    from llama_cpp import Llama

    prompts, new, threads = spec["prompts"], spec["new"], spec["threads"]
    llm = Llama(model_path=spec["gguf"], n_ctx=len(prompts[0]) + new + 64, n_batch=512, n_threads=threads,
                n_threads_batch=threads, logits_all=False, verbose=False)
    res = {"engine": "llama.cpp", "ids": [], "flash_attn_python": False}
    for p in prompts[: spec["check_prompts"]]:
        res["ids"].append(greedy(llm, p, spec["check_n"])[0])
    greedy(llm, prompts[0], 4)  # warm-up
    for _ in range(spec.get("repeat", 1)):  # best of `repeat`
        t1 = greedy(llm, prompts[0], 1)[1]
        tn = greedy(llm, prompts[0], new)[1]
        res["b1_decode"] = max(res.get("b1_decode", 0.0), (new - 1) / max(tn - t1, 1e-9))
        res["e2e_b1_python"] = max(res.get("e2e_b1_python", 0.0), new / tn)
    del llm
    for _ in range(spec.get("repeat", 1)):
        rows = batched_bench(spec["batched_bench"], spec["gguf"], len(prompts[0]), new, spec["batches"], threads)
        for b in spec["batches"]:
            r = rows[b]
            if b * new / r["t"] > res.get(f"e2e_b{b}", 0.0):
                res[f"e2e_b{b}"] = b * new / r["t"]
                res[f"batched_bench_b{b}"] = {k: r[k] for k in ("t_pp", "speed_pp", "t_tg", "speed_tg", "t",
                                                                "flash_attn")}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
