"""Run the llama.cpp vendored convert_hf_to_gguf.py (in the llamacpp venv) to GGUF F32.

Our made-up byte-level BPE tokenizer is not in the converter's pre-tokenizer list (it recognises tokenizers
by the hash of a test string's ids), so an unrecognised one is mapped to "gpt-2"; the benchmark feeds
token ids, so the pre-tokenizer never runs.

    python convert_gguf.py VENDORED_LLAMA_CPP MODEL_DIR OUT.gguf
"""
import sys


def main() -> None:
    vendored, model_dir, out = sys.argv[1:4]
    sys.path[:0] = [vendored, f"{vendored}/gguf-py"]
    import conversion.base as base

    original = base.TextModel.get_vocab_base_pre

    def vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            print("convert_gguf: pre-tokenizer not recognised, mapped to gpt-2", file=sys.stderr)
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = vocab_base_pre
    import convert_hf_to_gguf

    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outtype", "f32", "--outfile", out]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
