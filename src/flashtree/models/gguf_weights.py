"""A GGUF file's weights read straight into a `TargetModel`: blocks kept, nothing converted.

`load_gguf_weights(model, src, quant)` reads every tensor of a llama / qwen2 / qwen3 `.gguf`
(the header's tensor table, `tensor_table`; a kept tensor's bytes read once into its blocks)
under its HF name:
- `quant="blocks"`: Q8_0 / Q4_0 / Q4_1 / Q4_K projections and embeddings stay in their blocks
  (`quant.QuantLinear`, `quant.QuantEmbedding`; a tied head shares the embedding's blocks; Q4_K
  as its sub-blocks of 32); any other type (Q5_K, Q6_K, F16, ...) is dequantized into the
  model's dtype, with one warning naming the types and what they cost;
- `quant=None`: every tensor dequantized into the model's dtype (what a float checkpoint gives);
- `quant="q8_0" | "q4_0"`: every projection quantized to that type at load (llama.cpp's rounding),
  kept types included (a Q4_1 file asked for q8_0 is dequantized first: no bits come back).
llama.cpp stores llama's q/k rows permuted for its rotary layout; they are put back in HF's order
(a row permutation, so blocks move whole). The config and tokenizer come from `gguf.py`'s
conversion of the metadata; nothing here builds a model or runs one.
"""
from __future__ import annotations

import logging
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from torch import nn

from .. import cpu
from ..config import ConfigError
from . import quant as q

log = logging.getLogger("flashtree.models")

# GGUF tensor name (after `blk.N.`) -> HF name (after `model.layers.N.`)
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


def hf_name(name: str) -> str | None:
    """The HF name of a GGUF tensor name, or None for one flashtree does not read (e.g. rope_freqs)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    hit = _BLOCK.fullmatch(name)
    if hit and hit.group(2) in _LAYER_NAMES:
        return f"model.layers.{hit.group(1)}.{_LAYER_NAMES[hit.group(2)]}"
    return None


def unpermute_rows(n: int, heads: int) -> np.ndarray:
    """The row order that undoes llama.cpp's q/k permutation of a [heads * D, ...] weight: its
    converter writes rows (h, i, j) -> (h, j, i) over [heads, 2, D/2]; HF's row r is its row order[r]."""
    return np.arange(n).reshape(heads, n // heads // 2, 2).swapaxes(1, 2).reshape(n)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a GGUF file's table: its name, type, shape (GGUF's order: the row length
    first), where its bytes start in the file and how many there are."""
    name: str
    kind: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    n_bytes: int


# GGUF's scalar value types -> their struct format (little-endian, packed)
_SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
            GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
            GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}


class _Header:
    """A GGUF file's header read front to back: more of the file is read as the header needs it
    (the first 4 MB, then twice as much each time: a large vocabulary's strings)."""

    def __init__(self, file, path: Path):
        self.file, self.path, self.buf, self.pos = file, path, memoryview(file.read(1 << 22)), 0

    def _need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            self.file.seek(0)
            self.buf = memoryview(self.file.read(max(2 * len(self.buf), self.pos + n)))
            if self.pos + n > len(self.buf):
                raise ConfigError(f"{self.path}: the GGUF header runs past the end of the file")

    def take(self, fmt: str):
        """The next value(s) of struct format `fmt` (one value, or a tuple of several)."""
        n = struct.calcsize("<" + fmt)
        self._need(n)
        out = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return out if len(out) > 1 else out[0]

    def string(self) -> str:
        n = self.take("Q")
        self._need(n)
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8", errors="replace")

    def skip(self, vtype: int, count: int = 1) -> None:
        """Past `count` values of type `vtype` (an array's elements by their own lengths)."""
        if vtype in _SCALARS:
            n = struct.calcsize("<" + _SCALARS[vtype]) * count
            self._need(n)
            self.pos += n
        elif vtype == GGUFValueType.STRING:
            for _ in range(count):
                self.string()
        elif vtype == GGUFValueType.ARRAY:
            for _ in range(count):
                inner, n = self.take("IQ")
                self.skip(inner, n)
        else:
            raise ConfigError(f"{self.path}: unknown GGUF value type {vtype}")


def tensor_table(path: Path) -> tuple[dict[str, object], list[TensorEntry]]:
    """A GGUF file's scalar metadata (strings and numbers; arrays skipped) and its tensor table.

    The `gguf` package's reader builds every metadata value as numpy arrays before it gives the
    table — SmolLM2's 49k-token vocabulary and merges took 1.97 s and 160 MB of each load, a
    152k-token one 4.6 s — while the weights need only the table. This walks the header (GGUF v2 /
    v3, little-endian, the format `gguf.GGUFReader` reads) and skips each array by its lengths;
    `tests/test_quant.py` checks it against the reader's on the real model's file and a written one."""
    with open(path, "rb") as f:
        h = _Header(f, path)
        if bytes(h.buf[:4]) != b"GGUF":
            raise ConfigError(f"{path}: not a GGUF file (no GGUF magic)")
        h.pos = 4
        version = h.take("I")
        if version not in (2, 3):
            raise ConfigError(f"{path}: GGUF version {version} (big-endian, or not one flashtree reads: 2 and 3)")
        n_tensors, n_kv = h.take("QQ")
        meta: dict[str, object] = {}
        for _ in range(n_kv):
            key, vtype = h.string(), h.take("I")
            if vtype == GGUFValueType.STRING:
                meta[key] = h.string()
            elif vtype in _SCALARS:
                meta[key] = h.take(_SCALARS[vtype])
            else:
                h.skip(vtype)
        infos = []
        for _ in range(n_tensors):
            name, n_dims = h.string(), h.take("I")
            dims = tuple(int(h.take("Q")) for _ in range(n_dims))
            kind, offset = h.take("IQ")
            infos.append((name, dims, GGMLQuantizationType(kind), offset))
    align = int(meta.get("general.alignment", 32))
    start = -(-h.pos // align) * align  # the data begin at the next multiple of the alignment
    table = []
    for name, dims, kind, offset in infos:
        block, size = GGML_QUANT_SIZES[kind]
        table.append(TensorEntry(name, kind, dims, start + offset, int(np.prod(dims)) * size // block))
    return meta, table


def _set_module(model: nn.Module, dotted: str, module: nn.Module) -> None:
    parent, _, leaf = dotted.rpartition(".")
    setattr(model.get_submodule(parent), leaf, module)


def load_gguf_weights(model: nn.Module, src: Path, quant: str | None = "blocks",
                      dtype: torch.dtype | None = None, matrix_dtype: torch.dtype | None = None) -> dict[str, int]:
    """Fill `model` (a TargetModel built for the file's config; its parameters may be on the meta
    device: each is set from the file, in `dtype`, default the parameters'; a float weight matrix
    in `matrix_dtype`, default `dtype`) from `src`. A tensor
    kept in blocks is read from the file into its blocks alone (no float copy of it exists at any
    point, and the file is read, not mapped, so its pages are not this process's memory). Returns
    how many tensors took each form ({"q4_1": 210, "float": 61, ...})."""
    from gguf.quants import dequantize
    if quant not in (None, "blocks", *q.QUANTS):
        raise ConfigError(f"quant '{quant}' is not supported; use blocks, none or one of {', '.join(q.QUANTS)}")
    meta, table = tensor_table(Path(src))
    arch = meta.get("general.architecture")
    cfg = model.config
    dtype = dtype or next(p for p in model.parameters()).dtype
    matrix_dtype = matrix_dtype or dtype
    params = dict(model.named_parameters())
    tied = bool(cfg.tie_word_embeddings)
    forms: dict[str, int] = {}
    costly: dict[str, int] = {}
    seen: set[str] = set()
    with open(src, "rb") as file:
        for t in table:
            gguf_name, gguf_type, shape = t.name, t.kind, t.shape
            name = hf_name(gguf_name)
            if name is None:
                continue
            kind = gguf_type.name.lower()
            n, k = (shape[1], shape[0]) if len(shape) == 2 else (shape[0], 1)
            order = None
            if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = cfg.num_attention_heads if name.endswith("q_proj.weight") else cfg.num_key_value_heads
                order = unpermute_rows(n, heads)
            matrix = len(shape) == 2 and name.endswith(".weight") and not name.endswith("norm.weight")
            keep = matrix and kind in q.KEPT and quant == "blocks"
            raw = np.empty(t.n_bytes, np.uint8)  # rows of the file's bytes, [N, bytes a row]
            file.seek(t.offset)
            if file.readinto(raw) != raw.size:
                raise ConfigError(f"{src}: tensor '{gguf_name}' runs past the end of the file")
            raw = raw.reshape(n if len(shape) == 2 else 1, -1)
            if keep:
                blocks = q.from_gguf(raw, kind, n, k)
                del raw
                if order is not None:
                    blocks = blocks.rows(torch.from_numpy(order))
            else:
                if matrix and kind not in ("f32", "f16", "bf16") + q.KEPT and quant == "blocks":
                    costly[kind.upper()] = costly.get(kind.upper(), 0) + 1
                w = dequantize(raw, gguf_type)
                del raw
                w = torch.from_numpy(np.ascontiguousarray(w).astype(np.float32))
                w = w.reshape(n, k) if len(shape) == 2 else w.reshape(n)
                if order is not None:
                    w = w[torch.from_numpy(order)]
                if matrix and quant in q.QUANTS:
                    blocks, keep = q.quantize(w, quant), True
            if keep:
                blocks = q.kernel_form(blocks)  # the kernel's layout, once (a tied head and its embedding share it)
                forms[blocks.kind] = forms.get(blocks.kind, 0) + 1
                if name == "model.embed_tokens.weight":
                    _set_module(model, "model.embed_tokens", q.QuantEmbedding(blocks, dtype))
                    if tied:
                        model.lm_head = q.QuantLinear(blocks)
                else:
                    mod = name.removesuffix(".weight")
                    old = model.get_submodule(mod)
                    _set_module(model, mod, q.QuantLinear(blocks, old.bias))  # (its bias, read before or after)
                del blocks
                cpu.return_free_heap()  # this tensor's temporaries, before the next one's: the peak stays the weights
            else:
                forms["float"] = forms.get("float", 0) + 1
                if name not in params:
                    raise ConfigError(f"{src}: tensor '{gguf_name}' ({name}) is not a weight of the model its metadata "
                                      f"describes")
                p = params[name]
                if tuple(p.shape) != tuple(w.shape):
                    raise ConfigError(f"{src}: tensor '{gguf_name}' has shape {list(w.shape)}, the config implies "
                                      f"{list(p.shape)}")
                owner, _, leaf = name.rpartition(".")
                setattr(model.get_submodule(owner), leaf,
                        nn.Parameter(w.to(matrix_dtype if matrix else dtype), requires_grad=False))
            seen.add(name)
    if tied and "lm_head.weight" not in seen and not isinstance(model.lm_head, q.QuantLinear):
        model.lm_head.weight = model.model.embed_tokens.weight
        seen.add("lm_head.weight")
    missing = [n for n in params if n not in seen]
    if missing:
        raise ConfigError(f"{src}: weight(s) missing from the file: {', '.join(missing[:5])}"
                          f"{' ...' if len(missing) > 5 else ''}")
    if costly:
        log.warning("%s: %s tensor(s) dequantized to %s at load (flashtree keeps %s in their blocks): each "
                    "streams %s the bytes its blocks would", src.name,
                    ", ".join(f"{v} {k_}" for k_, v in costly.items()), str(matrix_dtype).removeprefix("torch."),
                    ", ".join(x.upper() for x in q.KEPT), "2-4x" if matrix_dtype != torch.float32 else "4-8x")
    return forms

