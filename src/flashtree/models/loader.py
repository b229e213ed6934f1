"""Load and save HF-format checkpoints (safetensors only, never pickle).

`load_target` reads a qwen3/llama/qwen2 directory (single `model.safetensors` or a sharded
`model.safetensors.index.json`); `load_drafter` reads a z-lab DFlash directory and checks it
against its target. Every failure names the file and the tensor or field at fault.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .. import switches
from ..config import ConfigError, DrafterConfig, ModelConfig
from .drafter import DFlashDrafter
from .dtypes import DTYPES
from .gguf import cached_conversion, weights_in_gguf
from .gguf_weights import load_gguf_weights
from .layers import Linear, rope_inv_freq
from .parallel import TPGroup, local_config, make_all_reduce, shard_index
from .quant import QUANTS, QuantLinear, quantize
from .target import TargetModel

log = logging.getLogger("flashtree.models")

def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but CUDA is not available; use device='cpu' or 'auto'")
    return dev


def auto_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """dtype='auto': (dtype, why). bfloat16 on CUDA and on every CPU path where flashtree's
    kernel runs: it multiplies bf16 natively on avx512_bf16 / amx, and on avx2 / avx512 it
    stores the weights in bf16 and widens them to float32 in registers — half the bytes a step
    streams. On the AVX2 path (forced on a Xeon, SmolLM2 + drafter, 16 held-out chats) that ran
    plain decoding at 73 against 51 tok/s in float32 and the default at 98 against 78, every
    forward width faster (benchmarks/cpu_paths_2026-12-06, forwards_paths_2026-12-06). float32
    where the kernel does not run (torch's own bf16 products are emulated there, slower than
    float32). FLASHTREE_DTYPE (a dtype name) overrides the choice, as FLASHTREE_COMPILE does compile's."""
    forced = switches.value("FLASHTREE_DTYPE")
    if forced and forced != "auto":
        if forced not in DTYPES:
            raise ValueError(f"FLASHTREE_DTYPE='{forced}' is not a dtype; use one of auto, {', '.join(DTYPES)}")
        return DTYPES[forced], f"FLASHTREE_DTYPE={forced}"
    if device.type == "cuda":
        return torch.bfloat16, "CUDA"
    from .. import cpu
    from . import cpu_dense
    native = cpu.bf16_native()
    if native is not None:
        return torch.bfloat16, f"the {cpu.isa()} path multiplies bf16 natively ({native})"
    if cpu_dense.available():
        return torch.bfloat16, (f"the {cpu.isa()} path: bf16 weights widened to float32 in registers by flashtree's "
                                f"kernel, half the bytes of float32 (FLASHTREE_DTYPE=float32 for float32)")
    return torch.float32, (f"the {cpu.isa()} path without flashtree's kernel ({cpu_dense.why_unavailable()}): "
                           f"bf16 products would be emulated")


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if device.type == "cpu":  # a FLASHTREE_ISA above this CPU's path is refused here, whatever the dtype
        from .. import cpu
        cpu.isa()
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return auto_dtype(device)[0]
    if dtype not in DTYPES:
        raise ValueError(f"dtype '{dtype}' is not supported; use one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def resolve_dtypes(dtype: str | torch.dtype, device: torch.device, quantized: bool,
                   cache_dtype: str | torch.dtype | None = None) -> tuple[torch.dtype, torch.dtype, str | None]:
    """(the activations' dtype, the storage dtype of float weight matrices, the KV cache and the
    drafter, why they differ or None). One dtype for both, except under dtype "auto" for a target
    whose projections are blocks (`quantized`) on the CPU: float32 activations beside bf16 storage.
    The integer kernels quantize a float32 row in any case, so bf16 activations only add a
    conversion before and after every projection and round the norms and residuals: SmolLM2 on its
    Q4_1 blocks, a compiled step of 1 / 8 tokens took 5.17 / 9.42 ms against 6.10 / 11.26 (amx) and
    5.62 / 16.17 against 6.24 / 18.27 (avx2), the drafter staying in bf16, whose float32 form runs
    slower on amx (1.87 against 1.45 ms a block; benchmarks/f32_activations_2026-12-07).
    `cache_dtype` (a compile helper rebuilding a loaded model) names the storage dtype outright."""
    act = resolve_dtype(dtype, device)
    if cache_dtype is not None:
        return act, resolve_dtype(cache_dtype, device), None
    forced = switches.value("FLASHTREE_DTYPE")
    if dtype == "auto" and quantized and device.type == "cpu" and act != torch.float32 and not (forced and forced != "auto"):
        return torch.float32, act, (f"float32 activations for projections in blocks (the integer kernels quantize "
                                    f"float32 rows); {str(act).removeprefix('torch.')} KV cache, drafter and float "
                                    f"weights")
    return act, act, None


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ConfigError(f"{index}: shard file(s) {', '.join(missing)} not found")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickled = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        hint = f" (found {', '.join(pickled)}; flashtree never unpickles — convert to safetensors)" if pickled else ""
        raise ConfigError(f"{path}: no *.safetensors weight file{hint}")
    return files


# Tensors other tools write that carry nothing flashtree needs: rotary tables (recomputed from
# the config). Anything else a checkpoint holds that the model has no parameter for is an error.
IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)


def load_state(module: torch.nn.Module, path: Path, ignorable: tuple[str, ...] = (),
               optional: tuple[str, ...] = (), tp: TPGroup | None = None) -> None:
    """Copy tensors from the safetensors files of `path` into `module`, checking names and shapes.

    Strict: a tensor the module has no parameter for (an extra or renamed weight) is an error
    naming it, unless its name ends with one of IGNORABLE_SUFFIXES or is listed in `ignorable`;
    a parameter with no tensor is an error unless listed in `optional`. With `tp`, each tensor is
    read as this rank's shard (`parallel.shard_index`: only that slice leaves the file)."""
    params = dict(module.named_parameters())
    seen: set[str] = set()
    unknown: dict[str, list[str]] = {}
    for file in weight_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name not in params:
                    if name not in ignorable and not name.endswith(IGNORABLE_SUFFIXES):
                        unknown.setdefault(file.name, []).append(name)
                    continue
                p = params[name]
                idx = shard_index(name, tuple(f.get_slice(name).get_shape()), tp) if tp is not None else None
                if idx is None:
                    t = f.get_tensor(name)
                elif idx == "zeros":
                    t = torch.zeros_like(p)
                else:
                    t = f.get_slice(name)[idx]
                if tuple(t.shape) != tuple(p.shape):
                    raise ConfigError(f"{file}: tensor '{name}' has shape {list(t.shape)}, "
                                      f"the config implies {list(p.shape)}")
                with torch.no_grad():
                    p.copy_(t.to(p.dtype))
                seen.add(name)
    if unknown:
        n = sum(len(v) for v in unknown.values())
        shown = "; ".join(f"{file}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
                          for file, names in unknown.items())
        raise ConfigError(f"{path}: {n} tensor(s) are not weights of the model its config.json describes "
                          f"(extra or renamed weights would decode wrongly, so nothing is skipped): {shown}")
    missing = [n for n in params if n not in seen and n not in optional]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ConfigError(f"{path}: weight(s) missing from the safetensors files: {shown}")


def bf16_fits_cache(bf16_bytes: int | None, cache_bytes: int | None) -> bool:
    """Whether a model's projections in bf16 stay in the last-level cache (the amx path's rule
    where AMX-INT8 tiles do not run; where they do, blocks beat bf16 either way). Where they do, a step
    reads them from the cache and the amx path's bf16 tiles verify a tree at little more than a
    step: SmolLM2's default (hybrid, budget auto) ran 190 tok/s in bf16 against 147 on its Q4_1
    blocks (benchmarks/quant_2026-12-06; 0.27 GB of bf16, 480 MB of cache). Where they do not, a
    step streams them from memory and a GGUF's blocks, a third to half of the bytes, win:
    Qwen3-1.7B-shaped Q4_0 (3.4 GB of bf16), compiled, took 53 ms a step and 106 ms a verify of 8
    in blocks against 118 and 128 ms in bf16, and holds 1 GB instead of 3.4
    (benchmarks/prefetch_2026-12-07). Unknown sizes count as not fitting."""
    return bf16_bytes is not None and cache_bytes is not None and bf16_bytes <= cache_bytes


def auto_quant(device: torch.device, bf16_bytes: int | None = None) -> tuple[str | None, str]:
    """quant='auto': ("blocks": a GGUF file's Q8_0 / Q4_0 / Q4_1 / Q4_K blocks kept, or None: float
    weights in the model's dtype; why). Blocks wherever the integer kernel runs. On the amx path
    they run on AMX-INT8 tiles (`quant.panels_ready`), which verify a tree at 1.4-1.8x a step and
    beat bf16 at every row count measured (SmolLM2 included: benchmarks/amx_int8_2026-12-07);
    without those tiles, bf16 for a model whose projections in bf16 (`bf16_bytes`; None: not
    known, as in `flashtree env`) fit the last-level cache (`bf16_fits_cache`). FLASHTREE_QUANT
    (blocks | none | q8_0 | q4_0) overrides."""
    from .. import cpu
    from . import cpu_dense, quant
    forced = switches.value("FLASHTREE_QUANT")
    if forced and forced != "auto":
        if forced not in ("blocks", "none", *QUANTS):
            raise ConfigError(f"FLASHTREE_QUANT='{forced}' is not supported; use one of auto, blocks, none, "
                              f"{', '.join(QUANTS)}")
        return (None if forced == "none" else forced), f"FLASHTREE_QUANT={forced}"
    if device.type != "cpu":
        return None, "blocks run on the CPU only"
    why = cpu_dense.why_unavailable()
    if why is not None:
        return None, f"the CPU kernel is not available ({why})"
    if quant.panels_ready():
        return "blocks", ("the amx path: a GGUF's Q8_0 / Q4_0 / Q4_1 / Q4_K blocks kept, multiplied on AMX-INT8 tiles "
                          "(a third to half the bytes of bf16 a step, and a verify of 8 rows at 1.4-1.8x a step)")
    blocks = (f"a GGUF's Q8_0 / Q4_0 / Q4_1 / Q4_K blocks kept, multiplied by the integer kernel "
              f"({torch.ops.flashtree.qdense_dot()}; a third to half the bytes of bf16 a step)")
    if not cpu.at_least("amx"):
        return "blocks", f"the {cpu.isa()} path: {blocks}"
    cache = cpu.last_level_cache_bytes()
    cache_mb = f"{cache / 1e6:.0f} MB" if cache else "of unknown size"
    if bf16_fits_cache(bf16_bytes, cache):
        return None, (f"the amx path without AMX-INT8 tiles, and the model's projections in bf16 "
                      f"({bf16_bytes / 1e6:.0f} MB) fit the last-level cache ({cache_mb}): bf16 AMX tiles verify a "
                      f"draft tree at a fraction of the blocks' cost (quant='blocks' keeps them)")
    if bf16_bytes:
        return "blocks", (f"the amx path: {blocks}, since the model's projections in bf16 ({bf16_bytes / 1e6:.0f} "
                          f"MB) exceed the last-level cache ({cache_mb})")
    return "blocks", (f"the amx path: {blocks} for a model whose projections in bf16 exceed the last-level cache "
                      f"({cache_mb}); one whose bf16 projections fit it runs in bf16")


def resolve_quant(quant: str | None, device: torch.device, bf16_bytes: int | None = None) -> str | None:
    """quant as the loader applies it: "auto" (`auto_quant`) keeps a GGUF file's Q8_0 / Q4_0 /
    Q4_1 blocks where that is faster; None / "none" runs float weights; "q8_0" / "q4_0"
    quantizes every projection at load. Blocks run on flashtree's CPU kernel only: a quant asked
    for by name without it is refused with the reason."""
    from . import cpu_dense
    quant = None if quant in (None, "none") else quant
    if quant not in (None, "auto", "blocks", *QUANTS):
        raise ConfigError(f"quant '{quant}' is not supported; use one of auto, blocks, none, {', '.join(QUANTS)}")
    if quant == "auto":
        quant = auto_quant(device, bf16_bytes)[0]
    if quant is None:
        return None
    why = "quantized weights run on the CPU only" if device.type != "cpu" else cpu_dense.why_unavailable()
    if why is None:
        return quant
    raise ConfigError(f"quant '{quant}' needs flashtree's CPU kernel, which is not available here ({why}); "
                      f"use quant='none'")


def load_target(path: str | Path, dtype="auto", device="auto", tp: TPGroup | None = None,
                quant: str | None = "auto", cache_dtype: str | None = None) -> TargetModel:
    """tp: load only rank tp.rank's shard of the target (its heads and intermediate rows); its
    layers then all-reduce their row-parallel outputs (`parallel.py`). quant: `resolve_quant`;
    a directory converted from a GGUF reads its weights from the file (`gguf_weights.py`). dtype:
    the activations', with `cache_dtype` the storage one (`resolve_dtypes`; `model.kv_dtype`)."""
    path = Path(path)
    cfg = ModelConfig.from_dir(path)
    dev = resolve_device(device)
    src = weights_in_gguf(path)
    if src is not None and tp is not None:  # shards come from a float checkpoint: the file's, dequantized once
        path, src = cached_conversion(src, weights=True), None
    with torch.device("meta"):
        model = TargetModel(local_config(cfg, tp.world) if tp is not None else cfg)
    bf16_bytes = projection_bytes(model, 2)
    qt = resolve_quant(quant, dev, bf16_bytes) if tp is None else None
    dt, store, why = resolve_dtypes(dtype, dev, qt is not None, cache_dtype)
    if dtype == "auto":
        log.info("dtype auto: %s (%s)", str(dt).removeprefix("torch."), why or auto_dtype(dev)[1])
    if quant == "auto" and src is not None:
        log.info("quant auto: %s (%s)", qt or "none", auto_quant(dev, bf16_bytes)[1])
    if src is not None:  # every parameter is set from the file: none is allocated before (blocks stay blocks)
        forms = load_gguf_weights(model, src, qt, dtype=dt, matrix_dtype=store)
        log.info("weights from %s: %s", src.name, ", ".join(f"{v} {k}" for k, v in forms.items()))
        model.model.rotary_emb.inv_freq = rope_inv_freq(cfg).float()
        model.to(dev)
    else:
        model = model.to_empty(device=dev).to(store)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.model.rotary_emb.inv_freq = rope_inv_freq(cfg).float().to(dev)  # buffers were on meta
        tied = ("lm_head.weight",) if cfg.tie_word_embeddings else ()  # a tied head is the embedding, as in HF
        load_state(model, path, ignorable=tied, optional=tied, tp=tp)
        if qt in ("q8_0", "q4_0"):
            quantize_projections(model, qt)
        for p in model.parameters():  # vectors (norms, biases) in the activations' dtype; matrices stored
            if p.dim() == 1:
                p.data = p.data.to(dt)
    if store != dt:
        model.cache_dtype = store
    if tp is not None:
        reduce = make_all_reduce()
        for layer in model.model.layers:
            layer.reduce = reduce
    return model.eval().requires_grad_(False)


def projection_bytes(model: nn.Module, itemsize: int) -> int:
    """Bytes of the weights a decoding step reads, at `itemsize` bytes a weight: every parameter
    but the input embedding, whose step reads a row per token (a tied head is counted as the
    head)."""
    named = model.named_parameters(remove_duplicate=False)  # a tied head under its own name too
    return itemsize * sum(p.numel() for n, p in named if "embed_tokens" not in n)


def drafter_quant(target: TargetModel) -> str | None:
    """What the drafter's projections run as beside `target` (`FLASHTREE_DRAFTER_QUANT` overrides):
    q8_0 blocks where the target's projections are blocks — the integer kernel multiplies a block
    of 8 drafted rows faster than bf16 (widened on AVX2) does — else its stored dtype (None)."""
    from . import cpu_dense
    forced = switches.value("FLASHTREE_DRAFTER_QUANT").lower()
    if forced in ("none", *switches.OFF):
        return None
    if forced and forced != "auto":
        if forced not in QUANTS:
            raise ConfigError(f"FLASHTREE_DRAFTER_QUANT='{forced}' is not supported; use one of auto, none, "
                              f"{', '.join(QUANTS)}")
        why = cpu_dense.why_unavailable()
        if why is not None:
            raise ConfigError(f"FLASHTREE_DRAFTER_QUANT={forced} needs flashtree's CPU kernel: {why}")
        return forced
    return "q8_0" if any(isinstance(m, QuantLinear) for m in target.modules()) else None


def load_drafter(path: str | Path, target: TargetModel, quant: str | None = "auto") -> DFlashDrafter:
    """The drafter in the target's storage dtype (`TargetModel.kv_dtype`), on its device, its
    projections in blocks of `quant` ("auto": `drafter_quant`; None: as stored — training)."""
    path = Path(path)
    cfg = DrafterConfig.from_dir(path)
    cfg.check_pair(target.config)
    p = next(target.parameters())
    with torch.device("meta"):
        model = DFlashDrafter(cfg)
    model = model.to_empty(device=p.device).to(target.kv_dtype)
    model.rotary_emb.inv_freq = rope_inv_freq(cfg.layers).float().to(p.device)
    load_state(model, path)
    quant = drafter_quant(target) if quant == "auto" else quant
    if quant is not None:
        quantize_projections(model, quant)
    return model.eval().requires_grad_(False)


def save_module(module: torch.nn.Module, config: dict, path: str | Path, skip: tuple[str, ...] = ()) -> None:
    """Write `config.json` + `model.safetensors` (contiguous, de-duplicated tensors)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {n: t.detach().contiguous().cpu() for n, t in module.state_dict().items() if n not in skip}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def quantize_projections(model: nn.Module, kind: str) -> int:
    """Every `layers.Linear` of `model` replaced by a QuantLinear of its weight in `kind` (a tied
    head gets its own blocks; embeddings stay float). Returns how many."""
    done = 0
    for name, mod in list(model.named_modules()):
        if isinstance(mod, Linear):
            parent, _, leaf = name.rpartition(".")
            bias = None if mod.bias is None else mod.bias.detach()
            setattr(model.get_submodule(parent), leaf, QuantLinear(quantize(mod.weight, kind), bias))
            done += 1
    return done
