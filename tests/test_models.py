"""Target models vs transformers on the same weights; tree masks; KV compaction."""
import math

import pytest
import torch
import torch.nn.functional as F

from flashtree.config import ModelConfig
from flashtree.engine.block_manager import BlockManager
from flashtree.engine.model_runner import ModelRunner
from flashtree.engine.round import pack_trees
from flashtree.models.layers import dense
from flashtree.models.loader import load_target
from flashtree.speculative.tree import DraftTree
from helpers import make_hf_target

# llama3 RoPE: head_dim 32 and theta 1e4 give wavelengths 2*pi*1e4**(2i/32) = 6.3, 11.2, 19.9, 35.3,
# 62.8, 112, ...; with original_max_position_embeddings 64, low_freq_factor 1 and high_freq_factor 4
# two of them are kept (< 16), three are smoothed (16..64) and eleven are divided by the factor.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
CASES = {
    "qwen3": dict(model_type="qwen3", tie_word_embeddings=True),
    "llama": dict(model_type="llama", num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  tie_word_embeddings=False, attention_bias=True, mlp_bias=True, rope_scaling=LLAMA3,
                  rope_theta=10000.0, max_position_embeddings=512),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=False),
}


def new_cache(model, slots=2, cap=128, compile=False, page_size=4):
    """A model runner (eager unless compile) holding a paged KV cache of `slots` x `cap` rows; the
    slots' pages interleave (slot 0 gets pages 1, 3, 5, ...), so a sequence's rows are never
    contiguous and every read and write goes through its page table."""
    blocks = BlockManager(slots * cap // page_size + 1, page_size, slots, 2 * cap // page_size + 1)
    for s in range(slots):
        assert blocks.allocate() == s
    for rows in range(page_size, cap + 1, page_size):
        for s in range(slots):
            assert blocks.reserve(s, rows)
    return ModelRunner(model, None, blocks, None, compile=compile)


def run(runner, slot, ids, start, vis=None):
    """Forward `ids` at positions start.. into `slot` (causal unless vis [T, T] given): logits [T, V]."""
    T = len(ids)
    vis = torch.ones(T, T, dtype=torch.bool).tril() if vis is None else vis
    depth = vis.sum(-1) - 1
    logits = runner.run_target(torch.tensor([ids]), (start + depth)[None], [slot], torch.tensor([start]),
                               vis[None], torch.arange(T))
    return logits


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    import transformers
    kw = dict(CASES[request.param])
    mt = kw.pop("model_type")
    d = make_hf_target(tmp_path_factory.mktemp(mt), mt, **kw)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    return load_target(d, dtype="float32", device="cpu"), hf, d


def test_config_fields(pair):
    ours, hf, d = pair
    cfg = ModelConfig.from_dir(d)
    assert cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    if cfg.model_type == "llama":
        assert cfg.rope_scaling["rope_type"] == "llama3"
        assert cfg.attention_bias and cfg.mlp_bias


def test_fixture_biases_and_norms_are_random(pair):
    """At HF's init (biases 0, norm weights 1) parity could not see a dropped bias or norm weight."""
    _, hf, _ = pair
    vectors = {n: p for n, p in hf.named_parameters() if p.dim() == 1}
    biases = [n for n in vectors if n.endswith(".bias")]
    norms = [n for n in vectors if "norm" in n]
    expect_bias = {"qwen3": 0, "llama": 7 * 3, "qwen2": 3 * 3}[hf.config.model_type]  # per layer x 3 layers
    assert len(biases) == expect_bias
    assert "model.norm.weight" in norms and len(norms) == 1 + 3 * (4 if hf.config.model_type == "qwen3" else 2)
    for n in biases:
        assert vectors[n].abs().min() > 0 and vectors[n].std() > 0.05, n
    for n in norms:
        assert (vectors[n] - 1).abs().max() > 0.1 and vectors[n].std() > 0.05, n


def test_llama3_wavelengths_cross_the_smoothing_band(pair):
    """The llama3 case must exercise all three branches: kept, smoothed and scaled frequencies."""
    _, hf, _ = pair
    if hf.config.model_type != "llama":
        pytest.skip("llama3 RoPE scaling is the llama case")
    d, sc = 32, LLAMA3
    wavelen = 2 * math.pi * 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    old = sc["original_max_position_embeddings"]
    high = wavelen < old / sc["high_freq_factor"]
    low = wavelen > old / sc["low_freq_factor"]
    smoothed = ~high & ~low
    assert high.sum() == 2 and smoothed.sum() == 3 and low.sum() == 11
    # transformers' own table agrees that it is neither the plain nor the uniformly scaled one
    inv = hf.model.rotary_emb.inv_freq.double()
    plain = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert torch.allclose(inv[high], plain[high]) and torch.allclose(inv[low], plain[low] / sc["factor"])
    mid = inv[smoothed] / plain[smoothed]
    assert ((mid > 1 / sc["factor"] + 1e-3) & (mid < 1 - 1e-3)).all()


def test_prefill_and_decode_logits_match_transformers(pair):
    ours, hf, _ = pair
    torch.manual_seed(0)
    ids = torch.randint(0, 96, (1, 40))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    cache = new_cache(ours)
    with torch.no_grad():
        pre = run(cache, 1, ids[0, :24].tolist(), 0)
        assert (pre - ref[:24]).abs().max() < 1e-4
        for t in range(24, 40):  # step-by-step decode through the cache
            step = run(cache, 1, [ids[0, t].item()], t)
            assert (step[0] - ref[t]).abs().max() < 1e-4, t


def test_compiled_decode_matches_transformers(tmp_path):
    """The compiled runner, whose projections take the CPU kernel where it builds (models/cpu_dense.py;
    else the one-row form of layers.dense), on the llama case (random q/k/v/o and MLP biases: both
    forms add them too)."""
    import transformers
    kw = dict(CASES["llama"])
    d = make_hf_target(tmp_path, kw.pop("model_type"), **kw)
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    ours = load_target(d, dtype="float32", device="cpu")
    torch.manual_seed(1)
    ids = torch.randint(0, 96, (1, 20))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    cache = new_cache(ours, compile=True)
    with torch.inference_mode():
        pre = run(cache, 1, ids[0, :12].tolist(), 0)
        assert (pre - ref[:12]).abs().max() < 1e-4
        for t in range(12, 20):
            step = run(cache, 1, [ids[0, t].item()], t)
            assert (step[0] - ref[t]).abs().max() < 1e-4, t


def test_one_row_dense_is_a_streamed_reduction_when_compiled():
    """layers.dense compiled on the CPU: one row becomes a multiply-and-sum (no GEMM call in the
    generated code), several rows stay one GEMM; both equal F.linear up to rounding."""
    from torch._inductor.utils import run_and_get_code
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    for shape, gemm in (((1, 64), False), ((1, 1, 64), False), ((3, 64), True), ((2, 5, 64), True)):
        torch._dynamo.reset()
        x = torch.randn(*shape, generator=g)
        out, code = run_and_get_code(torch.compile(dense, fullgraph=True, dynamic=False), x, w, b)
        torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
        assert out.shape == (*shape[:-1], 96)
        assert ("mm(" in "".join(code)) == gemm, shape


def test_tree_mask_gives_each_node_its_path_logits_and_compaction_continues_exactly(pair):
    ours, _, _ = pair
    torch.manual_seed(1)
    prompt = torch.randint(0, 96, (12,)).tolist()
    # root 0; children 1,2 of root; 3 child of 1; 4 child of 3; 5 child of 2
    tree = DraftTree(tokens=[5, 7, 9, 11, 13, 15], parents=[-1, 0, 0, 1, 3, 2],
                     depths=[0, 1, 1, 2, 3, 2], logprobs=[0.0] * 6)
    vis = torch.from_numpy(tree.visibility())
    with torch.no_grad():
        cache = new_cache(ours)
        run(cache, 0, prompt, 0)
        tree_logits = run(cache, 0, tree.tokens, len(prompt), vis)
        for i in range(tree.size):
            path, j = [], i
            while j >= 0:
                path.insert(0, tree.tokens[j])
                j = tree.parents[j]
            ref_cache = new_cache(ours)
            ref = run(ref_cache, 0, prompt + path, 0)[-1]
            assert (tree_logits[i] - ref).abs().max() < 1e-5, i
        # accept path root -> 1 -> 3 -> 4 (rows 12, 13, 15, 16) and compact to rows 12..15
        start, accepted = len(prompt), [0, 1, 3, 4]
        cache.move([0] * 4, [start + a for a in accepted], [start + j for j in range(4)])
        path_tokens = [tree.tokens[a] for a in accepted]
        cont = [21, 22, 23]
        got = run(cache, 0, cont, start + 4)
        ref_cache = new_cache(ours)
        ref = run(ref_cache, 0, prompt + path_tokens + cont, 0)[-3:]
        assert (got - ref).abs().max() < 1e-5


def test_batched_trees_with_padding_match_single_sequences(pair):
    """pack_trees: two sequences with different prompt lengths and tree sizes in one forward."""
    ours, _, _ = pair
    torch.manual_seed(2)
    prompts = [torch.randint(0, 96, (n,)).tolist() for n in (5, 17)]
    trees = [DraftTree([3, 4, 5], [-1, 0, 0], [0, 1, 1], [0.0] * 3),
             DraftTree([6, 7, 8, 9, 10], [-1, 0, 1, 2, 1], [0, 1, 2, 3, 2], [0.0] * 5)]
    with torch.no_grad():
        cache = new_cache(ours)
        for s, p in enumerate(prompts):
            run(cache, s, p, 0)
        vin = pack_trees(trees, [len(p) for p in prompts], "cpu")
        T = vin.tokens.shape[1]
        logits = cache.run_target(vin.ids, vin.positions, [0, 1], vin.lengths, vin.mask, torch.arange(2 * T))
        logits = logits.view(2, T, -1)
        for s, (p, t) in enumerate(zip(prompts, trees)):
            single_cache = new_cache(ours)
            run(single_cache, 0, p, 0)
            ref = run(single_cache, 0, t.tokens, len(p), torch.from_numpy(t.visibility()))
            assert (logits[s, :t.size] - ref).abs().max() < 1e-5


def test_sharded_checkpoint_and_half_precision(tmp_path):
    import transformers
    d = make_hf_target(tmp_path / "src", "qwen3")
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    a = load_target(d, dtype="float32", device="cpu")
    b = load_target(tmp_path / "sharded", dtype="float32", device="cpu")
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    for dt in ("bfloat16", "float16"):
        m = load_target(d, dtype=dt, device="cpu")
        assert next(m.parameters()).dtype == getattr(torch, dt)
        ids = torch.randint(0, 96, (1, 8))
        h, _ = m(ids, torch.arange(8)[None])
        assert torch.isfinite(m.logits(h).float()).all()
