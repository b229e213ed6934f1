"""The CPU top-k kernel (models/cpu_topk.cpp) the drafter's per-depth top-k goes through: the same
values and indices as torch.topk, ties to the lower index, NaN never selected, clear errors."""
import pytest
import torch

from flashtree.models import cpu_dense

pytestmark = pytest.mark.skipif(not cpu_dense.available(), reason=f"CPU kernel: {cpu_dense.why_unavailable()}")


@pytest.mark.parametrize("k", [1, 4, 8, 16, 64])
def test_matches_torch_topk_on_drafter_shaped_log_probs(k):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(3, 7, 4096, generator=g).log_softmax(-1)
    x[0, 0, 4000:] = 10.0 + torch.arange(96.0)      # the largest at the row's end (the scalar tail)
    values, ids = torch.ops.flashtree.topk(x, k)
    ref_values, ref_ids = x.topk(k, dim=-1)
    assert values.shape == ids.shape == (3, 7, k) and ids.dtype == torch.long
    assert torch.equal(values, ref_values) and torch.equal(ids, ref_ids)


def test_equal_values_go_to_the_lower_index_and_nan_is_never_selected():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 2.0, 5.0, 3.0, 1.0, 3.0],
                      [float("nan"), 1.0, float("nan"), 2.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]])
    values, ids = torch.ops.flashtree.topk(x, 4)
    assert ids.tolist() == [[7, 1, 2, 4], [3, 1, 4, 5]]
    assert values.tolist() == [[5.0, 3.0, 3.0, 3.0], [2.0, 1.0, 0.5, 0.5]]
    values, ids = torch.ops.flashtree.topk(torch.full((1, 3), float("nan")), 2)   # nothing selectable
    assert ids.tolist() == [[-1, -1]] and values.isinf().all()


def test_the_wrapper_falls_back_to_torch_above_its_k_and_errors_are_clear():
    x = torch.randn(2, 300)
    values, ids = cpu_dense.topk(x, cpu_dense.TOPK_MAX + 1)
    ref_values, ref_ids = x.topk(cpu_dense.TOPK_MAX + 1, dim=-1)
    assert torch.equal(values, ref_values) and torch.equal(ids, ref_ids)
    with pytest.raises(RuntimeError, match=r"k must be in \[1, 300\]"):
        torch.ops.flashtree.topk(x, 0)
    with pytest.raises(RuntimeError, match="float32 CPU"):
        torch.ops.flashtree.topk(x.double(), 2)
