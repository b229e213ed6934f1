"""Every CPU instruction path as a target (cpu.py): the path's rule, FLASHTREE_ISA forcing a lower
one (kernels, dtype auto and torch's dispatch together), the threads that follow the free cores,
and the KV pool that commits memory as rows are written."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
import torch

from flashtree import cpu
from flashtree.engine.engine_config import (
    EngineConfig,
    kv_bytes_per_token,
    kv_cache_plan,
)
from flashtree.engine.kv_cache import lazy_zeros
from flashtree.models import cpu_dense

AVX2 = frozenset({"avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
BF16 = AVX512 | {"avx512_bf16"}
AMX = BF16 | {"amx_tile", "amx_bf16"}


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "amd64"), reason="the paths are x86-64's")
@pytest.mark.parametrize("flags, path", [(frozenset({"sse4_2"}), cpu.NONE), (AVX2, "avx2"), (AVX512, "avx512"),
                                         (BF16, "avx512_bf16"), (AMX, "amx"),
                                         (AVX2 | {"avx512_bf16", "amx_tile", "amx_bf16"}, "avx2")])
def test_native_path_needs_every_lower_paths_flags(flags, path):
    assert cpu.native_isa(flags) == path


def test_a_forced_path_may_be_lower_never_higher_nor_unknown():
    assert cpu.resolve_isa("", "amx") == "amx" and cpu.resolve_isa("auto", "avx2") == "avx2"
    assert cpu.resolve_isa("avx2", "amx") == "avx2" and cpu.resolve_isa("avx512_bf16", "amx") == "avx512_bf16"
    with pytest.raises(ValueError, match="above this CPU's instructions .up to avx2"):
        cpu.resolve_isa("amx", "avx2")
    with pytest.raises(ValueError, match="not a path; use one of auto, avx2, avx512, avx512_bf16, amx"):
        cpu.resolve_isa("avx3", "amx")
    with pytest.raises(ValueError, match="none of them"):
        cpu.resolve_isa("avx2", cpu.NONE)


def test_free_cores_counts_what_other_processes_used():
    assert cpu.free_cores(2, 0.0, 1.0) == 2
    assert cpu.free_cores(2, 0.67, 1.0) == 1   # a busy neighbour beside two of our threads
    assert cpu.free_cores(2, 1.0, 1.0) == 1
    assert cpu.free_cores(2, 2.0, 1.0) == 1    # never fewer than one
    assert cpu.free_cores(8, 3.0, 1.0) == 5
    assert cpu.free_cores(4, -0.1, 1.0) == 4 and cpu.free_cores(4, 1.0, 0.0) == 4


def test_the_governor_follows_free_cores_within_its_most_and_only_between_periods():
    applied, free = [], iter([1, 1, 2, 5])
    gov = cpu.ThreadGovernor(2, applied.append, free=lambda: next(free), period=0.0)
    assert applied == [2]
    assert [gov(), gov(), gov(), gov()] == [1, 1, 2, 2]  # 5 free is capped at the most, 2
    assert applied == [2, 1, 2]                            # set only when the count changes
    slow = cpu.ThreadGovernor(2, applied.append, free=lambda: 1, period=3600.0)
    assert slow() == 2                                     # not asked again within its period
    fixed = cpu.ThreadGovernor(2, applied.append, free=None)
    assert fixed() == 2


def test_free_cores_reads_proc_and_stays_in_range():
    reader = cpu.FreeCores(cpu.cores())
    assert 1 <= reader() <= cpu.cores()


def test_thread_count_switch_is_checked(monkeypatch):
    monkeypatch.setenv("FLASHTREE_THREADS", "3")
    assert cpu.threads() == 3
    monkeypatch.setenv("FLASHTREE_THREADS", "zero")
    with pytest.raises(ValueError, match="FLASHTREE_THREADS='zero' is not a thread count"):
        cpu.threads()
    monkeypatch.setenv("FLASHTREE_THREAD_POLICY", "greedy")
    with pytest.raises(ValueError, match="use one of follow, fixed"):
        cpu.thread_policy()
    with pytest.raises(Exception, match="threads must be a positive integer"):
        EngineConfig(threads=0)


def _executable_paths() -> list[str]:
    native = cpu.native_isa()
    return [] if native == cpu.NONE else list(cpu.PATHS[:cpu.PATHS.index(native) + 1])


PATH_PROBE = r"""
import json, torch, torch.nn.functional as F
from flashtree import cpu
from flashtree.models import cpu_dense, loader
assert cpu_dense.available(), cpu_dense.why_unavailable()
g = torch.Generator().manual_seed(0)
out = {"isa": cpu.isa(), "aten": torch.backends.cpu.get_cpu_capability(),
       "auto_dtype": str(loader.auto_dtype(torch.device("cpu"))[0]), "bf16_path": cpu_dense.bf16_path(), "err": {}}
for dt in (torch.float32, torch.bfloat16):
    w = torch.randn(72, 100, generator=g).to(dt); b = torch.randn(72, generator=g).to(dt)
    packed = cpu_dense.pack(w)
    out.setdefault("layouts", {})[str(dt)] = packed.dim()
    for m in (1, 9, 17):
        x = torch.randn(m, 100, generator=g).to(dt)
        y = cpu_dense.dense(x, w, packed, b).float()
        ref = F.linear(x.double(), w.double(), b.double()).float()
        out["err"][f"{dt} {m}"] = float(((y - ref).abs() / (1 + ref.abs())).max())
        rows = torch.stack([cpu_dense.dense(x[i:i + 1], w, packed, b)[0] for i in range(m)])
        assert torch.equal(rows, cpu_dense.dense(x, w, packed, b)), "a row's result depends on its batch"
from flashtree.models import quant
for kind in quant.KINDS:  # the blocks' kernel on this path (AMX tiles on amx): its float64 model, batch invariance
    w = quant.interleave(quant.quantize(torch.randn(40, 288, generator=g), kind))
    for m in (1, 9, 17):
        x = torch.randn(m, 288, generator=g)
        y = torch.ops.flashtree.qdense(x, w.qs, w.d, w.m, None)
        ref = quant.reference(x, w)
        out["err"][f"{kind} {m}"] = float(abs(y.double().numpy() - ref).max() / abs(ref).max())
        rows = torch.cat([torch.ops.flashtree.qdense(x[i:i + 1], w.qs, w.d, w.m, None) for i in range(m)])
        assert torch.equal(rows, y), "a row's result depends on its batch"
out["panels"] = quant.panels_ready()  # AMX-INT8 tiles: what the amx path's projections in blocks take
for kind in quant.KINDS if out["panels"] else ():
    w = quant.quantize(torch.randn(40, 288, generator=g), kind)
    p = quant.to_panels(w)
    for m in (1, 9, 17):
        x = torch.randn(m, 288, generator=g)
        y = torch.ops.flashtree.qdense_panels(x, p.qs, p.d, p.m, None, p.n)
        ref = quant.reference(x, w)
        out["err"][f"{kind} tiles {m}"] = float(abs(y.double().numpy() - ref).max() / abs(ref).max())
        rows = torch.cat([torch.ops.flashtree.qdense_panels(x[i:i + 1], p.qs, p.d, p.m, None, p.n) for i in range(m)])
        assert torch.equal(rows, y), "a row's result depends on its batch"
print(json.dumps(out))
"""


@pytest.mark.parametrize("path", _executable_paths())
def test_each_path_this_cpu_runs_forces_kernels_dtype_and_torch(path):
    env = {**os.environ, "FLASHTREE_ISA": path}
    env.pop("ATEN_CPU_CAPABILITY", None)
    env.pop("FLASHTREE_DTYPE", None)
    r = subprocess.run([sys.executable, "-c", PATH_PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["isa"] == path
    assert out["aten"] == ("AVX2" if path == "avx2" else "AVX512")
    bf16 = path in ("avx512_bf16", "amx")
    assert out["auto_dtype"] == "torch.bfloat16"  # natively, or stored in bf16 and widened by the kernel
    assert out["layouts"]["torch.bfloat16"] == (4 if bf16 else 3)  # k-pair panels only where vdpbf16ps runs
    assert (out["bf16_path"] or "").startswith("AMX") == (path == "amx")
    assert out["panels"] == (path == "amx" and "amx_int8" in (cpu.cpu_flags() or ()))
    for key, err in out["err"].items():
        assert err < (1e-5 if "float32" in key or key.startswith("q") else 2e-2), (key, err)


QUANT_PROBE = r"""
import hashlib, json, torch
from flashtree.models import cpu_dense, quant
assert cpu_dense.available(), cpu_dense.why_unavailable()
g = torch.Generator().manual_seed(0)
out = {"dot": torch.ops.flashtree.qdense_dot(), "sha": {}}
for kind in quant.KINDS:  # 17 blocks: two runs of eight and a tail
    w = quant.interleave(quant.quantize(torch.randn(40, 544, generator=g), kind))
    for m in (1, 5, 9):
        x = torch.randn(m, 544, generator=g)
        y = torch.ops.flashtree.qdense(x, w.qs, w.d, w.m, None)
        out["sha"][f"{kind} {m}"] = hashlib.sha1(y.numpy().tobytes()).hexdigest()
        if w.m is not None:  # float32 scales (a Q4_K's form) holding the same values: the same bits
            y32 = torch.ops.flashtree.qdense(x, w.qs, w.d.float(), w.m.float(), None)
            assert torch.equal(y32, y), "float32 scales changed the sums"
print(json.dumps(out))
"""


@pytest.mark.skipif(not _executable_paths(), reason="no x86-64 path with AVX2 on this CPU")
def test_the_blocks_kernel_gives_the_same_bits_on_every_path():
    """The blocks' integer sums are exact whichever instruction makes them (maddubs + madd on AVX2,
    vpdpbusd where AVX512-VNNI runs), so every path gives the same bits; and each path uses the
    instruction its rule names (a path that silently fell back would pass the bits alone)."""
    flags = cpu.cpu_flags() or frozenset()
    seen = {}
    for path in _executable_paths():
        env = {**os.environ, "FLASHTREE_ISA": path}
        r = subprocess.run([sys.executable, "-c", QUANT_PROBE], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        vnni = path != "avx2" and {"avx512_vnni", "avx512vl"} <= flags
        assert out["dot"] == ("vpdpbusd" if vnni else "maddubs"), (path, out["dot"])
        seen[path] = out["sha"]
    assert all(sha == seen["avx2"] for sha in seen.values()), seen


def test_a_path_above_the_cpu_is_refused_at_load():
    if cpu.native_isa() == "amx":
        pytest.skip("this CPU runs every path")
    base = {k: v for k, v in os.environ.items() if k != "FLASHTREE_DTYPE"}  # (the suite sets it)
    for dtype, forced in (("auto", None), ("auto", "float32"), ("float32", None), ("bfloat16", None)):
        env = {**base, "FLASHTREE_ISA": "amx", **({"FLASHTREE_DTYPE": forced} if forced else {})}
        r = subprocess.run([sys.executable, "-c", "import flashtree, torch; from flashtree.models import loader; "
                            f"loader.resolve_dtypes({dtype!r}, torch.device('cpu'), False)"], env=env,
                           capture_output=True, text=True)
        assert r.returncode != 0 and "above this CPU's instructions" in r.stderr, (dtype, forced, r.stderr[-500:])


def test_env_json_names_path_dtype_quant_and_threads():
    env = {**os.environ, "FLASHTREE_ISA": "avx2", "FLASHTREE_THREADS": "1"}
    env.pop("FLASHTREE_DTYPE", None)
    r = subprocess.run([sys.executable, "-m", "flashtree.cli", "env", "--json", "--model", "tiny-code"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    if cpu.native_isa() == cpu.NONE:
        assert report["isa"] is None
        return
    assert report["isa"] == "avx2" and report["dtype"] == "bfloat16" and report["threads"] == 1
    assert report["cpu_path"]["native_isa"] == cpu.native_isa()
    assert report["quant"] == ("blocks" if cpu_dense.available() else None)  # the avx2 path keeps a GGUF's blocks
    assert report["device"]["auto_quant_why"]
    assert report["platform"]["cpu_capability"] == "AVX2"


def test_kv_pool_is_capped_by_memory_and_never_below_one_sequence():
    cfg = EngineConfig(max_batch_size=8)
    cap, tokens = kv_cache_plan(cfg, 8192, 16)
    assert tokens == 8 * cap
    row = kv_bytes_per_token(4, 30, 3, 64)
    assert row == 4 * 2 * 30 * 3 * 64
    _, capped = kv_cache_plan(cfg, 8192, 16, row, available_bytes=2 * 2**30)
    assert cap <= capped < 8 * cap and capped * row <= 2**30
    _, floor = kv_cache_plan(cfg, 8192, 16, row, available_bytes=1)
    assert floor == cap
    _, given = kv_cache_plan(EngineConfig(kv_cache_tokens=100_000), 8192, 16, row, available_bytes=1)
    assert given == 100_000


def test_the_kv_pool_commits_memory_only_where_rows_are_written():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    pool = lazy_zeros((30, 100_000, 3, 64), torch.float32, "cpu")  # 2.3 GB
    assert pool.is_contiguous() and pool.data_ptr() % 64 == 0
    pool[:, :1000] = 1.0
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < 200 * 1024, f"{grown} KiB resident for 23 MB written into a 2.3 GB pool"
    assert float(pool[:, 1000:1100].abs().sum()) == 0.0 and float(pool[:, :1000].sum()) == 30 * 1000 * 192


def test_quant_auto_keeps_blocks_but_for_a_cached_bf16_model_on_amx_without_int8_tiles(monkeypatch):
    """The measured rule (loader.auto_quant): blocks on every kernel path, on AMX-INT8 tiles where
    they run; on amx without them, bf16 for a model whose bf16 projections fit the last-level
    cache; FLASHTREE_QUANT overrides, a wrong value is refused."""
    from flashtree.models import loader, quant
    if not cpu_dense.available():
        pytest.skip("no CPU kernel: quant auto is float everywhere")
    monkeypatch.delenv("FLASHTREE_QUANT", raising=False)
    cache = cpu.last_level_cache_bytes()
    small, large = (cache // 2, 2 * cache) if cache else (None, None)
    q, why = loader.auto_quant(torch.device("cpu"))  # no model: blocks, and the rule in words
    assert q == "blocks" and why
    assert loader.auto_quant(torch.device("cpu"), large)[0] == "blocks"
    bf16_rule = cpu.at_least("amx") and not quant.panels_ready()
    assert (loader.auto_quant(torch.device("cpu"), small)[0] is None) == (bf16_rule and cache is not None)
    assert ("AMX-INT8 tiles" in why) == quant.panels_ready()
    assert loader.bf16_fits_cache(270_000_000, 480 << 20) and not loader.bf16_fits_cache(3_400_000_000, 480 << 20)
    assert not loader.bf16_fits_cache(None, 480 << 20) and not loader.bf16_fits_cache(1, None)
    monkeypatch.setenv("FLASHTREE_QUANT", "q8_0")
    assert loader.resolve_quant("auto", torch.device("cpu")) == "q8_0"
    assert loader.resolve_quant("none", torch.device("cpu")) is None  # an explicit choice wins
    monkeypatch.setenv("FLASHTREE_QUANT", "q3")
    with pytest.raises(Exception, match="FLASHTREE_QUANT='q3' is not supported"):
        loader.resolve_quant("auto", torch.device("cpu"))


def test_cache_sizes_read_as_sysfs_writes_them():
    assert cpu.cache_size("491520K\n") == 480 << 20
    assert cpu.cache_size("32M") == 32 << 20 and cpu.cache_size("512") == 512
    assert cpu.cache_size("") is None and cpu.cache_size("big") is None
    size = cpu.last_level_cache_bytes()
    assert size is None or size >= 1 << 20


def test_a_step_reads_a_tied_head_once_and_no_embedding():
    from flashtree.config import ModelConfig
    from flashtree.models import loader
    from flashtree.models.target import TargetModel
    def model(tied):
        cfg = ModelConfig(model_type="llama", vocab_size=100, hidden_size=8, intermediate_size=16,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                          tie_word_embeddings=tied)
        with torch.device("meta"):
            return TargetModel(cfg)
    tied, untied = model(True), model(False)
    every = sum(p.numel() for p in tied.parameters())  # the tied matrix once
    assert loader.projection_bytes(tied, 2) == 2 * every  # counted as the head
    assert loader.projection_bytes(untied, 1) == sum(p.numel() for p in untied.parameters()) - 100 * 8
