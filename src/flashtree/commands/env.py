"""`flashtree env`: what this installation can do — versions, device, dtype support, compiled
paths, available methods and sampling modes (and why not), and the model pair `LLM()` would load.

A pre-flight report in the spirit of `vllm collect-env`: it reads config files and safetensors
headers but never loads weights or runs a model, and it always exits 0 (a missing pair is
reported, not raised). Compiled paths are probed, not stated: the attention kernel is the one
SDPA picks for the engine's call on this device, CUDA graphs are captured and replayed, and
`--probe-compile` compiles a tiny function in a subprocess (bounded by `--probe-timeout`).
`--json` prints the same report as one JSON object.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import warnings
from importlib import metadata
from pathlib import Path

from .. import switches
from .generate import add_model_arguments

PACKAGES = ("flashtree", "torch", "transformers", "tokenizers", "safetensors", "numpy", "jinja2",
            "fastapi", "uvicorn", "pydantic", "prometheus-client", "tqdm", "matplotlib", "scipy", "gguf",
            "llama-cpp-python")
SAMPLING_MODES = ("greedy", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "stop_token_ids")


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--probe-compile", action="store_true",
                   help="compile and run a tiny function with torch.compile (in a subprocess; can take a minute)")
    p.add_argument("--probe-timeout", type=float, default=180.0,
                   help="seconds before --probe-compile gives up (default 180)")


def run(args) -> int:
    kv = {"kv_cache_tokens": args.kv_cache_tokens, "page_size": args.page_size,
          "enable_prefix_caching": args.enable_prefix_caching, "max_num_batched_tokens": args.max_num_batched_tokens}
    report = collect(args.model, args.draft, args.device,
                     compile_timeout=args.probe_timeout if args.probe_compile else None, kv_options=kv)
    if getattr(args, "threads", None):  # --threads: what a load with it would use
        report["threads"] = report["cpu_path"]["threads"] = args.threads
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


# ---------------------------------------------------------------------------- collection
def collect(model: str | None = None, draft: str | None = None, device: str = "auto",
            compile_timeout: float | None = None, kv_options: dict | None = None) -> dict:
    """compile_timeout: seconds for the torch.compile probe; None skips it (the slow one)."""
    pair = model_pair(model, draft)
    dev = device_info(device)
    path = cpu_path()
    return {"isa": path["isa"], "dtype": dev.get("auto_dtype"), "quant": dev.get("auto_quant"),
            "activations": dev.get("auto_activations"), "threads": path["threads"],
            "cpu_path": path, "versions": versions(), "platform": platform_info(), "device": dev,
            "compiled": compiled_paths(dev.get("selected"), pair["pair"]["target"], compile_timeout),
            "kv_cache": kv_cache(pair["pair"], kv_options or {}, dev.get("auto_dtype") or "float32"),
            "switches": switches.current(), **pair}


def kv_cache(pair: dict, options: dict, dtype: str = "float32") -> dict:
    """The paged KV cache `LLM(**options)` would allocate for this pair in `dtype` (the model's, as
    dtype "auto" picks it): capacity in tokens, pages, bytes (target + drafter context + kept drafter
    features), and what one sequence may need."""
    import torch

    from ..engine.engine_config import (
        DEFAULT_MAX_NUM_BATCHED_TOKENS,
        EngineConfig,
        available_memory,
        kv_bytes_per_token,
        kv_cache_plan,
    )
    t, d = pair["target"], pair["drafter"]
    if t["error"]:
        return {"error": t["error"]}
    from ..errors import UserError
    try:
        cfg = EngineConfig(**{k: v for k, v in options.items() if v is not None})
    except UserError as e:
        return {"error": str(e)}
    drafter = d if d is not None and not d["error"] else None
    row = kv_bytes_per_token(getattr(torch, dtype).itemsize, t["num_hidden_layers"], t["num_key_value_heads"],
                             t["head_dim"], *((drafter["num_hidden_layers"], drafter["num_key_value_heads"],
                                               drafter["head_dim"], len(drafter["target_layer_ids"])
                                               * drafter["hidden_size"]) if drafter else ()))
    per_seq, tokens = kv_cache_plan(cfg, t["max_position_embeddings"], drafter["block_size"] if drafter else 0,
                                    row, available_memory(torch.device("cpu")))
    if tokens < per_seq:
        return {"error": f"kv_cache_tokens={tokens} cannot hold one sequence at the context limit ({per_seq} "
                         f"tokens with one round's tree): LLM() refuses it"}
    pages = -(-tokens // cfg.page_size)
    return {"error": None, "kv_cache_tokens": pages * cfg.page_size, "page_size": cfg.page_size, "pages": pages,
            "mib": round((pages + 1) * cfg.page_size * row / 2**20, 1), "dtype": dtype, "per_sequence_tokens": per_seq,
            "max_batch_size": cfg.max_batch_size, "prefix_caching": cfg.enable_prefix_caching,
            "max_num_batched_tokens": cfg.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS}


def cpu_path() -> dict:
    """The instruction path and compute threads flashtree runs with here (`cpu.py`), and why."""
    from .. import cpu
    native = cpu.native_isa()
    try:
        path, why = cpu.isa(), "FLASHTREE_ISA" if switches.value("FLASHTREE_ISA") not in ("", "auto") else \
            "the CPU's highest"
    except ValueError as e:
        path, why = None, str(e)
    try:
        threads, policy = cpu.threads(), cpu.thread_policy()
    except ValueError as e:
        threads, policy = None, str(e)
    return {"isa": path, "why": why, "native_isa": native, "paths": list(cpu.PATHS),
            "threads": threads, "cores": cpu.cores(), "thread_policy": policy,
            "openmp": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", *cpu.WAIT_ENV)}}


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
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
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
    from ..models.loader import auto_dtype
    try:
        dt, why = auto_dtype(dev)
    except ValueError as e:  # a wrong FLASHTREE_ISA or FLASHTREE_DTYPE
        info["auto_dtype"], info["auto_dtype_why"] = None, str(e)
        return info
    info["auto_dtype"], info["auto_dtype_why"] = str(dt).removeprefix("torch."), why
    from ..models.loader import auto_quant, resolve_dtypes
    info["auto_quant"], info["auto_quant_why"] = auto_quant(dev)  # None: float weights in the dtype
    act, _, why = resolve_dtypes("auto", dev, info["auto_quant"] is not None)
    # the activations' dtype under dtype auto (with quant auto's blocks): float32 beside bf16 storage
    info["auto_activations"] = str(act).removeprefix("torch.")
    info["auto_activations_why"] = why or "the dtype's own"
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


# ---------------------------------------------------------------------------- compiled paths
def compiled_paths(device: str | None, target: dict | None = None, compile_timeout: float | None = None) -> dict:
    """What runs compiled or fused here, each probed on `device` (None: the device did not resolve)."""
    if device is None:
        why = "the device did not resolve"
        return {"engine": engine_compile_option("cpu"), "attention": {"kernel": None, "runs": {}, "why": why},
                "cpu_kernel": {"used": False, "why": why}, "cuda_graphs": {"works": False, "why": why},
                "torch_compile": {"probed": False, "works": None, "why": why}}
    return {"engine": engine_compile_option(device), "attention": attention_kernel(device, target or {}),
            "cpu_kernel": cpu_projection_kernel(device), "cuda_graphs": cuda_graphs(device), "torch_compile": torch_compile(device, compile_timeout)}


def engine_compile_option(device: str = "cpu") -> dict:
    """Whether this build's LLM() takes compile= (read from its signature) and what "auto" means here."""
    from ..engine.model_runner import resolve_compile
    from ..llm import LLM
    has = "compile" in inspect.signature(LLM).parameters
    if not has:
        return {"compile_option": False,
                "note": "LLM() has no compile option in this build: every forward runs eager PyTorch"}
    import torch

    from ..engine import aot_graphs
    auto = resolve_compile("auto", torch.device(device))
    compiled = (f"AOTInductor packages, one per shape bucket, compiled once and cached in {aot_graphs.cache_dir()}"
                if device == "cpu" else "torch.compile (inductor), compiled at load")
    why = compiled if auto else "eager PyTorch (FLASHTREE_COMPILE=0 or no C++ compiler for inductor)"
    return {"compile_option": True, "auto": auto, "cache_dir": str(aot_graphs.cache_dir()) if device == "cpu" else None,
            "note": f"LLM(compile='auto') runs {why}; compile=True/False forces it (--compile/--no-compile)"}


def cpu_projection_kernel(device: str) -> dict:
    """Whether the model runner's projections take the CPU kernel (models/cpu_dense.py) here: built
    (or loaded from its cache) and checked against F.linear on a small product."""
    if device != "cpu":
        return {"used": False, "why": f"only float32 on the CPU; {device} runs F.linear"}
    import torch
    import torch.nn.functional as F

    from ..models import cpu_dense
    if not cpu_dense.available():
        return {"used": False, "why": cpu_dense.why_unavailable()}
    x, w = torch.randn(9, 64), torch.randn(40, 64)
    ok = torch.allclose(cpu_dense.dense(x, w, cpu_dense.pack(w), None), F.linear(x, w), rtol=1e-4, atol=1e-4)
    if not ok:
        return {"used": False, "why": "built, but its result disagreed with F.linear: not used by this report's check"}
    bf16 = cpu_dense.bf16_path()
    return {"used": True, "why": f"float32 projections of up to {cpu_dense.MAX_ROWS} rows (AVX2/FMA)"
            + (f"; bfloat16 ones on {bf16}" if bf16 else "")}


SDPA_KERNELS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def attention_kernel(device: str, target: dict) -> dict:
    """Run the engine's attention call (bool tree mask, GQA, the target's head_dim) on a tiny input:
    which SDPA kernels can run it, and the one SDPA picks by default."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dev = torch.device(device)
    dtype = torch.float32 if dev.type != "cuda" else (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    D = target.get("head_dim") or 64
    H, Hkv = target.get("num_attention_heads") or 4, target.get("num_key_value_heads") or 2
    q = torch.randn(1, H, 5, D, device=dev, dtype=dtype)                # [B, H, T, D]
    k, v = (torch.randn(1, Hkv, 9, D, device=dev, dtype=dtype) for _ in range(2))
    mask = torch.ones(1, 1, 5, 9, dtype=torch.bool, device=dev).tril(4)  # a prefix plus a tree
    args = dict(attn_mask=mask, enable_gqa=H != Hkv)
    runs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each refusing kernel warns why
        for name in SDPA_KERNELS:
            backend = getattr(SDPBackend, name, None)
            if backend is None:
                continue
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(q, k, v, **args)
                runs[name.lower()] = True
            except RuntimeError:
                runs[name.lower()] = False
    try:  # the choice SDPA makes under the current settings (a private helper: absent = unknown)
        kernel = SDPBackend(torch._fused_sdp_choice(q, k, v, **args)).name.lower()
    except (AttributeError, RuntimeError, TypeError, ValueError):
        kernel = None
    return {"kernel": kernel, "runs": runs, "dtype": str(dtype).removeprefix("torch."), "head_dim": D}


def cuda_graphs(device: str) -> dict:
    """Capture and replay a one-op CUDA graph on the device."""
    import torch
    dev = torch.device(device)
    if dev.type != "cuda":
        return {"works": False, "why": f"no CUDA graphs on {dev.type}"}
    try:
        x = torch.zeros(8, device=dev)
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            x * 2 + 1  # warm up outside the capture
        torch.cuda.current_stream(dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2 + 1
        x.fill_(1.0)
        g.replay()
        torch.cuda.synchronize(dev)
        ok = bool((y == 3).all())
    except Exception as e:  # a driver or capture failure is a finding, not a crash
        return {"works": False, "why": f"{type(e).__name__}: {e}"}
    return {"works": ok, "why": "captured and replayed" if ok else "replay gave a wrong result"}


COMPILE_PROBE = """
import json, sys, time, torch
x = torch.randn(64, device=sys.argv[1])
t0 = time.perf_counter()
y = torch.compile(lambda t: torch.sin(t) * 2 + 1)(x)
ok = torch.allclose(y, torch.sin(x) * 2 + 1)
print(json.dumps({"works": bool(ok), "seconds": round(time.perf_counter() - t0, 1)}))
"""


def torch_compile(device: str, timeout: float | None) -> dict:
    """Toolchain torch.compile needs (inductor: a C++ compiler on CPU, triton on CUDA); with a
    timeout, compile and run a tiny function in a subprocess so a hang or crash stays contained."""
    import torch
    dev = torch.device(device)
    if dev.type == "cuda":
        tool = "triton" if importlib.util.find_spec("triton") else None
        missing = "triton is not installed"
    else:
        tool = next((shutil.which(c) for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c and shutil.which(c)), None)
        missing = "no C++ compiler on PATH (g++, c++, clang++ or $CXX)"
    out = {"probed": timeout is not None, "works": None, "toolchain": tool,
           "why": missing if tool is None else f"toolchain {tool}; --probe-compile compiles a tiny function"}
    if timeout is None:
        return out
    # its own session, so a timeout also ends inductor's compile workers
    proc = subprocess.Popen([sys.executable, "-c", COMPILE_PROBE, device], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=os.name == "posix")
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.communicate()
        return {**out, "why": f"timed out after {timeout:g} s"}
    lines = stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        err = (stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return {**out, "works": False, "why": err[:300]}
    res = json.loads(lines[-1])
    return {**out, "works": res["works"], "seconds": res["seconds"],
            "why": "compiled and matched eager" if res["works"] else "compiled output differs from eager"}


def model_pair(model: str | None, draft: str | None) -> dict:
    """The pair `LLM(model, draft)` would load, its key config, and what it makes available."""
    from ..models.registry import resolve
    from ..speculative.proposer import METHODS, proposer_class
    bundled = model is None
    try:
        found = resolve(model, draft)
        tdir, ddir = found.target, found.drafter
    except ValueError:  # reported below as the target's error
        tdir, ddir = Path(str(model)), Path(draft) if draft else None
    target = describe_target(tdir)
    drafter = describe_drafter(ddir, tdir) if ddir is not None else None
    if target["error"]:
        why = target["error"] + (" — the bundled pair is built by `flashtree train-target` and "
                                 "`flashtree train-drafter`; or pass --model DIR [--draft DIR]" if bundled else "")
        methods = {m: {"available": False, "why": why} for m in METHODS}
    else:
        if drafter is None:
            why = "no drafter: pass --draft DIR (a DFlash checkpoint)"
        elif drafter["error"]:
            why = drafter["error"]
        else:
            why = None
        methods = {}
        for m in METHODS:
            cls = proposer_class(m)
            ok = not cls.needs_drafter or why is None
            methods[m] = {"available": ok, "why": cls.summary if ok else why}
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
                   hidden_size=c.layers.hidden_size, num_key_value_heads=c.layers.num_key_value_heads,
                   head_dim=c.layers.head_dim,
                   draft_vocab=len(c.draft_vocab) if c.draft_vocab is not None else "the whole vocabulary")
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
    c = r["cpu_path"]
    lines += ["cpu path", f"  {'isa':<18} {c['isa'] or 'error: ' + c['why']} ({c['why'] if c['isa'] else ''}"
              f"{'; ' if c['isa'] else ''}this CPU: {c['native_isa']}; FLASHTREE_ISA forces a lower one)",
              f"  {'threads':<18} {c['threads']} of {c['cores']} cores, policy {c['thread_policy']} "
              f"(FLASHTREE_THREADS, FLASHTREE_THREAD_POLICY); OpenMP "
              + ", ".join(f"{k}={v}" for k, v in c["openmp"].items() if v is not None)]
    d = r["device"]
    lines += ["device", f"  {'selected':<18} {d.get('selected') or d.get('error')}",
              f"  {'cuda_available':<18} {d['cuda_available']}"]
    lines += [f"  {'gpu ' + str(g['index']):<18} {g['name']} (sm {g['capability']}, {g['memory_gib']} GiB)"
              for g in d["cuda_devices"]]
    lines += [f"  {k:<18} {'yes' if v['supported'] else 'no'}, {'fast' if v['fast'] else 'slow'} ({v['note']})"
              for k, v in d.get("dtypes", {}).items()]
    if "auto_quant_why" in d:
        lines += [f"  {'quant auto':<18} {d['auto_quant'] or 'none (float weights)'}: {d['auto_quant_why']}",
                  f"  {'activations':<18} {d['auto_activations']}: {d['auto_activations_why']}"]
    lines += _render_compiled(r["compiled"])
    lines += ["methods"] + [f"  {k:<18} {'available' if v['available'] else 'UNAVAILABLE'}: {v['why']}"
                            for k, v in r["methods"].items()]
    avail = [k for k, v in r["sampling"].items() if v["available"]]
    lines += ["sampling", f"  {', '.join(avail) if avail else 'none (no usable target)'}"]
    kv = r["kv_cache"]
    lines += ["kv cache", f"  {'error':<18} {kv['error']}"] if kv["error"] else [
        "kv cache", f"  {'capacity':<18} {kv['kv_cache_tokens']:,} tokens in {kv['pages']:,} pages of "
        f"{kv['page_size']} ({kv['mib']} MiB, {kv['dtype']}; --kv-cache-tokens, --page-size)",
        f"  {'per sequence':<18} up to {kv['per_sequence_tokens']:,} tokens (the context limit + one round's tree)",
        f"  {'prefix caching':<18} {'on' if kv['prefix_caching'] else 'off'}; prompts prefilled "
        f"{kv['max_num_batched_tokens']} tokens a step"]
    lines += ["switches"] + [f"  {k:<22} {_switch(k, v)}" for k, v in r["switches"].items()]
    p = r["pair"]
    lines.append("model pair" + (" (bundled)" if p["bundled"] else ""))
    lines += _describe("target", p["target"], ("model_type", "params", "weights_dtype", "vocab_size",
                                               "hidden_size", "num_hidden_layers", "num_attention_heads",
                                               "num_key_value_heads", "max_position_embeddings"))
    if p["drafter"] is None:
        lines.append("  drafter            none")
    else:
        lines += _describe("drafter", p["drafter"], ("block_size", "target_layer_ids", "num_hidden_layers",
                                                     "mask_token_id", "draft_vocab", "params"))
    return "\n".join(lines)


def _render_compiled(c: dict) -> list[str]:
    a, k, g, t = c["attention"], c["cpu_kernel"], c["cuda_graphs"], c["torch_compile"]
    runs = ", ".join(k for k, ok in a["runs"].items() if ok) or "none"
    compiled = {True: "works", False: "FAILS", None: "not run" if not t["probed"] else "unknown"}[t["works"]]
    return ["compiled paths", f"  {'engine':<18} {c['engine']['note']}",
            f"  {'attention':<18} SDPA picks {a['kernel'] or 'unknown'} (runs: {runs})",
            f"  {'cpu_kernel':<18} {'used' if k['used'] else 'not used'}: {k['why']}",
            f"  {'cuda_graphs':<18} {'works' if g['works'] else 'no'}: {g['why']}",
            f"  {'torch_compile':<18} {compiled}: {t['why']}" + (f" ({t['seconds']} s)" if "seconds" in t else "")]


def _switch(name: str, v: str | None) -> str:
    """A switch's line: its value and what it does. An on-by-default one ("off: ..." in SWITCHES)
    says whether it is on now, and what turning it off does."""
    what, shown = switches.SWITCHES[name], "unset" if v is None else repr(v)
    if not what.startswith("off: "):
        return f"{shown}: {what}"
    return f"{shown} = {'off' if switches.is_off(name) else 'on'}; set to 0 / false / no / off: {what[5:]}"


def _describe(name: str, d: dict, keys: tuple[str, ...]) -> list[str]:
    lines = [f"  {name:<18} {d['path']}"]
    if d["error"]:
        return lines + [f"    error: {d['error']}"]
    return lines + [f"    {k:<18} {d[k]:,}" if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)
                    else f"    {k:<18} {d.get(k)}" for k in keys if k in d]
