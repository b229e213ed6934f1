"""`flashtree env`: what this installation can do — versions, device, dtype support, compiled
paths, available methods and sampling modes (and why not), and the model pair `LLM()` would load.

A pre-flight report in the spirit of `vllm collect-env`: it reads config files and safetensors
headers but never loads weights or runs a model, and it always exits 0 (a missing pair is
reported, not raised). `--json` prints the same report as one JSON object.
"""
from __future__ import annotations

import json
import platform
from importlib import metadata
from pathlib import Path

from .generate import add_model_arguments

PACKAGES = ("flashtree", "torch", "transformers", "tokenizers", "safetensors", "numpy", "jinja2",
            "fastapi", "uvicorn", "pydantic", "prometheus-client", "tqdm", "matplotlib", "scipy")
SAMPLING_MODES = ("greedy", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "stop_token_ids")


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args) -> int:
    report = collect(args.model, args.draft, args.device)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


# ---------------------------------------------------------------------------- collection
def collect(model: str | None = None, draft: str | None = None, device: str = "auto") -> dict:
    return {"versions": versions(), "platform": platform_info(), "device": device_info(device),
            "compiled": compiled_paths(), **model_pair(model, draft)}


def versions() -> dict[str, str | None]:
    """Installed distribution versions (None = not installed); nothing is imported."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def platform_info() -> dict:
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"system": platform.platform(), "cpu": cpu, "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_cuda_build": torch.version.cuda}


def device_info(device: str = "auto") -> dict:
    """The device 'auto' (or `device`) resolves to, and which dtypes run there and run fast."""
    import torch
    from ..models.loader import resolve_device
    cuda = torch.cuda.is_available()
    info = {"cuda_available": cuda, "cuda_devices": [], "mps_available": bool(
        getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())}
    if cuda:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["cuda_devices"].append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                         "memory_gib": round(p.total_memory / 2**30, 1)})
    try:
        dev = resolve_device(device)
    except ValueError as e:
        return {**info, "selected": None, "error": str(e), "dtypes": {}}
    info["selected"] = str(dev)
    info["dtypes"] = dtype_support(dev)
    info["auto_dtype"] = "checkpoint dtype (config.json torch_dtype)" if dev.type == "cuda" else "float32"
    return info


def dtype_support(dev) -> dict:
    """{dtype: {supported, fast, note}} for the device the engine would use."""
    import torch
    if dev.type == "cuda":
        major, _ = torch.cuda.get_device_capability(dev)
        bf16 = torch.cuda.is_bf16_supported()
        return {"float32": {"supported": True, "fast": True, "note": "TF32 matmuls only if enabled"},
                "bfloat16": {"supported": bf16, "fast": bf16 and major >= 8,
                             "note": f"compute capability {major}.x"},
                "float16": {"supported": True, "fast": major >= 7, "note": "tensor cores from 7.0"}}
    try:
        onednn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn_bf16 = False
    return {"float32": {"supported": True, "fast": True, "note": "the CPU default"},
            "bfloat16": {"supported": True, "fast": onednn_bf16,
                         "note": "native bf16 GEMMs (oneDNN/AVX512-BF16/AMX)" if onednn_bf16
                         else "no native bf16 on this CPU: emulated, slower than float32"},
            "float16": {"supported": True, "fast": False, "note": "emulated on CPU, slower than float32"}}


def compiled_paths() -> dict:
    """Stated, not probed: the engine runs eager PyTorch everywhere today."""
    return {"torch_compile": False, "cuda_graphs": False, "custom_kernels": False,
            "attention": "torch.nn.functional.scaled_dot_product_attention (eager)",
            "note": "flashtree runs eager PyTorch: no torch.compile, CUDA graphs or custom kernels yet"}


def model_pair(model: str | None, draft: str | None) -> dict:
    """The pair `LLM(model, draft)` would load, its key config, and what it makes available."""
    from ..llm import BUNDLED_DRAFTER, BUNDLED_TARGET
    bundled = model is None
    tdir = Path(model) if model else BUNDLED_TARGET
    ddir = Path(draft) if draft else (BUNDLED_DRAFTER if bundled else None)
    target = describe_target(tdir)
    drafter = describe_drafter(ddir, tdir) if ddir is not None else None
    if target["error"]:
        why = target["error"] + (" — the bundled pair is built by `flashtree train-target` and "
                                 "`flashtree train-drafter`; or pass --model DIR [--draft DIR]" if bundled else "")
        methods = {m: {"available": False, "why": why} for m in ("ar", "dflash", "ddtree")}
    else:
        methods = {"ar": {"available": True, "why": "plain decoding needs only the target"}}
        if drafter is None:
            why = "no drafter: pass --draft DIR (a DFlash checkpoint)"
        elif drafter["error"]:
            why = drafter["error"]
        else:
            why = None
        for m in ("dflash", "ddtree"):
            methods[m] = {"available": why is None, "why": why or "drafter found and matches the target"}
    ok = any(v["available"] for v in methods.values())
    sampling = {mode: {"available": ok, "why": ("verified losslessly by the one verify rule for every method"
                                                if ok else "no usable target")}
                for mode in SAMPLING_MODES}
    return {"pair": {"bundled": bundled, "target": target, "drafter": drafter},
            "methods": methods, "sampling": sampling}


def _params(path: Path) -> tuple[int, str | None]:
    """Parameter count and dtype from safetensors headers (no tensor is read)."""
    from safetensors import safe_open
    from ..models.loader import weight_files
    total, dtype = 0, None
    for f in weight_files(path):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                sl = sf.get_slice(k)
                n = 1
                for d in sl.get_shape():
                    n *= d
                total += n
                dtype = dtype or str(sl.get_dtype())
    return total, dtype


def describe_target(path: Path) -> dict:
    from ..config import ModelConfig
    out = {"path": str(path), "error": None}
    try:
        c = ModelConfig.from_dir(path)
        out.update(model_type=c.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                   num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                   num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
                   max_position_embeddings=c.max_position_embeddings,
                   tokenizer=(path / "tokenizer.json").is_file())
        out["params"], out["weights_dtype"] = _params(path)
    except (ValueError, OSError) as e:
        out["error"] = str(e) if path.is_dir() else f"{path}: model directory not found"
    return out


def describe_drafter(path: Path, target_dir: Path) -> dict:
    from ..config import DrafterConfig, ModelConfig
    out = {"path": str(path), "error": None}
    try:
        c = DrafterConfig.from_dir(path)
        out.update(block_size=c.block_size, num_hidden_layers=c.layers.num_hidden_layers,
                   target_layer_ids=list(c.target_layer_ids), mask_token_id=c.mask_token_id,
                   hidden_size=c.layers.hidden_size)
        out["params"], out["weights_dtype"] = _params(path)
        c.check_pair(ModelConfig.from_dir(target_dir))
    except (ValueError, OSError) as e:
        out["error"] = str(e) if path.is_dir() else f"{path}: drafter directory not found"
    return out


# ---------------------------------------------------------------------------- text
def render(r: dict) -> str:
    lines = ["versions"]
    lines += [f"  {k:<18} {v or 'not installed'}" for k, v in r["versions"].items()]
    lines += ["platform"] + [f"  {k:<18} {v}" for k, v in r["platform"].items()]
    d = r["device"]
    lines += ["device", f"  {'selected':<18} {d.get('selected') or d.get('error')}",
              f"  {'cuda_available':<18} {d['cuda_available']}"]
    lines += [f"  {'gpu ' + str(g['index']):<18} {g['name']} (sm {g['capability']}, {g['memory_gib']} GiB)"
              for g in d["cuda_devices"]]
    lines += [f"  {k:<18} {'yes' if v['supported'] else 'no'}, {'fast' if v['fast'] else 'slow'} ({v['note']})"
              for k, v in d.get("dtypes", {}).items()]
    lines += ["compiled paths", f"  {r['compiled']['note']}", f"  attention: {r['compiled']['attention']}"]
    lines += ["methods"] + [f"  {k:<18} {'available' if v['available'] else 'UNAVAILABLE'}: {v['why']}"
                            for k, v in r["methods"].items()]
    avail = [k for k, v in r["sampling"].items() if v["available"]]
    lines += ["sampling", f"  {', '.join(avail) if avail else 'none (no usable target)'}"]
    p = r["pair"]
    lines.append("model pair" + (" (bundled)" if p["bundled"] else ""))
    lines += _describe("target", p["target"], ("model_type", "params", "weights_dtype", "vocab_size",
                                               "hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "max_position_embeddings"))
    if p["drafter"] is None:
        lines.append("  drafter            none")
    else:
        lines += _describe("drafter", p["drafter"], ("block_size", "target_layer_ids", "num_hidden_layers",
                                                     "mask_token_id", "params"))
    return "\n".join(lines)


def _describe(name: str, d: dict, keys: tuple[str, ...]) -> list[str]:
    lines = [f"  {name:<18} {d['path']}"]
    if d["error"]:
        return lines + [f"    error: {d['error']}"]
    return lines + [f"    {k:<18} {d[k]:,}" if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)
                    else f"    {k:<18} {d.get(k)}" for k in keys if k in d]
