"""Weights kept in GGUF's blocks of 32: Q8_0, Q4_0 and Q4_1 as files hold them or quantized at load,
and Q4_K as its sub-blocks of 32 (float32 scales and offsets: exact).

`Blocks` is one weight [N, K]: quants `qs` ([N, K] int8 for q8, [N, K/2] uint8 nibbles for q4,
each 16 bytes holding 16 quants in their low nibbles and the next 16 in their high ones), block
scales `d` and, for Q4_1, block offsets `m` ([N, nbp] float16 as the file stores them, zero past
the K/32 blocks up to a multiple of 8). A weight is `d q` (q8, q in -128..127) or `d q + m` (q4, q
in 0..15; Q4_0's q - 8 is the offset -8 d, not stored). The quants are in GGUF's order, or (`interleave`, what
`cpu_quant.cpp` multiplies) by eights: each run of 8 blocks stored as 8 groups of 32 quants, group
g holding quants 4g..4g+3 of each of the 8 blocks in turn; the blocks after the last whole run as
they are. `Panels` is the other kernel's layout (`cpu_quant_amx.cpp`, AMX-INT8 tiles: rows in
panels of 16, `to_panels`); `kernel_form` gives a weight the form this process multiplies. `from_gguf` reads a tensor's
raw blocks (the `gguf` package's reader hands them as bytes), `quantize` makes them from a float
weight by llama.cpp's rounding (the `gguf` package's reference quantizer), `dequantize` gives the
float weight back, `reference` computes what the kernel computes in float64 (the tests' oracle).

`QuantLinear` is the projection over `Blocks` or `Panels` (`torch.ops.flashtree.qdense` or
`qdense_panels`, eager or compiled);
`QuantEmbedding` looks rows up and dequantizes them. Nothing here reads a file or decides which
form a model takes (`gguf_weights.py` and the loader do).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

BLOCK = 32
KINDS = ("q8_0", "q4_0", "q4_1")   # the GGUF block types of 32 kept as they are
KEPT = KINDS + ("q4_k",)           # ... and the K-quant kept as 32-blocks (`from_gguf`)
QUANTS = ("q8_0", "q4_0")          # what `quant=` quantizes a float checkpoint to
_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}  # bytes a block of 32 in the file: f16 d [, f16 m], quants
Q4_K_BYTES = 144   # a Q4_K super-block of 256: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 of quants


def padded_blocks(k: int) -> int:
    """nbp: the K/32 blocks of a row, padded to a multiple of 8 (the kernel's offset sums take 8 at once)."""
    return -(-(k // BLOCK) // 8) * 8


@dataclass
class Blocks:
    kind: str                 # q8_0 | q4_0 | q4_1 | q4_k (what the file held; q4_0 runs as q4 with m = -8 d,
                              # q4_k as q4 with float32 d and m)
    qs: torch.Tensor          # [N, K] int8 | [N, K/2] uint8
    d: torch.Tensor           # [N, nbp] float16 (float32 for q4_k)
    m: torch.Tensor | None    # [N, nbp], d's dtype (Q4_1 and Q4_K only)
    interleaved: bool = False  # quants by eights (`interleave`), else in GGUF's order

    @property
    def shape(self) -> tuple[int, int]:
        n, w = self.qs.shape
        return n, w if self.qs.dtype == torch.int8 else 2 * w

    def quants(self) -> torch.Tensor:
        """q [N, K] as integers in weight order (q4: 0..15)."""
        return stored_values(self.qs, self.shape[1], self.interleaved)

    def offsets(self) -> torch.Tensor | None:
        """The q4 block offsets [N, nbp] float32 (Q4_0: -8 d), None for q8."""
        if self.m is not None:
            return self.m.float()
        return -8 * self.d.float() if self.qs.dtype == torch.uint8 else None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [N, K] (float32 products: d q + m, as the kernel's model of it)."""
        n, k = self.shape
        nb = k // BLOCK
        q = self.quants().view(n, nb, BLOCK).float()
        w = q * self.d.float()[:, :nb, None]
        m = self.offsets()
        if m is not None:
            w = w + m[:, :nb, None]
        return w.reshape(n, k).to(dtype)

    def rows(self, ids: torch.Tensor) -> Blocks:
        """Rows `ids` of the weight (copies)."""
        pick = lambda t: None if t is None else t.index_select(0, ids).contiguous()
        return Blocks(self.kind, pick(self.qs), pick(self.d), pick(self.m), self.interleaved)


def cat(parts: list[Blocks | Panels]) -> Blocks | Panels | None:
    """The weights' rows one after another (a fused q/k/v or gate/up), or None where their kinds
    differ (a file may store v in another type than q and k). Panels join as panels where every
    part but the last fills its panels, else as rows of blocks."""
    kinds = {p.kind for p in parts}
    if len(kinds) != 1 or len({p.shape[1] for p in parts}) != 1:
        return None
    join = lambda ts: None if ts[0] is None else torch.cat(ts)
    if all(isinstance(p, Panels) for p in parts) and all(p.n % PANEL == 0 for p in parts[:-1]):
        return Panels(parts[0].kind, join([p.qs for p in parts]), join([p.d for p in parts]),
                      join([p.m for p in parts]), sum(p.n for p in parts))
    parts = [p.to_blocks() if isinstance(p, Panels) else p for p in parts]
    if len({p.interleaved for p in parts}) != 1:
        parts = [interleave(p) for p in parts]
    return Blocks(parts[0].kind, join([p.qs for p in parts]), join([p.d for p in parts]), join([p.m for p in parts]),
                  parts[0].interleaved)


SHARED_TAILS = (1, 2, 4)  # blocks after the last whole run that share groups (see `order_by_eights`)


def order_by_eights(k: int, q4: bool) -> np.ndarray:
    """Where each stored quant of a row laid out by eights comes from: order[p] is the weight
    index of stored position p. Group g of run s (32 quants) holds quants 4g..4g+3 of blocks
    8s..8s+7, block by block; q8 stores the groups in turn, q4 each pair of groups 2h, 2h + 1 in
    the low and high nibbles of the same 32 bytes (so one load and two masks unpack both: `_pack`
    puts stored positions 16c + i and 16c + 16 + i of each 32 in byte i's nibbles). The r blocks
    after the last whole run, where r is 1, 2 or 4 (SHARED_TAILS), are r groups whose lane l holds
    block l mod r (its chunks of 4 quants in turn over the groups), so that one sum of r groups
    holds every tail block in lanes; other tails are in place."""
    nb = k // BLOCK
    runs, r = nb // 8, nb % 8
    p = np.arange(k)

    def groups(pos: np.ndarray, paired: bool) -> tuple[np.ndarray, np.ndarray]:
        """(group, position in the group's 32) of stored positions from a region's start."""
        if not paired:
            return np.divmod(pos, 32)
        h, rem = np.divmod(pos, 64)  # a pair's 64: quarters (2h, <16), (2h+1, <16), (2h, >=16), (2h+1, >=16)
        quarter, i = np.divmod(rem, 16)
        return 2 * h + quarter % 2, 16 * (quarter // 2) + i

    s, rem = np.divmod(p[:256 * runs], 256)
    g, rem = groups(rem, q4)
    lane, t = np.divmod(rem, 4)
    p[:256 * runs] = (8 * s + lane) * BLOCK + 4 * g + t
    if r in SHARED_TAILS:
        g, rem = groups(p[256 * runs:] - 256 * runs, q4 and r > 1)
        lane, t = np.divmod(rem, 4)
        p[256 * runs:] = (8 * runs + lane % r) * BLOCK + 4 * (g * (8 // r) + lane // r) + t
    return p


def _unpack(qs: torch.Tensor, k: int) -> torch.Tensor:
    """Stored quants [..., K] as bytes (q8: int8; q4: uint8, each 16 bytes' low nibbles, then their high ones)."""
    if qs.dtype == torch.int8:
        return qs
    b = qs.unflatten(-1, (k // BLOCK, BLOCK // 2))
    return torch.cat([b & 15, b >> 4], dim=-1).flatten(-2)


def _pack(values: torch.Tensor, q4: bool) -> torch.Tensor:
    """Integers [..., K] stored as quants: int8, or q4 nibbles (16 bytes per 32: low, then high)."""
    if not q4:
        return values.to(torch.int8).contiguous()
    v = values.to(torch.uint8).unflatten(-1, (-1, BLOCK))
    return (v[..., :16] | (v[..., 16:] << 4)).flatten(-2).contiguous()


def stored_values(qs: torch.Tensor, k: int, interleaved: bool) -> torch.Tensor:
    """Quants [..., K] in weight order from stored rows qs [..., K or K/2]."""
    v = _unpack(qs, k).to(torch.int16)
    if not interleaved:
        return v
    return v[..., torch.from_numpy(np.argsort(order_by_eights(k, qs.dtype == torch.uint8)))]


def interleave(w: Blocks) -> Blocks:
    """w with its quants by eights (the kernel's layout); scales and offsets as they are."""
    if w.interleaved:
        return w
    n, k = w.shape
    order = torch.from_numpy(order_by_eights(k, w.qs.dtype == torch.uint8))
    out = torch.empty_like(w.qs)
    for r in range(0, n, 4096):  # a few MB at a time: an 8 B model's embedding is 0.6 GB of quants
        out[r:r + 4096] = _pack(_unpack(w.qs[r:r + 4096], k)[:, order], w.qs.dtype == torch.uint8)
    return Blocks(w.kind, out, w.d, w.m, True)


def from_gguf(raw: np.ndarray, kind: str, n: int, k: int) -> Blocks:
    """A tensor's blocks as the file stores them — raw [N, K/32 * bytes a block] uint8 (Q4_K: [N,
    K/256 * 144]), rows of K weights — in the kernel's layout (new arrays: the file can be closed after)."""
    if kind == "q4_k":
        return _from_q4_k(raw, n, k)
    if kind not in KINDS:
        raise ValueError(f"GGUF type {kind} is not one flashtree keeps quantized ({', '.join(KEPT)})")
    if k % BLOCK:
        raise ValueError(f"a {kind} row of {k} weights is not whole blocks of {BLOCK}")
    nb, nbp = k // BLOCK, padded_blocks(k)
    blocks = np.ascontiguousarray(raw).reshape(n, nb, _BYTES[kind])
    d = np.zeros((n, nbp), np.float16)
    d[:, :nb] = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if kind == "q8_0":
        qs = blocks[..., 2:].copy().view(np.int8).reshape(n, k)
        return Blocks(kind, torch.from_numpy(qs), torch.from_numpy(d), None)
    m = None
    if kind == "q4_1":
        m = np.zeros((n, nbp), np.float16)
        m[:, :nb] = blocks[..., 2:4].copy().view(np.float16)[..., 0]
        m = torch.from_numpy(m)
    qs = np.ascontiguousarray(blocks[..., _BYTES[kind] - 16:]).reshape(n, k // 2)
    return Blocks(kind, torch.from_numpy(qs), torch.from_numpy(d), m)


def _from_q4_k(raw: np.ndarray, n: int, k: int) -> Blocks:
    """A Q4_K tensor as Q4_1-like blocks of 32, exactly: each super-block of 256 holds 8 sub-blocks
    of 32 whose weights are d sc q - dmin mn (q 0..15; sc, mn 6-bit; d, dmin float16), so a
    sub-block is a q4 block with scale d sc and offset -dmin mn — products of a float16 and a
    6-bit integer, exact in float32 (not in float16): d and m are float32 here. 6 bits a weight
    held (4.5 in the file), against 16 dequantized to bf16."""
    from gguf.quants import Q4_K
    if k % 256:
        raise ValueError(f"a q4_k row of {k} weights is not whole super-blocks of 256")
    sb, nb, nbp = k // 256, k // BLOCK, padded_blocks(k)
    b = np.ascontiguousarray(raw).reshape(n, sb, Q4_K_BYTES)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)           # [N, sb]
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sc, mn = Q4_K.get_scale_min(b[..., 4:16].reshape(n * sb, 12))                 # [N sb, 8] each (the gguf package's unpacking)
    scale = np.zeros((n, nbp), np.float32)
    offset = np.zeros((n, nbp), np.float32)
    scale[:, :nb] = (d[..., None] * sc.reshape(n, sb, 8).astype(np.float32)).reshape(n, nb)
    offset[:, :nb] = -(dmin[..., None] * mn.reshape(n, sb, 8).astype(np.float32)).reshape(n, nb)
    packed = torch.empty((n, k // 2), dtype=torch.uint8)
    shifts = np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    for r in range(0, n, 4096):  # a few MB at a time (an 8 B model's embedding is 0.5 GB of quants)
        qs = b[r:r + 4096, :, 16:].reshape(-1, sb, 4, 1, 32)                      # 32 bytes: sub-blocks 2c (low), 2c+1 (high)
        q = ((qs >> shifts) & np.uint8(15)).reshape(-1, k)                        # weight order
        packed[r:r + 4096] = _pack(torch.from_numpy(q), True)
    return Blocks("q4_k", packed, torch.from_numpy(scale), torch.from_numpy(offset))


def quantize(weight: torch.Tensor, kind: str) -> Blocks:
    """A float weight [N, K] in `kind`'s blocks by llama.cpp's rounding (the `gguf` package's
    reference quantizer, what `llama-quantize` writes)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize
    if kind not in KINDS:
        raise ValueError(f"quant '{kind}' is not supported; use one of {', '.join(KINDS)}")
    n, k = weight.shape
    raw = gguf_quantize(weight.detach().float().cpu().numpy(), GGMLQuantizationType[kind.upper()])
    return from_gguf(raw, kind, n, k)


def quantize_rows(x: np.ndarray, nbp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's row quantization of x [M, K] float32, in numpy (the tests' model of it): per
    block of 32, amax = max |x|, xd = amax / 127, xq = round-half-even(x * (127 / amax)) (0 where
    amax is 0), xs = xd * sum(xq) — every step rounded to float32 as the kernel rounds it."""
    m_, k = x.shape
    nb = k // BLOCK
    xb = x.astype(np.float32).reshape(m_, nb, BLOCK)
    amax = np.abs(xb).max(-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    xq = np.rint((xb * inv[..., None]).astype(np.float32)).astype(np.int8)
    xd = np.zeros((m_, nbp), np.float32)
    xs = np.zeros((m_, nbp), np.float32)
    xd[:, :nb] = (amax / np.float32(127)).astype(np.float32)
    xs[:, :nb] = xd[:, :nb] * xq.astype(np.int32).sum(-1).astype(np.float32)
    return xq.reshape(m_, k), xd, xs


def reference(x: torch.Tensor, w: Blocks, bias: torch.Tensor | None = None) -> np.ndarray:
    """What `qdense` computes, in float64: x [M, K] quantized by `quantize_rows`, then per block
    d xd (integer dot product) + m xs, summed exactly -> [M, N] float64."""
    xf = x.detach().float().reshape(-1, x.shape[-1]).numpy()
    n, k = w.shape
    nb = k // BLOCK
    xq, xd, xs = quantize_rows(xf, w.d.shape[1])
    q = w.quants().numpy().astype(np.int64).reshape(n, nb, BLOCK)
    isum = np.einsum("mbi,nbi->mnb", xq.astype(np.int64).reshape(-1, nb, BLOCK), q)   # [M, N, nb] exact
    d = w.d.numpy()[:, :nb].astype(np.float64)
    y = (isum * (xd[:, None, :nb].astype(np.float64) * d[None])).sum(-1)
    m = w.offsets()
    if m is not None:
        y += xs[:, :nb].astype(np.float64) @ m.numpy()[:, :nb].astype(np.float64).T
    if bias is not None:
        y += bias.detach().double().numpy()
    return y


PANEL = 16  # weight rows a panel (`cpu_quant_amx.cpp`: a tile's 16 columns)


@dataclass
class Panels:
    """One weight [N, K] in `cpu_quant_amx.cpp`'s layout (`to_panels`): rows in panels of 16 (zero
    rows past N), each panel's blocks in turn, a panel's block as the AMX tile's B operand (row r
    of 8 holding weights 4r..4r+3 of the 16 rows, 64 bytes; q4 rows 2i and 2i+1 in the low and
    high nibbles of bytes 64i..64i+63)."""
    kind: str
    qs: torch.Tensor          # [P, K/32, 512] int8 | [P, K/32, 256] uint8
    d: torch.Tensor           # [P, K/32, 16] float16
    m: torch.Tensor | None    # [P, K/32, 16] float16 (Q4_1 only)
    n: int                    # N

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.qs.shape[1] * BLOCK

    def row_values(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Rows `ids` [L]: quants [L, K/32, 32] in weight order (q4: 0..15), scales and offsets [L, K/32] float16."""
        p, c = ids // PANEL, ids % PANEL   # each row's panel and its column there
        # panel and column indexed together (two index tensors apart: their row dimension comes first):
        # only the rows' own bytes are copied, not their whole panels (16x: SmolLM2's draft rows of its
        # head took 300 MB that way)
        if self.qs.dtype == torch.uint8:
            b = self.qs.unflatten(-1, (4, PANEL, 4))[p, :, :, c]                # [L, nb, 4 row pairs, 4]
            q = torch.stack([b & 15, b >> 4], dim=3)                            # [L, nb, 4, 2, 4]: weight order
        else:
            q = self.qs.unflatten(-1, (8, PANEL, 4))[p, :, :, c]                # [L, nb, 8, 4]
        pick = lambda s: None if s is None else s[p, :, c]                      # [L, nb]
        return q.flatten(2), pick(self.d), pick(self.m)

    def rows(self, ids: torch.Tensor) -> Blocks:
        """Rows `ids` [L] as blocks in GGUF's order (copies)."""
        q, d, m = self.row_values(ids)
        nb = q.shape[1]
        pad = lambda s: None if s is None else torch.nn.functional.pad(s, (0, padded_blocks(nb * BLOCK) - nb))
        return Blocks(self.kind, _pack(q.flatten(1), self.qs.dtype == torch.uint8), pad(d), pad(m))

    def to_blocks(self) -> Blocks:
        """The weight as rows of blocks in GGUF's order (a copy)."""
        return self.rows(torch.arange(self.n))


def to_panels(w: Blocks) -> Panels:
    """w in `cpu_quant_amx.cpp`'s panels (a copy)."""
    n, k = w.shape
    nb, p = k // BLOCK, -(-n // PANEL)
    q4 = w.qs.dtype == torch.uint8
    qs = torch.empty((p, nb, 256 if q4 else 512), dtype=w.qs.dtype)
    step = 256  # panels at a time: 4,096 rows (an 8 B model's embedding is 0.6 GB of quants)
    for r in range(0, p, step):
        q = _unpack(w.qs[PANEL * r:PANEL * (r + step)], k)  # bytes (the 8B-shaped Q4_0 loaded in 35 s, 55 in int16)
        if w.interleaved:
            q = q[:, torch.from_numpy(np.argsort(order_by_eights(k, q4)))]
        q = torch.nn.functional.pad(q, (0, 0, 0, PANEL * min(step, p - r) - q.shape[0]))
        q = q.reshape(-1, PANEL, nb, 8, 4).permute(0, 2, 3, 1, 4)           # [panels, nb, 8, 16, 4]
        if q4:
            q = q.reshape(-1, nb, 4, 2, 64)                                  # B rows in pairs
            qs[r:r + step] = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).to(torch.uint8).flatten(2)
        else:
            qs[r:r + step] = q.to(torch.int8).flatten(2)

    def by_panel(s: torch.Tensor) -> torch.Tensor:
        s = torch.nn.functional.pad(s[:, :nb], (0, 0, 0, PANEL * p - n))
        return s.reshape(p, PANEL, nb).transpose(1, 2).contiguous()
    return Panels(w.kind, qs, by_panel(w.d), None if w.m is None else by_panel(w.m), n)


@functools.cache
def panels_ready() -> bool:
    """Whether projections in blocks run on AMX-INT8 tiles here (`cpu_quant_amx.cpp`: the amx path,
    the CPU's amx_int8 and the OS's grant of the tile state), so take `Panels`; else `Blocks` by eights."""
    from . import cpu_dense
    return cpu_dense.available() and bool(torch.ops.flashtree.qdense_panels_ready())


def kernel_form(w: Blocks | Panels) -> Blocks | Panels:
    """w as this process's blocks kernel multiplies it: panels on AMX-INT8 tiles, else rows by
    eights. One process takes one form for every projection: the two kernels sum a row's blocks
    in different orders, and a verify must sum as a step does."""
    if panels_ready():
        return w if isinstance(w, Panels) else to_panels(w)
    return interleave(w.to_blocks() if isinstance(w, Panels) else w)


class QuantLinear(nn.Module):
    """A projection whose weight stays in blocks (buffers `qs`, `d`, `m` in the kernel's form,
    `kernel_form`; a float `bias` or none): x [..., K] float32 / bf16 -> [..., N] in x's dtype, by
    the CPU kernel (call only where `cpu_dense.available()`)."""

    def __init__(self, w: Blocks | Panels, bias: torch.Tensor | None = None):
        super().__init__()
        from . import cpu_dense
        if not cpu_dense.available():  # (builds and loads the kernel, which defines the op)
            raise RuntimeError(f"quantized weights need flashtree's CPU kernel: {cpu_dense.why_unavailable()}")
        w = kernel_form(w)
        self.kind, self.panels = w.kind, isinstance(w, Panels)
        self.out_features, self.in_features = w.shape
        self.register_buffer("qs", w.qs)
        self.register_buffer("d", w.d)
        self.register_buffer("m", w.m)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def form(self) -> Blocks | Panels:
        """The weight as the kernel holds it."""
        if self.panels:
            return Panels(self.kind, self.qs, self.d, self.m, self.out_features)
        return Blocks(self.kind, self.qs, self.d, self.m, True)

    @property
    def blocks(self) -> Blocks:
        """The weight as rows of blocks (a copy where the kernel holds panels)."""
        form = self.form
        return form.to_blocks() if isinstance(form, Panels) else form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.panels:
            return torch.ops.flashtree.qdense_panels(x, self.qs, self.d, self.m, self.bias, self.out_features)
        return torch.ops.flashtree.qdense(x, self.qs, self.d, self.m, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind}, "
                f"kernel={'amx tiles' if self.panels else 'vector'}")


class QuantEmbedding(nn.Module):
    """Token embeddings kept in blocks: a lookup dequantizes its rows (d q + m) into `dtype`."""

    def __init__(self, w: Blocks | Panels, dtype: torch.dtype):
        super().__init__()
        w = kernel_form(w)  # as a tied head's QuantLinear stores it: one copy serves both
        self.kind, self.dtype, self.panels = w.kind, dtype, isinstance(w, Panels)
        self.num_embeddings, self.embedding_dim = w.shape
        self.register_buffer("qs", w.qs)
        self.register_buffer("d", w.d)
        self.register_buffer("m", w.m)
        if not self.panels:  # where each weight-order quant sits in a row by eights
            self.register_buffer("plain", torch.from_numpy(np.argsort(order_by_eights(w.shape[1], w.qs.dtype == torch.uint8))),
                                 persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        k, nb = self.embedding_dim, self.embedding_dim // BLOCK
        if self.panels:
            q, d, m = Panels(self.kind, self.qs, self.d, self.m, self.num_embeddings).row_values(ids.reshape(-1))
            q, d, m = q.unflatten(0, ids.shape), d.unflatten(0, ids.shape), m if m is None else m.unflatten(0, ids.shape)
        else:
            q = _unpack(self.qs[ids], k)[..., self.plain].unflatten(-1, (nb, BLOCK))   # [..., nb, 32] in weight order
            d, m = self.d[ids][..., :nb], None if self.m is None else self.m[ids][..., :nb]
        d = d[..., None].float()
        w = q.float() * d
        if m is not None:
            w = w + m[..., None].float()
        elif self.qs.dtype == torch.uint8:  # Q4_0: the offset -8 d
            w = w - 8 * d
        return w.flatten(-2).to(self.dtype)                                  # [..., K]


def weight_forms(model: nn.Module) -> dict[str, int]:
    """How many of `model`'s projections and embeddings are in each block kind ({} for a float model)."""
    forms: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, (QuantLinear, QuantEmbedding)):
            forms[m.kind] = forms.get(m.kind, 0) + 1
    return forms


def describe(model: nn.Module) -> str | None:
    """The model's quantization in a word or two ("q4_1+q8_0"), None for float weights; the kind
    most projections have first."""
    forms = weight_forms(model)
    return "+".join(sorted(forms, key=lambda k: -forms[k])) if forms else None

