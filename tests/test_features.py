"""Drafter features follow HF `hidden_states` (SPEC §2): id L = hidden_states[L+1], the last one
post-norm; default layer ids follow z-lab's `build_target_layer_ids` and never tap the last layer."""
import json
import shutil

import numpy as np
import pytest
import torch

from flashtree import LLM, SamplingParams
from flashtree.cli import main
from flashtree.config import ConfigError, DrafterConfig, build_target_layer_ids
from flashtree.engine.block_manager import BlockManager
from flashtree.engine.model_runner import ModelRunner
from flashtree.models.loader import load_target
from helpers import make_drafter, make_hf_target

CASES = {"qwen3": dict(tie_word_embeddings=True), "llama": dict(tie_word_embeddings=False),
         "qwen2": dict(tie_word_embeddings=False)}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """Ours and transformers on one checkpoint whose norms (and qwen2 biases) are random, so a
    feature taken before the final norm, or a norm weight dropped, shows."""
    import transformers
    d = make_hf_target(tmp_path_factory.mktemp(request.param), request.param, **CASES[request.param])
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.empty_like(p).uniform_(0.5, 1.5) if "norm" in name else torch.randn_like(p) * 0.1)
    hf.save_pretrained(d, safe_serialization=True)
    return load_target(d, dtype="float32", device="cpu"), hf.eval()


def hf_features(hf, ids, layer_ids):
    with torch.no_grad():
        hs = hf(ids, output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1] for i in layer_ids], dim=-1)


def test_every_layer_id_matches_hf_hidden_states_on_the_training_path(pair):
    ours, hf = pair
    L = ours.config.num_hidden_layers
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(20).expand(2, -1)
    for layer_ids in [[i] for i in range(L)] + [[L - 1, 0, 1]]:
        with torch.no_grad():
            hidden, feats = ours(ids, pos, feature_layers=layer_ids)
        ref = hf_features(hf, ids, layer_ids)
        assert feats.shape == ref.shape
        assert (feats - ref).abs().max() < 1e-4, layer_ids
    assert (hidden - hf_features(hf, ids, [L - 1])).abs().max() < 1e-4  # the last feature is the final hidden


def test_features_through_the_cache_match_hf_in_prefill_and_decode(pair):
    ours, hf = pair
    L = ours.config.num_hidden_layers
    layer_ids = list(range(L))
    ids = torch.randint(0, 96, (1, 16), generator=torch.Generator().manual_seed(1))
    ref = hf_features(hf, ids, layer_ids)[0]
    blocks = BlockManager(9, 8, 1, 17)
    blocks.allocate()
    assert blocks.reserve(0, 64)
    runner = ModelRunner(ours, None, blocks, layer_ids)
    got = []
    for start, end in ((0, 10), *((t, t + 1) for t in range(10, 16))):  # prefill, then one token at a time
        T = end - start
        with torch.no_grad():
            runner.run_target(ids[:, start:end], torch.arange(start, end)[None], [0], torch.tensor([start]),
                              torch.ones(1, T, T, dtype=torch.bool).tril(), torch.arange(T))
        got.append(runner.features_of([0], np.array([start]), T)[0])  # the rows this forward kept
    assert (torch.cat(got) - ref).abs().max() < 1e-4


def test_the_last_feature_is_post_norm_not_the_raw_last_layer_output(pair):
    ours, hf = pair  # also guards the fixture: with these norm weights pre- and post-norm differ
    L = ours.config.num_hidden_layers
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(2))
    raw = []
    hook = hf.model.layers[-1].register_forward_hook(lambda m, i, o: raw.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        hf(ids)
        _, last = ours(ids, torch.arange(12)[None], feature_layers=[L - 1])
    hook.remove()
    assert (last - hf.model.norm(raw[0])).abs().max() < 1e-4
    assert (last - raw[0]).abs().max() > 0.1


@pytest.mark.parametrize("layers,draft,ids", [(4, 1, [2]), (36, 1, [18]), (36, 5, [1, 9, 17, 25, 33]),
                                               (28, 5, [1, 7, 13, 19, 25]), (32, 3, [1, 15, 29])])
def test_build_target_layer_ids_is_zlabs_rule(layers, draft, ids):
    assert build_target_layer_ids(layers, draft) == ids


def test_default_layer_ids_never_tap_the_last_layer():
    assert build_target_layer_ids(2, 1) == [0] and build_target_layer_ids(3, 3) == [1, 0, 0]
    with pytest.raises(ConfigError, match="no layer but the last"):
        build_target_layer_ids(1, 1)
    for layers in range(2, 81):
        for draft in range(1, 9):
            got = build_target_layer_ids(layers, draft)
            assert len(got) == draft and all(0 <= i < layers - 1 for i in got), (layers, draft, got)


def _drafter_without_layer_ids(tmp_path, tiny_pair, num_target_layers=True):
    target, drafter = tiny_pair
    d = tmp_path / "drafter"
    shutil.copytree(drafter, d)
    raw = json.loads((d / "config.json").read_text())
    del raw["dflash_config"]["target_layer_ids"]
    if not num_target_layers:
        del raw["num_target_layers"]
    (d / "config.json").write_text(json.dumps(raw))
    return target, d


def test_a_drafter_config_without_layer_ids_falls_back_to_zlabs_default(tmp_path, tiny_pair):
    target, d = _drafter_without_layer_ids(tmp_path, tiny_pair)
    assert DrafterConfig.from_dir(d).target_layer_ids == [1]  # 3 target layers, 1 drafter layer
    # a drafter that taps [1] explicitly (same weights: fc is sized for 2 ids, so build one of 1)
    one = make_drafter(tmp_path / "one", target, target_layer_ids=(1,))
    shutil.copy(one / "model.safetensors", d / "model.safetensors")
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    outs = {}
    for name, path in (("default", d), ("explicit", one)):
        llm = LLM(model=target, draft=path, method="dflash", dtype="float32", device="cpu", max_batch_size=2)
        outs[name] = [(o.token_ids, o.metrics.accept_lengths) for o in llm.generate(prompts, params)]
    assert outs["default"] == outs["explicit"]


def test_a_drafter_config_without_layer_ids_or_target_layers_is_refused(tmp_path, tiny_pair):
    _, d = _drafter_without_layer_ids(tmp_path, tiny_pair, num_target_layers=False)
    with pytest.raises(ConfigError, match="target_layer_ids.*num_target_layers"):
        DrafterConfig.from_dir(d)


def test_train_drafter_defaults_to_zlabs_layer_ids(tiny_pair, tmp_path):
    target, _ = tiny_pair
    work, out = tmp_path / "work", tmp_path / "drafter"
    work.mkdir()
    np.save(work / "corpus_tokens.npy", np.random.default_rng(0).integers(1, 95, 2000).astype(np.int32))
    base = ["train-drafter", "--target", str(target), "--work", str(work), "--mask-token-id", "95",
            "--num-sequences", "8", "--response-tokens", "16", "--anchors", "2", "--batch-size", "2",
            "--block-size", "4", "--steps", "2", "--threads", "1"]
    assert main(base + ["--out", str(out)]) == 0
    assert DrafterConfig.from_dir(out).target_layer_ids == build_target_layer_ids(3, 1) == [1]
    work2 = tmp_path / "work2"
    shutil.copytree(work, work2, ignore=shutil.ignore_patterns("drafter_*"))
    base[base.index(str(work))] = str(work2)
    assert main(base + ["--out", str(tmp_path / "two"), "--layers", "2"]) == 0
    assert DrafterConfig.from_dir(tmp_path / "two").target_layer_ids == build_target_layer_ids(3, 2) == [1, 0]
