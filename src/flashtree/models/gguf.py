"""GGUF files as users have them: their metadata as an HF directory, weights read from the file.

`cached_conversion(src)` writes a file's config and tokenizer once into flashtree's cache, a
directory whose weights `gguf_weights.py` reads from the file at load (blocks kept; see there).
`convert_gguf(src, out)` (`flashtree convert`, and `cached_conversion(src, weights=True)`) reads
a llama / qwen2 / qwen3 `.gguf` with transformers' GGUF integration (which dequantizes with the
`gguf` package and undoes llama.cpp's Q/K row permutation), then writes `config.json`, `model.safetensors`, `generation_config.json` and the
tokenizer (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`) built from the
file's metadata. `gguf_source(dir)` names the file a directory was converted
from. `requantize_gguf` writes a file's weights again unquantized (the F32/BF16 files the llama.cpp
peer reads; `cached_requantization` once per file). Nothing here runs a model.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch

from ..config import SUPPORTED_MODEL_TYPES, ConfigError
from ..switches import cache_root
from .dtypes import DTYPES

log = logging.getLogger("flashtree.models")

GGUF_MAGIC = b"GGUF"
CONVERTED_MARK = "flashtree_converted.json"  # written last: a directory without it is incomplete


def is_gguf(path: Path) -> bool:
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


def _need(module: str) -> None:
    import importlib.util
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"reading a .gguf file needs the '{module}' package (pip install transformers gguf "
                          "accelerate)")


def convert_gguf(src: str | Path, out: str | Path, dtype: str = "float32", weights: bool = True) -> Path:
    """Write the HF directory of the GGUF file `src` into `out` (weights stored as `dtype`).
    weights=False writes the config, generation config and tokenizer only, and marks the
    directory as reading its weights from `src` (`gguf_weights.py`): no dequantization, seconds."""
    src, out = Path(src), Path(out)
    if not src.is_file():
        raise ConfigError(f"{src}: file not found")
    if not is_gguf(src):
        raise ConfigError(f"{src}: not a GGUF file (its first bytes are not 'GGUF')")
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype '{dtype}' is not supported; use one of {', '.join(DTYPES)}")
    for m in ("transformers", "gguf", "accelerate"):
        _need(m)
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"{src}: architecture '{config.model_type}'; flashtree loads GGUF files of "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if weights:
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        tied = bool(model.config.tie_word_embeddings)
        state = {n: t.detach().to(DTYPES[dtype]).contiguous() for n, t in model.state_dict().items()
                 if not (tied and n == "lm_head.weight")}  # a tied head is the embedding, as transformers saves it
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config, generation = model.config, model.generation_config
    else:
        generation = GenerationConfig.from_model_config(config)
    raw = config.to_dict()
    raw.pop("quantization_config", None)  # the weights are plain tensors, or read from the file
    raw["torch_dtype"] = raw["dtype"] = str(DTYPES[dtype]).removeprefix("torch.")
    (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    if generation is not None:
        generation.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / CONVERTED_MARK).write_text(json.dumps({
        "source": str(src), "size": src.stat().st_size, "mtime_ns": src.stat().st_mtime_ns, "dtype": dtype,
        "weights": "safetensors" if weights else "gguf", "seconds": round(time.perf_counter() - t0, 1)},
        indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def cached_conversion(src: str | Path, weights: bool = False) -> Path:
    """The cached HF directory of `src`: its config and tokenizer, weights read from `src` at
    load (`weights_in_gguf`); weights=True also writes them dequantized in float32 (what
    transformers reads). Made on first use; a changed file, by size or modification time, again."""
    src = Path(src).resolve()
    if not is_gguf(src):
        raise ConfigError(f"{src}: not a GGUF file" if src.is_file() else f"{src}: file not found")
    st = src.stat()
    out = cache_root() / "gguf" / f"{src.stem}-{st.st_size:x}-{st.st_mtime_ns:x}{'' if weights else '.meta'}"
    mark = out / CONVERTED_MARK
    if mark.is_file():
        return out
    if weights:
        log.warning("converting %s to an HF directory in %s (once; later loads read the cache)", src.name, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    import fcntl
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process converting the same file: wait for it
        if not mark.is_file():
            convert_gguf(src, out, weights=weights)
    return out


def weights_in_gguf(model_dir: str | Path) -> Path | None:
    """The GGUF file a converted directory reads its weights from (written with weights=False),
    while that file is unchanged; None for a directory with its own weights."""
    mark = Path(model_dir) / CONVERTED_MARK
    if not mark.is_file() or json.loads(mark.read_text()).get("weights") != "gguf":
        return None
    src = gguf_source(model_dir)
    if src is None:
        raise ConfigError(f"{model_dir}: reads its weights from a GGUF file that is gone or changed; delete the "
                          f"directory and load the file again")
    return src


def requantize_gguf(src: str | Path, dst: str | Path, dtype: str = "float32") -> Path:
    """Write `src` again with every tensor dequantized to `dtype` (float32 | float16 | bfloat16),
    metadata and tensor layout as they are: the same weights llama.cpp reads unquantized (its
    text on an F32 file of the dequantized weights equals flashtree's). One-dimensional tensors
    (the norms) stay float32, as llama.cpp's own converters write them: its CPU kernels multiply
    by F32 norms only (a BF16 norm aborts the first decode). Uses the `gguf` package."""
    _need("gguf")
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize, quantize
    kinds = {"float32": GGMLQuantizationType.F32, "float16": GGMLQuantizationType.F16,
             "bfloat16": GGMLQuantizationType.BF16}
    if dtype not in kinds:
        raise ConfigError(f"dtype '{dtype}': a GGUF is rewritten as one of {', '.join(kinds)}")
    src, dst = Path(src), Path(dst)
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    file_types = {"float32": 0, "float16": 1, "bfloat16": 32}  # llama.cpp's LLAMA_FTYPE_ALL_F32 / MOSTLY_F16 / _BF16
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer writes these itself
        value = file_types[dtype] if key == "general.file_type" else field.contents()
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)
    for t in reader.tensors:
        data = dequantize(t.data, t.tensor_type).astype(np.float32)        # [..., ne0] in GGUF's layout
        kind = kinds[dtype] if len(t.shape) > 1 else GGMLQuantizationType.F32
        if kind != GGMLQuantizationType.F32:
            data = quantize(data, kind)
        writer.add_tensor(t.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def gguf_source(model_dir: str | Path) -> Path | None:
    """The GGUF file the HF directory `model_dir` was converted from (its conversion mark), while
    that file is unchanged by size and modification time; None for any other directory."""
    mark = Path(model_dir) / CONVERTED_MARK
    if not mark.is_file():
        return None
    made = json.loads(mark.read_text())
    src = Path(made.get("source", ""))
    if not src.is_file():
        return None
    st = src.stat()
    return src if (st.st_size, st.st_mtime_ns) == (made.get("size"), made.get("mtime_ns")) else None


def cached_requantization(src: str | Path, dtype: str) -> Path:
    """`src` rewritten with every tensor as `dtype` (requantize_gguf), once per file into the cache
    beside its conversion; later calls return the file (a changed source is written again)."""
    src = Path(src).resolve()
    if not is_gguf(src):
        raise ConfigError(f"{src}: not a GGUF file" if src.is_file() else f"{src}: file not found")
    st = src.stat()
    out = cache_root() / "gguf" / f"{src.stem}-{st.st_size:x}-{st.st_mtime_ns:x}.{dtype}.gguf"
    if out.is_file():
        return out
    log.warning("writing %s as %s GGUF in %s (once; later runs read the cache)", src.name, dtype, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    import fcntl
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process writing the same file: wait for it
        if not out.is_file():
            tmp = out.with_name(out.name + f".tmp{os.getpid()}")
            try:
                requantize_gguf(src, tmp, dtype)
                tmp.rename(out)  # a complete file, or none
            finally:
                tmp.unlink(missing_ok=True)
    return out


def weight_type(path: str | Path) -> str:
    """The file's weight type as llama.cpp names it, lower case: f32, bf16, q4_1, ... (its
    `general.file_type`; without one, the type most of its tensors have)."""
    _need("gguf")
    from collections import Counter

    from gguf import GGUFReader, LlamaFileType
    reader = GGUFReader(path)
    field = reader.fields.get("general.file_type")
    if field is not None:
        try:
            return LlamaFileType(field.contents()).name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
        except ValueError:
            pass  # a type this gguf package does not know: read the tensors
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    return kinds.most_common(1)[0][0].lower() if kinds else "unknown"
