"""The CPU paged-attention kernel (models/cpu_attention.cpp): agreement with SDPA over gathered rows,
a tree node bit-identical to the plain step at its position, batch invariance, a bf16 cache giving
the float32 cache's bits on the same values, clear errors."""
import pytest
import torch
import torch.nn.functional as F

from flashtree.models import cpu_dense

pytestmark = pytest.mark.skipif(not cpu_dense.available(), reason=f"CPU kernel: {cpu_dense.why_unavailable()}")


def case(B, T, N, H, Hkv, D, P, lengths, seed=0, rows_pages=40):
    g = torch.Generator().manual_seed(seed)
    pages = max(1, -(-max(lengths) // P))
    kc, vc = torch.randn(rows_pages * P, Hkv, D, generator=g), torch.randn(rows_pages * P, Hkv, D, generator=g)
    table = torch.stack([torch.randperm(rows_pages, generator=g)[:pages] for _ in range(B)])
    q = torch.randn(B, T, H, D, generator=g)
    kn, vn = torch.randn(B, N, Hkv, D, generator=g), torch.randn(B, N, Hkv, D, generator=g)
    vis = torch.rand(B, T, N, generator=g) < 0.5
    vis[:, :, 0] = True  # every query sees at least one new row
    return q, kn, vn, kc, vc, table, torch.tensor(lengths), vis, P


def reference(q, kn, vn, kc, vc, table, lengths, vis, P):
    """Gather every sequence's rows, mask, SDPA in float64."""
    B, T = q.shape[:2]
    S = table.shape[1] * P
    cols = torch.arange(S)
    rows = table[:, cols // P] * P + cols % P                                  # [B, S]
    k = torch.cat([kc[rows], kn], 1).double()
    v = torch.cat([vc[rows], vn], 1).double()
    seen = (cols[None] < lengths[:, None])[:, None].expand(B, T, S)
    mask = torch.cat([seen, vis], 2)[:, None]
    out = F.scaled_dot_product_attention(q.double().transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2)


@pytest.fixture
def threads(request):
    """torch's thread count for one test (conftest runs tests on 1), restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)  # 2: calls of few (sequence, kv head) pairs cut tokens
@pytest.mark.parametrize("B, T, N, H, Hkv, D, P, lengths", [
    (1, 1, 1, 4, 2, 64, 16, [250]),
    (3, 5, 5, 4, 2, 64, 4, [0, 7, 24]),
    (2, 9, 12, 8, 2, 128, 8, [33, 1]),      # N > T: the drafter's context + block
    (2, 3, 3, 6, 3, 24, 5, [11, 20]),       # a head size with no compiled-in path
    (1, 17, 17, 2, 2, 32, 16, [600]),
    (1, 9, 9, 4, 1, 64, 16, [130]),         # on 2 threads, fewer (sequence, kv head) pairs than 4: tokens split
])
def test_agrees_with_sdpa_over_gathered_rows(B, T, N, H, Hkv, D, P, lengths, threads):
    args = case(B, T, N, H, Hkv, D, P, lengths)
    out = cpu_dense.paged_attention(*args)
    assert out.shape == (B, T, H, D) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(*args), rtol=0, atol=2e-6)


@pytest.mark.parametrize("B, T", [(1, 0), (0, 3)])
def test_a_call_without_queries_returns_an_empty_output(B, T):
    """No query tokens (or no sequences): an empty result. The work split divides by both, and a
    division by zero is a SIGFPE that would end the whole process."""
    q, kn, vn, kc, vc, table, lengths, vis, P = case(2, 3, 3, 4, 2, 64, 16, [5, 9])
    q, kn, vn, vis = q[:B, :T], kn[:B, :T], vn[:B, :T], vis[:B, :T, :T]
    out = cpu_dense.paged_attention(q, kn, vn, kc, vc, table[:B], lengths[:B], vis, P)
    assert out.shape == (B, T, 4, 64)


def test_scores_far_below_the_maximum_get_no_weight_not_a_nan():
    """Scores 88-90 below a row's maximum are where exp's exponent bits run out (2^-127, 2^-128):
    they must weigh 0, not -inf or NaN. Keys scaled so one dominates by hundreds."""
    q, kn, vn, kc, vc, table, lengths, vis, P = case(1, 2, 2, 2, 1, 64, 16, [40], seed=3)
    q = q / q.norm(dim=-1, keepdim=True) * 8.0                # |q| = 8: a score is 8 |k| cos / sqrt(64) = |k| cos
    kc = kc * torch.linspace(0.01, 1, kc.shape[0])[:, None, None] * 45   # scores spread over ~[-90, 90]
    args = (q, kn, vn, kc, vc, table, lengths, vis, P)
    out = cpu_dense.paged_attention(*args)
    assert torch.isfinite(out).all()
    # float32 scores near 90 carry ~5e-6 of rounding into their weights
    torch.testing.assert_close(out.double(), reference(*args), rtol=0, atol=2e-5)


@pytest.mark.parametrize("H, Hkv, n, threads", [(4, 2, 37, 1), (4, 2, 150, 1), (4, 1, 150, 1),  # 150: 3 blocks
                                                (9, 3, 150, 2), (4, 1, 37, 2)], indirect=["threads"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tree_node_equals_the_plain_step_at_its_position_bitwise(H, Hkv, n, threads, dtype):
    """A chain of new tokens: token t (seeing the cache and tokens 0..t) gives exactly what a plain
    step gives once tokens 0..t-1 are cached rows — the property greedy speculative == plain needs.
    On 2 threads a call of fewer than 4 (sequence, kv head) items cuts its tokens into ranges (3 kv
    heads, as SmolLM2: 2 ranges of 3 tokens; 1 kv head: 4 ranges) while a plain step is one item.
    With a bf16 cache the chain's call widens each block of cached rows once for all its queries
    while a plain step widens each row as each query reads it: the bits must not differ."""
    T, D, P = 6, 64, 16
    q, kn, vn, kc, vc, table, lengths, _, _ = case(1, T, T, H, Hkv, D, P, [n + T], rows_pages=16)
    kn, vn, kc, vc = (t.to(dtype) for t in (kn, vn, kc, vc))
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None]
    tree = cpu_dense.paged_attention(q, kn, vn, kc, vc, table, torch.tensor([n]), causal, P)
    rows = table[0, (n + torch.arange(T)) // P] * P + (n + torch.arange(T)) % P
    kc2, vc2 = kc.clone(), vc.clone()
    kc2[rows], vc2[rows] = kn[0], vn[0]          # the tokens, committed to the cache
    one = torch.ones(1, 1, 1, dtype=torch.bool)
    for t in range(T):
        plain = cpu_dense.paged_attention(q[:, t:t + 1], kn[:, t:t + 1], vn[:, t:t + 1], kc2, vc2, table,
                                          torch.tensor([n + t]), one, P)
        assert torch.equal(plain[0, 0], tree[0, t]), t


def test_a_sequence_gets_the_same_bits_alone_or_in_a_batch():
    q, kn, vn, kc, vc, table, lengths, vis, P = case(4, 3, 3, 4, 2, 64, 8, [40, 3, 17, 29])
    batch = cpu_dense.paged_attention(q, kn, vn, kc, vc, table, lengths, vis, P)
    for b in range(4):
        alone = cpu_dense.paged_attention(q[b:b + 1], kn[b:b + 1], vn[b:b + 1], kc, vc, table[b:b + 1],
                                          lengths[b:b + 1], vis[b:b + 1], P)
        assert torch.equal(alone[0], batch[b])
    # negative control: the same keys in another order give other bits (so equality above means
    # the order did not change, not that the test cannot see a difference)
    full = torch.tensor([32] * 4)                # 4 whole pages of 8 rows
    swapped = table.clone()
    swapped[:, :4] = table[:, :4].flip(1)
    a = cpu_dense.paged_attention(q, kn, vn, kc, vc, table, full, vis, P)
    b = cpu_dense.paged_attention(q, kn, vn, kc, vc, swapped, full, vis, P)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("D", [64, 128, 24])  # 24: the path for other head sizes (and a scalar tail)
def test_a_bf16_cache_gives_the_bits_a_float32_cache_of_the_same_values_gives(D):
    """A bf16 model keeps K/V in a bf16 cache; the kernel widens each row as it reads it, so it must
    give exactly what it gives on those values widened to float32 beforehand (exact)."""
    q, kn, vn, kc, vc, table, lengths, vis, P = case(3, 5, 7, 6, 3, D, 8, [0, 19, 70])
    q = q.bfloat16().float()          # a bf16 model's queries: bf16 values, widened
    kn, vn, kc, vc = (t.bfloat16() for t in (kn, vn, kc, vc))
    half = cpu_dense.paged_attention(q, kn, vn, kc, vc, table, lengths, vis, P)
    wide = cpu_dense.paged_attention(q, kn.float(), vn.float(), kc.float(), vc.float(), table, lengths, vis, P)
    assert half.dtype == torch.float32 and torch.equal(half, wide)
    # negative control: one cached value nudged by one bf16 step changes the output
    kc2, row = kc.clone(), table[2, 0] * P  # sequence 2's first cached row
    kc2[row, 0, 0] = (kc2[row, 0, 0].float() * (1 + 2 ** -7)).bfloat16()  # one bf16 step (7 fraction bits)
    assert not torch.equal(cpu_dense.paged_attention(q, kn, vn, kc2, vc, table, lengths, vis, P), half)


def test_bad_inputs_get_clear_errors():
    q, kn, vn, kc, vc, table, lengths, vis, P = case(1, 2, 2, 4, 2, 64, 16, [20])
    with pytest.raises(RuntimeError, match="float32"):
        cpu_dense.paged_attention(q.double(), kn, vn, kc, vc, table, lengths, vis, P)
    with pytest.raises(RuntimeError, match="one dtype, float32 or bfloat16"):  # bf16 cache, float32 new rows
        cpu_dense.paged_attention(q, kn, vn, kc.bfloat16(), vc.bfloat16(), table, lengths, vis, P)
    with pytest.raises(RuntimeError, match="multiple of kv heads"):
        cpu_dense.paged_attention(q[:, :, :3], kn, vn, kc, vc, table, lengths, vis, P)
    with pytest.raises(RuntimeError, match="exceeds its page table"):
        cpu_dense.paged_attention(q, kn, vn, kc, vc, table, torch.tensor([10_000]), vis, P)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_dense.paged_attention(q, kn, vn, kc, vc, table + 1000, lengths, vis, P)
