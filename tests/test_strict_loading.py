"""Strict loading: unknown tensors, sliding-window configs and a budget no method uses are refused
with a message naming the file and the tensor or field; known-ignorable tensors still load."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashtree import LLM, SamplingParams
from flashtree.config import ConfigError
from flashtree.models.loader import load_drafter, load_target
from helpers import make_hf_target


def edit_weights(src, dst, edit):
    """Copy checkpoint dir `src` to `dst` and rewrite its model.safetensors through edit(dict)."""
    shutil.copytree(src, dst)
    state = load_file(str(dst / "model.safetensors"))
    edit(state)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def edit_config(src, dst, edit):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_an_extra_target_tensor_is_an_error_naming_it(tmp_path, tiny_pair):
    bad = edit_weights(tiny_pair[0], tmp_path / "t",
                       lambda s: s.__setitem__("model.layers.0.mlp.extra_proj.weight", torch.zeros(4, 4)))
    with pytest.raises(ConfigError, match=r"model\.layers\.0\.mlp\.extra_proj\.weight") as e:
        LLM(model=bad, method="ar", device="cpu")
    assert str(bad) in str(e.value) and "model.safetensors" in str(e.value)


def test_a_renamed_target_tensor_is_an_error_naming_it(tmp_path, tiny_pair):
    bad = edit_weights(tiny_pair[0], tmp_path / "t",
                       lambda s: s.__setitem__("model.final_norm.weight", s.pop("model.norm.weight")))
    with pytest.raises(ConfigError, match=r"model\.final_norm\.weight"):
        load_target(bad, dtype="float32", device="cpu")


def test_rotary_tables_and_a_tied_head_are_ignorable(tmp_path):
    """Old HF checkpoints store `rotary_emb.inv_freq`; tied ones may store lm_head (HF ties it)."""
    src = make_hf_target(tmp_path / "src", "qwen3", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(str(src / "model.safetensors"))

    def add(s):
        s["model.rotary_emb.inv_freq"] = torch.ones(8)
        s["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        s["lm_head.weight"] = torch.randn_like(s["model.embed_tokens.weight"])

    extra = edit_weights(src, tmp_path / "extra", add)
    a, b = load_target(src, "float32", "cpu"), load_target(extra, "float32", "cpu")
    ids = torch.arange(10)[None]
    assert torch.equal(a.logits(a(ids, ids)[0]), b.logits(b(ids, ids)[0]))
    # an untied model has no such excuse: a head under an unknown name is refused
    untied = make_hf_target(tmp_path / "untied", "qwen3", tie_word_embeddings=False)
    bad = edit_weights(untied, tmp_path / "bad", lambda s: s.__setitem__("output.weight", s.pop("lm_head.weight")))
    with pytest.raises(ConfigError, match=r"output\.weight"):
        load_target(bad, "float32", "cpu")


def test_an_extra_drafter_tensor_is_an_error_naming_it(tmp_path, tiny_pair):
    bad = edit_weights(tiny_pair[1], tmp_path / "d",
                       lambda s: s.__setitem__("embed_tokens.weight", torch.zeros(96, 64)))
    with pytest.raises(ConfigError, match=r"embed_tokens\.weight") as e:
        LLM(model=tiny_pair[0], draft=bad, device="cpu")
    assert str(bad) in str(e.value)


def test_sliding_window_drafters_are_refused_naming_file_and_field(tmp_path, tiny_pair):
    def sliding_layer_types(c):
        c["layer_types"] = ["sliding_attention"]
        c["sliding_window"] = 64

    bad = edit_config(tiny_pair[1], tmp_path / "lt", sliding_layer_types)
    with pytest.raises(ConfigError, match=r"'layer_types' has 'sliding_attention' at layer\(s\) \[0\]") as e:
        LLM(model=tiny_pair[0], draft=bad, device="cpu")
    assert str(bad / "config.json") in str(e.value)

    def sliding_by_flag(c):  # no layer_types: transformers' qwen3 rule (layers >= max_window_layers)
        c.pop("layer_types", None)
        c.update(use_sliding_window=True, sliding_window=64, max_window_layers=0)

    bad = edit_config(tiny_pair[1], tmp_path / "flag", sliding_by_flag)
    target = load_target(tiny_pair[0], "float32", "cpu")
    with pytest.raises(ConfigError, match="'use_sliding_window' is true with 'sliding_window' 64") as e:
        load_drafter(bad, target)
    assert str(bad / "config.json") in str(e.value)

    def window_not_in_effect(c):  # a window the config switches off, as Qwen2.5 checkpoints ship
        c.update(use_sliding_window=False, sliding_window=4096, max_window_layers=0,
                 layer_types=["full_attention"])

    ok = edit_config(tiny_pair[1], tmp_path / "off", window_not_in_effect)
    assert load_drafter(ok, target).config.layers.num_hidden_layers == 1


def test_sliding_window_targets_are_refused(tmp_path):
    d = make_hf_target(tmp_path / "q2", "qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=1)
    cfg = json.loads((d / "config.json").read_text())
    assert "sliding_attention" in cfg["layer_types"]  # transformers would run these layers windowed
    with pytest.raises(ConfigError, match=r"'layer_types' has 'sliding_attention' at layer\(s\) \[1, 2\]"):
        load_target(d, "float32", "cpu")


def test_a_budget_is_refused_for_methods_without_a_tree(tiny_pair):
    with pytest.raises(ValueError, match="budget applies to methods 'ddtree', 'hybrid' only.*'dflash'.*block_size"):
        LLM(model=tiny_pair[0], draft=tiny_pair[1], method="dflash", budget=8, device="cpu")
    llm = LLM(model=tiny_pair[0], draft=tiny_pair[1], method="ddtree", budget=8, device="cpu", max_model_len=64)
    p = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for method in ("dflash", "ar"):
        with pytest.raises(ValueError, match=f"budget applies to methods 'ddtree', 'hybrid' only.*'{method}'"):
            llm.generate([[1, 2, 3]], p, method=method, budget=4)
    assert not llm.engine.waiting and not llm.engine.running
    # the config's budget is the ddtree default; a dflash request without one is fine
    out = llm.generate([[1, 2, 3]], p, method="dflash")[0]
    assert len(out.token_ids) == 3
