"""Fused q/k/v and gate/up projections (what `LLM` runs) compute what the HF layout computes."""
import copy

import pytest
import torch

from flashtree.models.loader import load_drafter, load_target
from helpers import make_drafter, make_hf_target


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "llama"])
def test_fused_projections_match_the_checkpoint_layout(tmp_path, model_type):
    over = {"attention_bias": True, "mlp_bias": True} if model_type == "llama" else {}
    target_dir = make_hf_target(tmp_path / "t", model_type, **over)
    plain = load_target(target_dir)
    with torch.no_grad():  # biases and norms away from their init values
        for _name, p in plain.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    fused = copy.deepcopy(plain).fuse()
    names = {n for n, _ in fused.named_parameters()}
    assert any("qkv_proj" in n for n in names) and not any(".q_proj" in n for n in names)
    assert any("gate_up_proj" in n for n in names)
    ids = torch.randint(0, 96, (2, 7))
    pos = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        (h0, f0), (h1, f1) = plain(ids, pos, feature_layers=[0, 2]), fused(ids, pos, feature_layers=[0, 2])
    torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f1, f0, rtol=1e-5, atol=1e-5)
    drafter = load_drafter(make_drafter(tmp_path / "d", target_dir, block_size=4), plain)
    fused_d = copy.deepcopy(drafter).fuse()
    x, bpos = torch.randn(2, 4, 64), torch.arange(7, 11).expand(2, 4)
    ctx, cpos = torch.randn(2, 7, 128), pos
    mask = torch.ones(2, 1, 4, 11, dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(fused_d(x, bpos, ctx, cpos, mask=mask), drafter(x, bpos, ctx, cpos, mask=mask),
                                   rtol=1e-5, atol=1e-5)
