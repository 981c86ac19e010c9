"""The page_size=1 baseline kernel; on CPU it runs under TRITON_INTERPRET=1 (set in conftest)."""

import math

import pytest
import torch

from specdiag.attention import make_verify_inputs, relative_error, tree_verify_attention_ref

triton_extend = pytest.importorskip("specdiag.attention.triton_extend")
if not triton_extend.available():
    pytest.skip("triton is not installed", allow_module_level=True)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SCALE = 1 / math.sqrt(192)


@pytest.mark.parametrize(
    "lens, nodes, heads, page_size, shape",
    [
        ([37], 9, 2, 16, "random"),
        ([0, 70], 5, 1, 1, "chain"),
        ([100, 3, 64], 17, 2, 64, "fan"),  # two BLOCK_M tiles of nodes
    ],
)
def test_baseline_matches_reference(lens, nodes, heads, page_size, shape):
    x, _ = make_verify_inputs(lens, nodes, heads, page_size=page_size, tree_shape=shape, seed=len(lens) + nodes)
    ref_o, ref_l = tree_verify_attention_ref(**x, scale=SCALE)
    xd = {k: v.to(DEV) for k, v in x.items()}
    prep = triton_extend.prepare_extend_inputs(**xd)
    out, lse = triton_extend.extend_attention_fwd(prep, SCALE)
    assert torch.isfinite(out.float()).all()
    assert relative_error(out, ref_o) < 1e-2
    assert relative_error(lse, ref_l) < 1e-4


def test_prepare_builds_the_engine_layout():
    x, _ = make_verify_inputs([5, 3], nodes=2, heads=1, page_size=4, seed=3)
    p = triton_extend.prepare_extend_inputs(**x)
    assert p["kv_indptr"].tolist() == [0, 5, 8]
    assert p["qo_indptr"].tolist() == [0, 2, 4]
    # per request: q_len x (prefix + q_len) bytes, prefix columns all visible
    assert p["mask_indptr"].tolist() == [0, 2 * 7]
    assert p["custom_mask"].numel() == 2 * 7 + 2 * 5
    m0 = p["custom_mask"][:14].view(2, 7)
    assert m0[:, :5].all() and m0[:, 5:].tolist() == x["tree_mask"][0].to(torch.uint8).tolist()
    # token indices point at the same latents as the page table
    ps = 4
    for i in range(5):
        tok = p["kv_indices"][i]
        assert torch.equal(p["k_buffer"][tok], x["kv_pool"][x["page_table"][0, i // ps], i % ps])


def test_baseline_rejects_non_mla_head_dim():
    x, _ = make_verify_inputs([4], nodes=2, heads=1, page_size=4, head_dim=128, seed=0)
    with pytest.raises(ValueError, match="576"):
        triton_extend.tree_verify_attention_triton(**x, scale=SCALE)
