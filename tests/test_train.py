"""`flashtree train-drafter` on a tiny random target: the CLI runs, resumes from its checkpoint,
writes a z-lab drafter that flashtree loads, stays lossless, and has learned the target."""
import json

import numpy as np
import pytest
import torch

from flashtree import LLM, SamplingParams
from flashtree.cli import main
from flashtree.config import DrafterConfig
from test_cpu_dense import needs_kernel


@pytest.fixture(scope="module")
def trained(tiny_pair, tmp_path_factory):
    target, _ = tiny_pair
    root = tmp_path_factory.mktemp("train_drafter")
    work, out = root / "work", root / "drafter"
    work.mkdir()
    # a corpus of token ids stands in for the stdlib corpus (the tiny tokenizer cannot read Python)
    np.save(work / "corpus_tokens.npy", np.random.default_rng(0).integers(1, 95, 4000).astype(np.int32))
    args = ["train-drafter", "--target", str(target), "--out", str(out), "--work", str(work),
            "--mask-token-id", "95", "--num-sequences", "32", "--response-tokens", "24", "--anchors", "4",
            "--batch-size", "8", "--block-size", "4", "--target-layer-ids", "0,2", "--threads", "1",
            "--gamma", "4"]  # block 4's default decay, named: the flag reaches the recipe
    assert main(args + ["--steps", "40"]) == 0
    assert main(args + ["--steps", "200", "--resume"]) == 0
    return target, out, work


def short_run(trained, name: str, *flags: str) -> tuple:
    """20 steps from the fixture's drafter on its data (copied, not made again) with `flags`:
    (report, work dir)."""
    target, out, work = trained
    run_out, run_work = work.parent / name, work.parent / f"{name}-work"
    run_work.mkdir()
    for f in ("regenerated.jsonl", "corpus_tokens.npy"):
        (run_work / f).write_bytes((work / f).read_bytes())
    assert main(["train-drafter", "--target", str(target), "--out", str(run_out), "--work", str(run_work),
                 "--mask-token-id", "95", "--num-sequences", "32", "--response-tokens", "24", "--anchors", "4",
                 "--batch-size", "8", "--block-size", "4", "--target-layer-ids", "0,2", "--threads", "1",
                 "--steps", "20", "--init-from", str(out), *flags]) == 0
    return json.loads((run_out / "training_report.json").read_text()), run_work


def refusal(trained, capsys, *flags: str) -> str:
    """What train-drafter says when it refuses `flags` (exit code 2)."""
    target, out, work = trained
    assert main(["train-drafter", "--target", str(target), "--out", str(out), "--work", str(work), *flags]) == 2
    return capsys.readouterr().err


def test_resume_continues_from_the_checkpoint(trained):
    _, out, work = trained
    steps = [json.loads(line)["step"] for line in (work / "drafter_log.jsonl").open()]
    assert steps == list(range(20, 201, 20))          # the second run started at step 40, not 0
    report = json.loads((out / "training_report.json").read_text())
    assert report["steps"] == 200 and report["recipe"]["block_size"] == 4 and report["recipe"]["gamma"] == 4.0
    hours = [json.loads(line)["elapsed_h"] for line in (work / "drafter_log.jsonl").open()]
    assert hours == sorted(hours)                     # hours spent carry across the resume


def test_starting_over_on_a_checkpoint_is_refused(trained, capsys):
    target, out, work = trained
    code = main(["train-drafter", "--target", str(target), "--out", str(out), "--work", str(work),
                 "--mask-token-id", "95", "--num-sequences", "64", "--steps", "10"])
    assert code == 2
    assert "--resume" in capsys.readouterr().err
    assert json.loads((out / "training_report.json").read_text())["steps"] == 200  # untouched
    assert sum(1 for _ in (work / "regenerated.jsonl").open()) == 32  # refused before regenerating more


def test_a_loss_decay_that_is_not_positive_is_refused(trained, capsys):
    assert "--gamma must be > 0" in refusal(trained, capsys, "--gamma", "0")


def test_output_is_a_zlab_drafter_that_stays_lossless(trained):
    target, out, _ = trained
    cfg = DrafterConfig.from_dir(out)
    assert cfg.block_size == 4 and cfg.target_layer_ids == [0, 2] and cfg.mask_token_id == 95
    rows = [json.loads(line) for line in (trained[2] / "regenerated.jsonl").open()][:4]
    prompts = [r["ids"][:r["prompt_len"]] for r in rows]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = LLM(model=target, draft=out, method="dflash", dtype="float32", device="cpu", max_batch_size=4)
    ar = [o.token_ids for o in llm.generate(prompts, params, method="ar")]
    spec = llm.generate(prompts, params)
    assert [o.token_ids for o in spec] == ar


def test_training_lowers_the_loss_and_raises_acceptance(trained, tiny_pair):
    target, out, work = trained
    losses = [json.loads(line)["loss"] for line in (work / "drafter_log.jsonl").open()]
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3
    rows = [json.loads(line) for line in (work / "regenerated.jsonl").open()][:8]
    prompts = [r["ids"][:r["prompt_len"]] for r in rows]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def tau(draft):
        llm = LLM(model=target, draft=draft, method="dflash", dtype="float32", device="cpu", max_batch_size=8)
        outs = llm.generate(prompts, params, block_size=4)
        return np.mean([o.metrics.mean_accept_length for o in outs])

    untrained = tiny_pair[1]  # a random drafter for the same target (block 8, run at block 4)
    trained_tau, untrained_tau = tau(out), tau(untrained)
    print(f"tau trained {trained_tau:.2f} untrained {untrained_tau:.2f}")
    assert trained_tau > untrained_tau + 0.15


def test_feature_store_holds_the_targets_features_and_resumes(tiny_pair, tmp_path):
    from flashtree.models.loader import load_target
    from flashtree.train.features import FeatureStore
    target = load_target(tiny_pair[0], dtype="float32", device="cpu")
    rng = np.random.default_rng(1)
    rows = [{"ids": rng.integers(1, 95, int(n)).tolist()} for n in rng.integers(5, 40, 11)]
    path = tmp_path / "features.bin"

    def unpadded(i):
        ids = torch.tensor([rows[i]["ids"]])
        return target(ids, torch.arange(ids.shape[1])[None], feature_layers=[0, 2])[1][0]

    store = FeatureStore.build(target, rows, [0, 2], path, batch_tokens=64)  # several padded batches
    for i in range(len(rows)):
        got = store.batch([i], 45)[0]
        n = len(rows[i]["ids"])
        torch.testing.assert_close(got[:n], unpadded(i), atol=1e-5, rtol=1e-5)
        assert got[n:].abs().max() == 0                                        # padding is zeros
    # an interrupted build resumes: rows after `done` are recomputed, those before are kept
    meta = json.loads(path.with_suffix(".json").read_text())
    data = np.memmap(path, dtype=np.float32, mode="r+", shape=(meta["tokens"], meta["width"]))
    want = store.batch(list(range(11)), 45)
    data[:store.offsets[3]] = 7.0                                               # marks the kept rows
    data[store.offsets[3]:] = 0
    data.flush()
    path.with_suffix(".json").write_text(json.dumps({**meta, "done": 3}))
    again = FeatureStore.build(target, rows, [0, 2], path, batch_tokens=64).batch(list(range(11)), 45)
    torch.testing.assert_close(again[3:], want[3:])
    assert all((again[i, :len(rows[i]["ids"])] == 7.0).all() for i in range(3))
    # more rows after the same ones (a larger data set) keep the built rows and add the new ones
    more = rows + [{"ids": rng.integers(1, 95, int(n)).tolist()} for n in (9, 30)]
    grown = FeatureStore.build(target, more, [0, 2], path, batch_tokens=64)
    assert all((grown.batch([i], 45)[0, :len(rows[i]["ids"])] == 7.0).all() for i in range(3))
    for i in (11, 12):
        torch.testing.assert_close(grown.batch([i], len(more[i]["ids"]))[0],
                                   target(torch.tensor([more[i]["ids"]]), torch.arange(len(more[i]["ids"]))[None],
                                          feature_layers=[0, 2])[1][0], atol=1e-5, rtol=1e-5)
    # a store for other rows (not a prefix) or other layers is rebuilt, not misread
    shuffled = FeatureStore.build(target, more[::-1], [0, 2], path, batch_tokens=64)
    first = torch.tensor([more[-1]["ids"]])
    torch.testing.assert_close(shuffled.batch([0], first.shape[1])[0],
                               target(first, torch.arange(first.shape[1])[None], feature_layers=[0, 2])[1][0],
                               atol=1e-5, rtol=1e-5)
    other = FeatureStore.build(target, rows, [1], path, batch_tokens=64)
    ids = torch.tensor([rows[5]["ids"]])
    want = target(ids, torch.arange(ids.shape[1])[None], feature_layers=[1])[1][0]
    torch.testing.assert_close(other.batch([5], len(rows[5]["ids"]))[0], want, atol=1e-5, rtol=1e-5)


@needs_kernel
def test_training_reads_a_target_in_blocks_as_the_engine_serves_it(tiny_pair, tmp_path):
    """dtype auto's CPU path for a GGUF in blocks: float32 activations, a bf16 KV cache and drafter.
    Training's frozen head is the head's blocks dequantized (what the kernel multiplies, up to its
    8-bit rows), its features are stored rounded to bf16 as the engine hands them to the drafter,
    and the held-out τ runs against it."""
    from flashtree.models.loader import load_drafter, load_target
    from flashtree.models.quant import QuantLinear
    from flashtree.train.drafter import heldout_tau
    from flashtree.train.features import FeatureStore
    target = load_target(tiny_pair[0], dtype="float32", device="cpu", quant="q8_0", cache_dtype="bfloat16")
    assert isinstance(target.lm_head, QuantLinear) and target.kv_dtype == torch.bfloat16
    head = target.head_weight()
    assert head.shape == (96, target.config.hidden_size) and head.dtype == torch.float32
    x = torch.randn(5, target.config.hidden_size)
    torch.testing.assert_close(target.lm_head(x), x @ head.T, atol=0.05, rtol=0.02)
    torch.testing.assert_close(head, target.lm_head.blocks.dequantize(), atol=0, rtol=0)
    rng = np.random.default_rng(2)
    rows = [{"ids": rng.integers(1, 95, int(n)).tolist(), "prompt_len": 4} for n in rng.integers(20, 40, 4)]
    store = FeatureStore.build(target, rows, [0, 2], tmp_path / "features.bin")
    assert store.dtype == torch.bfloat16 and store.data.dtype == np.uint16
    for i, r in enumerate(rows):
        ids = torch.tensor([r["ids"]])
        feats = target(ids, torch.arange(ids.shape[1])[None], feature_layers=[0, 2])[1][0]
        assert feats.dtype == torch.float32
        got = store.batch([i], len(r["ids"]))[0]
        assert torch.equal(got, got.bfloat16().float())                        # stored rounded to bf16
        torch.testing.assert_close(got, feats, atol=1e-2, rtol=1 / 128)      # within a bf16 step
    drafter = load_drafter(tiny_pair[1], target).float()
    res = heldout_tau(drafter, target, rows, drafter.config.block_size, drafter.config.mask_token_id)
    assert 1.0 <= res["heldout_walked_tau"] <= drafter.config.block_size


def test_the_held_out_walk_predicts_the_engines_rounds(trained):
    """`chain_taus` walked as rounds (`walk`) is the τ sequence the engine's dflash rounds report on
    the same greedy answer, round for round: teacher forcing sees what inference sees, so the
    training curve's walked τ is the engine's τ, not an optimistic proxy."""
    from flashtree.models.loader import load_drafter, load_target
    from flashtree.train.drafter import chain_taus, walk
    target_dir, out, work = trained
    rows = [json.loads(line) for line in (work / "regenerated.jsonl").open()][:8]
    prompts = [r["ids"][:r["prompt_len"]] for r in rows]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(model=target_dir, method="ar", dtype="float32", device="cpu").generate(prompts, params)
    spec = LLM(model=target_dir, draft=out, method="dflash", dtype="float32", device="cpu").generate(prompts, params)
    target = load_target(target_dir, dtype="float32", device="cpu")
    drafter = load_drafter(out, target)
    compared = 0
    for prompt, a, d in zip(prompts, plain, spec):
        assert d.token_ids == a.token_ids
        taus = chain_taus(drafter, target, {"ids": prompt + a.token_ids, "prompt_len": len(prompt)},
                          drafter.config.block_size, drafter.config.mask_token_id)
        rounds = walk(taus)
        assert d.metrics.accept_lengths[:len(rounds)] == rounds
        compared += len(rounds)
    assert compared > 40 and max(t for o in spec for t in o.metrics.accept_lengths) > 1  # drafts were accepted


def test_walk_anchors_open_where_the_next_round_would(trained):
    """`walk_successors` (--walk-anchors) moves an anchor p to p + τ(p), τ by the same rule as
    `chain_taus` (its own one-row forward, independent of the training batch's layout), and keeps it
    inside the response; a short run with half its anchors walked trains."""
    from flashtree.models.loader import load_drafter, load_target
    from flashtree.train.drafter import (
        DrafterRecipe,
        chain_taus,
        usable,
        walk_successors,
    )
    target_dir, out, work = trained
    target = load_target(target_dir, dtype="float32", device="cpu")
    drafter = load_drafter(out, target).float().eval()
    B, mask_id = drafter.config.block_size, drafter.config.mask_token_id
    rows = usable([json.loads(line) for line in (work / "regenerated.jsonl").open()][:6], B)
    recipe = DrafterRecipe(block_size=B, anchors=5)
    rng = np.random.default_rng(1)
    anchors = torch.stack([torch.from_numpy(rng.integers(r["prompt_len"] - 1, len(r["ids"]) - B + 1, 5))
                           for r in rows])                                     # [N, 5]
    T = max(len(r["ids"]) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r["ids"])] = torch.tensor(r["ids"])
    feats = target(ids, torch.arange(T).expand_as(ids), feature_layers=drafter.config.target_layer_ids)[1]
    head = target.lm_head.weight.float()
    moved = walk_successors(drafter, target, head, rows, anchors, feats, recipe, mask_id, mixed=False)
    taus = []
    for i, r in enumerate(rows):
        per_pos = chain_taus(drafter, target, r, B, mask_id)                   # per_pos[j]: anchor prompt_len-1+j
        for a, m in zip(anchors[i].tolist(), moved[i].tolist()):
            tau = int(per_pos[a - (r["prompt_len"] - 1)])
            assert m == min(a + tau, len(r["ids"]) - B)
            taus.append(tau)
    assert len(set(taus)) > 1 and max(taus) > 1  # both hits and misses were walked
    report, _ = short_run(trained, "walked", "--walk-anchors", "0.5")
    assert report["steps"] == 20 and report["recipe"]["walk_anchors"] == 0.5


def test_walk_anchors_outside_zero_to_one_are_refused(trained, capsys):
    assert "--walk-anchors must be between 0 and 1" in refusal(trained, capsys, "--walk-anchors", "1.5")


def test_a_drafter_grown_by_a_layer_starts_as_the_one_it_grew_from(trained):
    """`--init-from` a drafter with fewer layers: its layers are taken as they are and the new one
    starts as the identity, so the grown drafter's first prediction is the old one's, bit for bit."""
    from flashtree.models.drafter import DFlashDrafter
    from flashtree.models.loader import load_drafter, load_target
    from flashtree.train.drafter import init_from_drafter
    target_dir, out, _ = trained
    target = load_target(target_dir, dtype="float32", device="cpu")
    old = load_drafter(out, target).float()
    cfg = DrafterConfig.from_dir(out)
    raw = json.loads((out / "config.json").read_text())
    n_layers = len(old.layers) + 1
    grown_cfg = DrafterConfig.from_dict({**raw, "num_hidden_layers": n_layers,
                                         "layer_types": ["full_attention"] * n_layers}, source="grown")
    grown = DFlashDrafter(grown_cfg)
    init_from_drafter(grown, old, target, rows=[])
    assert len(grown.layers) == len(old.layers) + 1
    g = torch.Generator().manual_seed(0)
    H, n = cfg.layers.hidden_size, len(cfg.target_layer_ids)
    embeds, feats = torch.randn(2, 4, H, generator=g), torch.randn(2, 6, n * H, generator=g)
    block_pos, ctx_pos = torch.arange(6, 10).expand(2, 4), torch.arange(6).expand(2, 6)
    with torch.no_grad():
        assert torch.equal(grown(embeds, block_pos, feats, ctx_pos), old(embeds, block_pos, feats, ctx_pos))
    with pytest.raises(Exception, match="at least as many"):
        init_from_drafter(DFlashDrafter(cfg), grown, target, rows=[])


def test_a_drafter_moved_to_more_feature_layers_keeps_its_fused_input(trained):
    """`--init-from` with other feature layers refits `fc` by least squares; over a superset of
    the old layers the old map is representable, so fc(new features) reproduces old fc(old
    features) on tokens it was not fitted on."""
    from flashtree.models.drafter import DFlashDrafter
    from flashtree.models.loader import load_drafter, load_target
    from flashtree.train.drafter import init_from_drafter
    target_dir, out, work = trained
    target = load_target(target_dir, dtype="float32", device="cpu")
    old = load_drafter(out, target).float()
    raw = json.loads((out / "config.json").read_text())
    taps = [0, 1, 2]
    assert set(old.config.target_layer_ids) < set(taps)
    moved = DFlashDrafter(DrafterConfig.from_dict(
        {**raw, "dflash_config": {**raw["dflash_config"], "target_layer_ids": taps}}, source="moved"))
    rows = [json.loads(line) for line in (work / "regenerated.jsonl").open()]
    init_from_drafter(moved, old, target, rows[:16])
    ids = torch.tensor([rows[20]["ids"]])
    pos = torch.arange(ids.shape[1])[None]
    with torch.no_grad():
        _, new = target(ids, pos, feature_layers=taps)
        _, before = target(ids, pos, feature_layers=old.config.target_layer_ids)
        want, got = old.fc(before), moved.fc(new)
    assert (got - want).norm() / want.norm() < 1e-2
    assert torch.equal(moved.layers[0].mlp.down_proj.weight, old.layers[0].mlp.down_proj.weight)


def test_feature_store_keeps_the_targets_top_k_next_tokens(tiny_pair, tmp_path):
    """With topk the store also holds, at every position, the target's K likeliest next tokens and
    their log-probabilities — as the target's own logits give them for the unpadded row — and a
    larger data set keeps them for the built rows."""
    from flashtree.models.loader import load_target
    from flashtree.train.features import FeatureStore
    target = load_target(tiny_pair[0], dtype="float32", device="cpu")
    rng = np.random.default_rng(2)
    rows = [{"ids": rng.integers(1, 95, int(n)).tolist()} for n in rng.integers(5, 40, 7)]
    path = tmp_path / "features.bin"

    def top(row, k=4):
        ids = torch.tensor([row["ids"]])
        hidden, _ = target(ids, torch.arange(ids.shape[1])[None])
        return torch.log_softmax(target.logits(hidden)[0].float(), -1).topk(k, -1)

    plain = FeatureStore.build(target, rows, [0, 2], path, batch_tokens=64)
    with pytest.raises(ValueError, match="without topk"):
        plain.teacher([0], 40)
    store = FeatureStore.build(target, rows, [0, 2], path, batch_tokens=64, topk=4)  # rebuilt with top-k
    for i, r in enumerate(rows):
        ids, probs = store.teacher([i], 45)
        n, want = len(r["ids"]), top(r)
        assert torch.equal(ids[0, :n], want.indices)
        torch.testing.assert_close(probs[0, :n], torch.softmax(want.values, -1), atol=1e-5, rtol=1e-5)
        assert probs[0, n:].abs().max() == 0 and ids[0, n:].abs().max() == 0  # padding
        assert (probs[0, :n, 0] >= probs[0, :n, 1]).all()                     # likeliest first
    more = rows + [{"ids": rng.integers(1, 95, 12).tolist()}]
    grown = FeatureStore.build(target, more, [0, 2], path, batch_tokens=64, topk=4)
    assert torch.equal(grown.teacher([7], 12)[0][0], top(more[7]).indices)
    assert torch.equal(grown.teacher([2], len(rows[2]["ids"]))[0][0], top(rows[2]).indices)
    # grown again without top-k: the built features are kept (marked here), the top-k dropped
    meta = json.loads(path.with_suffix(".json").read_text())
    data = np.memmap(path, dtype=np.float32, mode="r+", shape=(meta["tokens"], meta["width"]))
    data[:grown.offsets[1]] = 7.0
    data.flush()
    most = more + [{"ids": rng.integers(1, 95, 9).tolist()}]
    hard = FeatureStore.build(target, most, [0, 2], path, batch_tokens=64)
    assert (hard.batch([0], len(rows[0]["ids"])) == 7.0).all()
    assert not path.with_name(path.name + ".topk-ids").exists() and "topk" not in json.loads(
        path.with_suffix(".json").read_text())
    with pytest.raises(ValueError, match="without topk"):
        hard.teacher([0], 40)


def test_soft_labels_read_the_distribution_that_predicts_each_slot():
    """Slot k of a block at anchor a is token a+k, which the target's hidden state at a+k-1
    predicts: `soft_labels` reads the teacher there; with a one-hot teacher on the row's own tokens
    `slot_losses` is the hard cross-entropy, and with a spread teacher it is not."""
    from flashtree.train.drafter import (
        DrafterRecipe,
        block_batch,
        slot_losses,
        soft_labels,
    )
    rows = [{"ids": list(range(10, 30)), "prompt_len": 3}, {"ids": list(range(40, 56)), "prompt_len": 2}]
    recipe = DrafterRecipe(block_size=4, anchors=2)
    anchors = torch.tensor([[2, 9], [5, 11]])
    batch = block_batch(rows, recipe, mask_id=99, anchors=anchors)
    ids, block_pos, labels = batch[0], batch[2], batch[3]
    T, K = ids.shape[1], 3
    # teacher at position p: its first choice is the row's token at p+1 (what follows), then p+1000, p+2000
    pos = torch.arange(T)[None, :, None].expand(2, T, K)
    nxt = torch.cat([ids[:, 1:], ids[:, -1:]], 1)[:, :, None]
    t_ids = torch.cat([nxt, (pos + 1000)[:, :, 1:]], -1)
    t_ids[:, :, 2] = pos[:, :, 0] + 2000
    one_hot = torch.tensor([1.0, 0.0, 0.0]).expand(2, T, K)
    got_ids, got_p = soft_labels((t_ids, one_hot), block_pos, 4)
    drafted = labels[:, torch.arange(block_pos.shape[1]) % 4 != 0]            # [N, A*(B-1)]
    assert got_ids.shape == (2, 6, K) and torch.equal(got_ids[:, :, 0], drafted)
    assert torch.equal(got_ids[:, :, 1], block_pos[:, torch.arange(8) % 4 != 0] - 1 + 1000)
    logits = torch.randn(2, 6, 3000)
    hard = slot_losses(logits, drafted, None)
    torch.testing.assert_close(slot_losses(logits, drafted, (got_ids, got_p)), hard)
    spread = torch.tensor([0.5, 0.3, 0.2]).expand(2, 6, K)
    assert (slot_losses(logits, drafted, (got_ids, spread)) - hard).abs().max() > 0.1


def test_a_run_with_soft_labels_trains_and_records_them(trained):
    report, soft_work = short_run(trained, "soft", "--distill-topk", "4")
    assert report["steps"] == 20 and report["recipe"]["distill_topk"] == 4
    assert any(p.name.endswith(".topk-ids") for p in soft_work.iterdir())
    log = [json.loads(line) for line in (soft_work / "drafter_log.jsonl").open()]
    assert all(np.isfinite(r["loss"]) for r in log)


def test_a_negative_distill_topk_is_refused(trained, capsys):
    assert "--distill-topk must be >= 0" in refusal(trained, capsys, "--distill-topk", "-1")
