"""The engine adapter: SGLang's target-verify tensors -> our layout and kernel. On CPU the mapping
is checked against the real sglang kernel (TRITON_INTERPRET=1) on the same engine tensors; on the
GPU our kernel through the adapter against the real kernel."""

import math

import pytest
import torch

from specdiag import engine
from specdiag.attention import peers, relative_error, tree_verify_attention_ref
from specdiag.tree import random_tree

needs_sglang = pytest.mark.skipif(peers.sglang_source() is None, reason="no sglang wheel (see tests/test_peers.py)")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@needs_sglang
@pytest.mark.parametrize("lens, nodes, heads", [([50], 9, 2), ([40, 0, 77, 13], 9, 2), ([30, 5], 17, 1)])
@pytest.mark.parametrize("use_parents", [False, True])
def test_adapter_mapping_matches_the_real_engine_kernel(lens, nodes, heads, use_parents):
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32  # the interpreter has no bf16 dot
    bt = engine.make_engine_batch(lens, nodes, heads, dtype=dtype, device=DEV, seed=nodes + len(lens))
    x = engine.to_verify_inputs(bt, use_parents=use_parents)
    assert x["kv_pool"].data_ptr() == bt.kv_buffer.data_ptr()  # the prefix is the engine's buffer, not a copy
    ref, _ = tree_verify_attention_ref(**{k: v.cpu() for k, v in x.items()}, scale=bt.sm_scale)
    o = engine.sglang_verify(bt)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert relative_error(o.view(ref.shape), ref) < tol


def test_parents_give_the_ancestor_mask():
    g = torch.Generator().manual_seed(3)
    for t in (1, 2, 9, 33, 100):
        trees = [random_tree(t, generator=g, shape=s) for s in ("random", "chain", "fan")]
        parents = torch.stack([tr.parents for tr in trees])
        want = torch.stack([tr.ancestor_mask() for tr in trees]).to(torch.uint8)
        assert torch.equal(engine.ancestor_mask_from_parents(parents), want), t
    with pytest.raises(ValueError, match="parents must have -1 at node 0"):
        engine.ancestor_mask_from_parents(torch.tensor([[-1, 0, 2]]))
    with pytest.raises(ValueError, match="parents must be"):
        engine.ancestor_mask_from_parents(torch.tensor([-1, 0]))


def test_flat_mask_round_trip():
    bt = engine.make_engine_batch([5, 0, 12], 4, 1, seed=2)
    tree = engine.tree_mask_from_custom_mask(bt.custom_mask, bt.mask_indptr, bt.seq_lens, 4)
    assert torch.equal(tree, engine.ancestor_mask_from_parents(bt.parents))
    assert bt.mask_indptr.tolist() == [0, 4 * 9, 4 * 9 + 4 * 4, 4 * 9 + 4 * 4 + 4 * 16]
    assert bool(bt.custom_mask[: 4 * 9].view(4, 9)[:, :5].all())  # prefix columns all visible
    # the engine's own [B] form of mask_indptr (starts only) reads the same
    again = engine.tree_mask_from_custom_mask(bt.custom_mask, bt.mask_indptr[:3], bt.seq_lens, 4)
    assert torch.equal(again, tree)


def test_bad_engine_tensors_get_one_clear_error():
    bt = engine.make_engine_batch([20, 7], 5, 2, seed=4)
    meta = dict(req_to_token=bt.req_to_token, req_pool_indices=bt.req_pool_indices, seq_lens=bt.seq_lens)
    with pytest.raises(
        ValueError,
        match=r"custom_mask holds 125 values for request 0; seq_lens\[0\]=21 with 5 draft tokens needs 5 x 26 = 130",
    ):
        engine.tree_mask_from_custom_mask(bt.custom_mask, bt.mask_indptr, bt.seq_lens + torch.tensor([1, 0]), 5)
    with pytest.raises(ValueError, match="custom_mask has 100 values; the requests' rows reach 185"):
        engine.tree_mask_from_custom_mask(bt.custom_mask[:100], bt.mask_indptr[:2], bt.seq_lens, 5)
    bad = dict(vars(bt), out_cache_loc=bt.out_cache_loc.clone())
    bad["out_cache_loc"][3] = bt.kv_buffer.shape[0]
    with pytest.raises(ValueError, match=r"out_cache_loc holds slots .*kv_buffer has \d+"):
        engine.to_verify_inputs(engine.EngineBatch(**bad))
    bad = dict(vars(bt), req_to_token=bt.req_to_token.clone())
    bad["req_to_token"][bt.req_pool_indices[1], 2] = -5
    with pytest.raises(ValueError, match=r"req_to_token row \d+ \(request 1\) holds slots -5\.\."):
        engine.to_verify_inputs(engine.EngineBatch(**bad))
    with pytest.raises(ValueError, match="req_pool_indices has 1 requests, seq_lens 2"):
        engine.to_verify_inputs(engine.EngineBatch(**dict(vars(bt), req_pool_indices=bt.req_pool_indices[:1])))
    with pytest.raises(ValueError, match="out_cache_loc has 9 slots, not a whole number of draft tokens for 2"):
        engine.EngineVerify(**meta, out_cache_loc=bt.out_cache_loc[:9], sm_scale=0.1, parents=bt.parents)
    with pytest.raises(ValueError, match="either custom_mask with mask_indptr, or parents"):
        engine.EngineVerify(**meta, out_cache_loc=bt.out_cache_loc, sm_scale=0.1)
    with pytest.raises(ValueError, match=r"parents must be \[B=2, T=5\]"):
        engine.EngineVerify(**meta, out_cache_loc=bt.out_cache_loc, sm_scale=0.1, parents=bt.parents[:, :4])


@pytest.mark.gpu
@needs_sglang
@pytest.mark.parametrize("lens", [[4096], [185000], [30000, 0, 4097, 65536]])
def test_engine_verify_matches_the_real_kernel_on_gpu(lens):
    """Our kernel through the adapter, layer after layer (plan once, bind per layer), equals the
    real sglang kernel on the engine's tensors, from the mask and from parent indices."""
    bt = engine.make_engine_batch(lens, 9, 8, device="cuda", seed=len(lens))
    meta = dict(
        req_to_token=bt.req_to_token,
        req_pool_indices=bt.req_pool_indices,
        seq_lens=bt.seq_lens,
        out_cache_loc=bt.out_cache_loc,
        sm_scale=bt.sm_scale,
    )
    by_mask = engine.EngineVerify(**meta, custom_mask=bt.custom_mask, mask_indptr=bt.mask_indptr)
    by_parents = engine.EngineVerify(**meta, parents=bt.parents)
    real = engine.SglangVerify(**meta, custom_mask=bt.custom_mask, mask_indptr=bt.mask_indptr)
    for layer in range(2):  # the second layer: other buffer and queries, the same plan
        kv = torch.randn_like(bt.kv_buffer, dtype=torch.float32).to(torch.bfloat16) if layer else bt.kv_buffer
        q = torch.randn_like(bt.q, dtype=torch.float32).to(torch.bfloat16) if layer else bt.q
        want = real.forward(q, kv)
        out = torch.empty_like(want)
        assert by_mask.forward(q, kv, out=out).data_ptr() == out.data_ptr()
        assert relative_error(out, want) < 1e-2
        assert relative_error(by_parents.forward(q, kv), want) < 1e-2
    assert math.isfinite(float(out.float().abs().max()))
