"""Reference MLA tree-verify attention in plain torch (float64 capable).

Every tree node attends to the whole prefix (no mask) and to the tree block
under its ancestor mask.  ``tree_verify_attention_ref`` does it in one softmax;
``tree_verify_attention_split`` does the prefix and tree parts separately and
merges them by log-sum-exp, the way the native kernel does.  Outputs are
``out [B, T, H, dv]`` and ``lse [B, T, H]`` (natural log, over scaled scores).
"""

from __future__ import annotations

import torch

from .inputs import MLA_V_DIM, check_verify_inputs, gather_prefix

__all__ = ["tree_verify_attention_ref", "tree_verify_attention_split", "attend", "merge_partials"]


def attend(q: torch.Tensor, keys: torch.Tensor, scale: float, dv: int, mask: torch.Tensor | None = None):
    """Softmax attention of q [T, H, D] over keys [N, D] (V = keys[:, :dv]).

    ``mask`` [T, N] bool applies to every head.  With no visible key a row gets
    lse = -inf and a zero output, so it merges away cleanly.
    """
    t, h, _ = q.shape
    if keys.shape[0] == 0:
        return q.new_zeros(t, h, dv), q.new_full((t, h), float("-inf"))
    s = torch.einsum("thd,nd->thn", q, keys) * scale
    if mask is not None:
        s = s.masked_fill(~mask.bool()[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - safe[..., None])
    return torch.einsum("thn,nd->thd", p, keys[:, :dv]), lse


def merge_partials(outs, lses):
    """Combine attention over disjoint key sets: out = sum_i exp(lse_i - lse) out_i."""
    lse_all = torch.stack(list(lses))
    lse = torch.logsumexp(lse_all, dim=0)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w = torch.exp(lse_all - safe)
    out = sum(wi[..., None] * oi for wi, oi in zip(w, outs))
    return out, lse


def _run(split: bool, q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, dv, dtype):
    x = check_verify_inputs(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, dv)
    outs, lses = [], []
    for b in range(x.batch):
        qb = x.q[b].to(dtype)
        prefix = gather_prefix(x.kv_pool, x.page_table[b], int(x.prefix_lens[b])).to(dtype)
        tkv = x.tree_kv[b].to(dtype)
        mask = x.tree_mask[b].bool()
        if split:
            o1, l1 = attend(qb, prefix, scale, dv)
            o2, l2 = attend(qb, tkv, scale, dv, mask)
            o, l = merge_partials([o1, o2], [l1, l2])
        else:
            keys = torch.cat([prefix, tkv])
            full = torch.cat(
                [torch.ones(mask.shape[0], prefix.shape[0], dtype=torch.bool, device=mask.device), mask], 1
            )
            o, l = attend(qb, keys, scale, dv, full)
        outs.append(o)
        lses.append(l)
    out, lse = torch.stack(outs), torch.stack(lses)
    return (out, lse) if x.batched else (out[0], lse[0])


def tree_verify_attention_ref(
    q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, dv=MLA_V_DIM, dtype=torch.float64
):
    """One softmax over [prefix ; tree] with the ancestor mask on the tree block."""
    return _run(False, q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, dv, dtype)


def tree_verify_attention_split(
    q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, dv=MLA_V_DIM, dtype=torch.float64
):
    """Prefix part (no mask) and tree part (ancestor mask) computed apart, merged by LSE."""
    return _run(True, q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, dv, dtype)
