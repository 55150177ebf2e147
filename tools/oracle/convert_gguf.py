#!/usr/bin/env python3
"""Run llama.cpp's vendored convert_hf_to_gguf.py on one of our tiny models.

Usage: convert_gguf.py LLAMA_CPP_SRC_DIR HF_MODEL_DIR OUT.gguf OUTTYPE

The vendored converter is used unmodified. Two things are adjusted from the
outside, in this process only:
  * the BPE pre-tokenizer detection (a hash of how the tokenizer splits a fixed
    test string) does not know our freshly trained 512-token tokenizer, so it is
    told to report "qwen35" (our tokenizer uses the Qwen3.5 split regex);
  * the vendored gguf-py is put first on sys.path (the PyPI `gguf` package does
    not know Q1_0 / Q2_0).
"""
import sys
from pathlib import Path


def main() -> None:
    src, model_dir, out, outtype = sys.argv[1:5]
    src = Path(src).resolve()
    sys.path.insert(0, str(src / "gguf-py"))
    sys.path.insert(0, str(src))

    import conversion.base as base  # vendored llama.cpp conversion package

    patched = 0
    for obj in vars(base).values():
        if isinstance(obj, type) and "get_vocab_base_pre" in vars(obj):
            obj.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
            patched += 1
    if patched == 0:
        raise SystemExit("could not find get_vocab_base_pre to patch")

    import convert_hf_to_gguf as conv

    sys.argv = [
        "convert_hf_to_gguf.py",
        str(model_dir),
        "--outfile", str(out),
        "--outtype", outtype,
        "--no-mtp",
    ]
    conv.main()


if __name__ == "__main__":
    main()
