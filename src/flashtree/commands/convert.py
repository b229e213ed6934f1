"""`flashtree convert SRC.gguf OUT_DIR [--dtype D]`: write the HF directory of a GGUF file."""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("src", help="a llama / qwen2 / qwen3 .gguf file")
    p.add_argument("out", help="the HF directory to write (config.json, model.safetensors, tokenizer, template)")
    p.add_argument("--dtype", default="float32", help="dtype of the written weights (default float32: the "
                   "dequantized values as they are)")


def run(args) -> int:
    from pathlib import Path

    from ..models.gguf import convert_gguf
    out = convert_gguf(Path(args.src), Path(args.out), dtype=args.dtype)
    print(f"wrote {out}")
    return 0
