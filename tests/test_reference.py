import math

import pytest
import torch

from specdiag.attention import (
    check_verify_inputs,
    make_verify_inputs,
    relative_error,
    tree_verify_attention_ref,
    tree_verify_attention_split,
)

SCALE = 1 / math.sqrt(192)


def elementwise_attention(x, b, t, h, scale=SCALE, dv=512):
    """Scalar-loop attention for one query row, straight from the definition."""
    q = x["q"][b, t, h].double()
    ps = x["kv_pool"].shape[1]
    n = int(x["prefix_lens"][b])
    keys = [x["kv_pool"][int(x["page_table"][b, i // ps]), i % ps].double() for i in range(n)]
    keys += [x["tree_kv"][b, j].double() for j in range(x["q"].shape[1]) if x["tree_mask"][b, t, j]]
    s = torch.stack([torch.dot(q, k) * scale for k in keys])
    m = s.max()
    w = torch.exp(s - m)
    out = sum(wi * k[:dv] for wi, k in zip(w, keys)) / w.sum()
    return out, m + torch.log(w.sum())


@pytest.mark.parametrize("seed", range(3))
def test_reference_matches_definition(seed):
    x, _ = make_verify_inputs([13, 0, 40], nodes=6, heads=3, page_size=4, seed=seed, dtype=torch.float64)
    out, lse = tree_verify_attention_ref(**x, scale=SCALE)
    g = torch.Generator().manual_seed(seed)
    for _ in range(8):
        b, t, h = (int(torch.randint(0, n, (1,), generator=g)) for n in (3, 6, 3))
        o, l = elementwise_attention(x, b, t, h)
        assert torch.allclose(out[b, t, h], o, atol=1e-12, rtol=1e-10)
        assert lse[b, t, h].item() == pytest.approx(l.item(), abs=1e-12)


@pytest.mark.parametrize("shape", ["chain", "fan", "random"])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_split_equals_unsplit(shape, page_size):
    x, _ = make_verify_inputs(
        [0, 77, 130], nodes=11, heads=4, page_size=page_size, tree_shape=shape, seed=page_size, dtype=torch.float64
    )
    o1, l1 = tree_verify_attention_ref(**x, scale=SCALE)
    o2, l2 = tree_verify_attention_split(**x, scale=SCALE)
    assert relative_error(o2, o1) < 1e-12
    assert relative_error(l2, l1) < 1e-12


def test_unbatched_inputs_and_page_order_do_not_matter():
    x, _ = make_verify_inputs([50], nodes=5, heads=2, page_size=8, seed=1, dtype=torch.float64)
    out, lse = tree_verify_attention_ref(**x, scale=SCALE)
    one = dict(
        q=x["q"][0],
        kv_pool=x["kv_pool"],
        page_table=x["page_table"][0],
        prefix_lens=int(x["prefix_lens"][0]),
        tree_kv=x["tree_kv"][0],
        tree_mask=x["tree_mask"][0],
    )
    o1, l1 = tree_verify_attention_ref(**one, scale=SCALE)
    assert o1.shape == out.shape[1:] and torch.equal(o1, out[0]) and torch.equal(l1, lse[0])
    # permute the pool's pages and the table consistently: same result
    perm = torch.randperm(x["kv_pool"].shape[0])
    inv = torch.argsort(perm)
    y = dict(x, kv_pool=x["kv_pool"][perm], page_table=inv[x["page_table"].long()].to(torch.int32))
    o2, _ = tree_verify_attention_ref(**y, scale=SCALE)
    assert relative_error(o2, out) < 1e-14


def test_masked_tree_changes_output():
    x, _ = make_verify_inputs([3], nodes=6, heads=2, page_size=4, tree_shape="chain", seed=2, dtype=torch.float64)
    o1, _ = tree_verify_attention_ref(**x, scale=SCALE)
    y = dict(x, tree_mask=torch.eye(6, dtype=torch.bool)[None])
    o2, _ = tree_verify_attention_ref(**y, scale=SCALE)
    assert torch.allclose(o1[0, 0], o2[0, 0])  # the root sees only itself either way
    assert not torch.allclose(o1[0, 5], o2[0, 5])


def _inputs():
    x, _ = make_verify_inputs([20, 5], nodes=4, heads=2, page_size=8, seed=0)
    return x


@pytest.mark.parametrize(
    "change, msg",
    [
        (lambda x: dict(x, q=x["q"][..., :100]), "kv_pool must be"),
        (lambda x: dict(x, tree_kv=x["tree_kv"][:, :3]), "tree_kv must be"),
        (lambda x: dict(x, tree_mask=torch.zeros(2, 4, 4, dtype=torch.bool)), "diagonal"),
        (lambda x: dict(x, tree_mask=x["tree_mask"].float()), "bool or uint8"),
        (lambda x: dict(x, page_table=x["page_table"] + 1000), "outside the pool"),
        (lambda x: dict(x, prefix_lens=torch.tensor([20, 999])), "outside 0.."),
        (lambda x: dict(x, prefix_lens=torch.tensor([20])), "prefix_lens must be"),
        (lambda x: dict(x, q=x["q"][0, 0]), "q must be"),
    ],
)
def test_bad_input_raises(change, msg):
    with pytest.raises(ValueError, match=msg):
        check_verify_inputs(**change(_inputs()))
