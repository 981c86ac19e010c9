"""The baseline: a Triton extend-attention kernel shaped like the serving engine's page_size=1 path.

What makes it the baseline is its *shape*, kept faithful to the engine's MLA extend kernel:

* the KV cache is a token pool (page_size = 1); each request's prefix is a list of token
  indices (``kv_indices`` between ``kv_indptr`` offsets) gathered one token at a time;
* grid = (batch, heads, ceil(q_len / BLOCK_M)): at batch 1 with 8 heads and a 9-node tree
  that is 8 CTAs on a 132-SM GPU, each walking the whole prefix serially;
* the custom (tree) mask is one flat uint8 array, per request ``q_len x (prefix + q_len)``
  row-major, located by ``mask_indptr``; the prefix columns are skipped (all visible), the
  tree columns are read for the extend block;
* MLA: K is the 576-wide latent split as 512 + 64 (BLOCK_DMODEL + BLOCK_DPE), V is the first 512.

It runs on the GPU, and on the CPU under ``TRITON_INTERPRET=1`` (set before importing triton).
"""

from __future__ import annotations

import torch

from .inputs import MLA_HEAD_DIM, MLA_V_DIM, check_verify_inputs, custom_mask_from_tree

try:  # triton is optional: the rest of the workbook works without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

__all__ = ["prepare_extend_inputs", "extend_attention_fwd", "tree_verify_attention_triton", "available"]


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _scores(q, qpe, k, kpe, sm_scale, UPCAST: tl.constexpr):
        """Scaled scores of the 512-wide latent part plus the 64-wide rope part."""
        if UPCAST:  # Triton's CPU interpreter has no bf16 dot
            k = k.to(tl.float32)
            kpe = kpe.to(tl.float32)
        return (tl.dot(q, k) + tl.dot(qpe, kpe)) * sm_scale

    @triton.jit
    def _online_softmax_step(qk, v, m_i, l_i, acc, UPCAST: tl.constexpr):
        """One key block of the online softmax: rescale the running sums, add P @ V."""
        n_max = tl.maximum(tl.max(qk, 1), m_i)
        n_safe = tl.where(n_max == float("-inf"), 0.0, n_max)
        re_scale = tl.exp(m_i - n_safe)
        p = tl.exp(qk - n_safe[:, None])
        l_i = l_i * re_scale + tl.sum(p, 1)
        if UPCAST:  # Triton's CPU interpreter has no bf16 dot
            acc = acc * re_scale[:, None] + tl.dot(p, v.to(tl.float32))
        else:
            acc = acc * re_scale[:, None] + tl.dot(p.to(v.dtype), v)
        return n_max, l_i, acc

    @triton.jit
    def _extend_fwd_kernel(
        Q,
        K_ext,
        K_buf,
        O,
        LSE,
        qo_indptr,
        kv_indptr,
        kv_indices,
        mask_ptr,
        mask_indptr,
        sm_scale,
        stride_qt,
        stride_qh,
        stride_kext,
        stride_kbuf,
        stride_ot,
        stride_oh,
        stride_lt,
        BLOCK_DMODEL: tl.constexpr,
        BLOCK_DPE: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        UPCAST: tl.constexpr,
    ):
        cur_seq = tl.program_id(0)
        cur_head = tl.program_id(1)
        cur_block_m = tl.program_id(2)

        q_start = tl.load(qo_indptr + cur_seq)
        q_len = tl.load(qo_indptr + cur_seq + 1) - q_start
        kv_start = tl.load(kv_indptr + cur_seq)
        prefix_len = tl.load(kv_indptr + cur_seq + 1) - kv_start
        mask_start = tl.load(mask_indptr + cur_seq)
        mask_row = prefix_len + q_len

        offs_m = cur_block_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < q_len
        offs_d = tl.arange(0, BLOCK_DMODEL)
        offs_dpe = BLOCK_DMODEL + tl.arange(0, BLOCK_DPE)
        offs_dv = tl.arange(0, BLOCK_DV)
        offs_nb = tl.arange(0, BLOCK_N)

        q_rows = (q_start + offs_m[:, None]) * stride_qt + cur_head * stride_qh
        q = tl.load(Q + q_rows + offs_d[None, :], mask=mask_m[:, None], other=0.0)
        qpe = tl.load(Q + q_rows + offs_dpe[None, :], mask=mask_m[:, None], other=0.0)
        if UPCAST:  # Triton's CPU interpreter has no bf16 dot: compute in fp32 there
            q = q.to(tl.float32)
            qpe = qpe.to(tl.float32)

        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

        # stage 1: the prefix, one token index gathered per key
        for start_n in range(0, prefix_len, BLOCK_N):
            offs_n = start_n + offs_nb
            mask_n = offs_n < prefix_len
            loc = tl.load(kv_indices + kv_start + offs_n, mask=mask_n, other=0)
            k = tl.load(K_buf + loc[None, :] * stride_kbuf + offs_d[:, None], mask=mask_n[None, :], other=0.0)
            kpe = tl.load(K_buf + loc[None, :] * stride_kbuf + offs_dpe[:, None], mask=mask_n[None, :], other=0.0)
            qk = _scores(q, qpe, k, kpe, sm_scale, UPCAST)
            qk = tl.where(mask_m[:, None] & mask_n[None, :], qk, float("-inf"))
            v = tl.load(K_buf + loc[:, None] * stride_kbuf + offs_dv[None, :], mask=mask_n[:, None], other=0.0)
            m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, UPCAST)

        # stage 2: the tree block under the custom mask
        for start_n in range(0, q_len, BLOCK_N):
            offs_n = start_n + offs_nb
            mask_n = offs_n < q_len
            k_rows = (q_start + offs_n) * stride_kext
            k = tl.load(K_ext + k_rows[None, :] + offs_d[:, None], mask=mask_n[None, :], other=0.0)
            kpe = tl.load(K_ext + k_rows[None, :] + offs_dpe[:, None], mask=mask_n[None, :], other=0.0)
            qk = _scores(q, qpe, k, kpe, sm_scale, UPCAST)
            cm = tl.load(
                mask_ptr + mask_start + offs_m[:, None] * mask_row + prefix_len + offs_n[None, :],
                mask=mask_m[:, None] & mask_n[None, :],
                other=0,
            )
            qk = tl.where((cm != 0) & mask_m[:, None] & mask_n[None, :], qk, float("-inf"))
            v = tl.load(K_ext + k_rows[:, None] + offs_dv[None, :], mask=mask_n[:, None], other=0.0)
            m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, UPCAST)

        l_safe = tl.where(l_i > 0, l_i, 1.0)
        out = acc / l_safe[:, None]
        o_rows = (q_start + offs_m[:, None]) * stride_ot + cur_head * stride_oh
        tl.store(O + o_rows + offs_dv[None, :], out.to(O.dtype.element_ty), mask=mask_m[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log(l_safe), float("-inf"))
        tl.store(LSE + (q_start + offs_m) * stride_lt + cur_head, lse, mask=mask_m)


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def prepare_extend_inputs(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask):
    """Convert the workbook's layout into the engine's page_size=1 extend layout (untimed)."""
    if q.shape[-1] != MLA_HEAD_DIM:
        raise ValueError(
            f"the baseline kernel is laid out for MLA head dim {MLA_HEAD_DIM} (512 + 64), got {q.shape[-1]}"
        )
    x = check_verify_inputs(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask)
    b, t, h, d = x.q.shape
    dev = x.q.device
    ps = x.page_size
    lens = [int(n) for n in x.prefix_lens.tolist()]
    idx = []
    for i, n in enumerate(lens):  # token ids in a page_size=1 view of the pool
        tok = torch.arange(n, device=dev)
        idx.append(x.page_table[i].to(dev).long()[tok // ps] * ps + tok % ps)
    kv_indices = torch.cat(idx).to(torch.int64) if idx else torch.zeros(0, dtype=torch.int64, device=dev)
    kv_indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int64, device=dev)
    qo_indptr = torch.arange(0, (b + 1) * t, t, dtype=torch.int64, device=dev)
    custom_mask, mask_indptr = custom_mask_from_tree(torch.tensor(lens), x.tree_mask.to(dev))
    return dict(
        q_extend=x.q.reshape(b * t, h, d).contiguous(),
        k_extend=x.tree_kv.reshape(b * t, d).contiguous(),
        k_buffer=x.kv_pool.reshape(-1, d),
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        custom_mask=custom_mask,
        mask_indptr=mask_indptr[:-1],
        shape=(b, t, h),
        batched=x.batched,
    )


def extend_attention_fwd(
    prep: dict, scale: float, block_m: int | None = None, block_n: int = 32, num_warps: int = 8, num_stages: int = 1
):
    """Run the baseline kernel on prepared inputs; returns (out [B,T,H,512], lse [B,T,H])."""
    if triton is None:
        raise RuntimeError("triton is not installed: pip install 'specdiag[triton]'")
    b, t, h = prep["shape"]
    q = prep["q_extend"]
    bm = block_m or (16 if t <= 16 else 32)
    out = torch.empty(b * t, h, MLA_V_DIM, dtype=q.dtype, device=q.device)
    lse = torch.empty(b * t, h, dtype=torch.float32, device=q.device)
    kb = prep["k_buffer"]
    ke = prep["k_extend"]
    grid = (b, h, triton.cdiv(t, bm))
    _extend_fwd_kernel[grid](
        q,
        ke,
        kb,
        out,
        lse,
        prep["qo_indptr"],
        prep["kv_indptr"],
        prep["kv_indices"],
        prep["custom_mask"],
        prep["mask_indptr"],
        float(scale),
        q.stride(0),
        q.stride(1),
        ke.stride(0),
        kb.stride(0),
        out.stride(0),
        out.stride(1),
        lse.stride(0),
        BLOCK_DMODEL=512,
        BLOCK_DPE=64,
        BLOCK_DV=MLA_V_DIM,
        BLOCK_M=bm,
        BLOCK_N=block_n,
        UPCAST=_interpreting() and q.dtype == torch.bfloat16,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    out, lse = out.view(b, t, h, MLA_V_DIM), lse.view(b, t, h)
    return (out, lse) if prep["batched"] else (out[0], lse[0])


def tree_verify_attention_triton(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, **kw):
    """Convenience: prepare + run; same contract as ``tree_verify_attention_ref``."""
    return extend_attention_fwd(
        prepare_extend_inputs(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask), scale, **kw
    )
