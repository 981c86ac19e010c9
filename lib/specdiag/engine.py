"""The native kernel fed by the serving engine's own target-verify tensors (SGLang 0.5.23, Triton
attention backend, an MLA layer, DDTree: page_size=1, every request T draft tokens).

What the engine's attention backend holds in target-verify, and what it becomes here, with no copy
of the prefix KV:

===================================  ============================================================
engine (shape, dtype)                here
===================================  ============================================================
``kv_buffer`` [slots, 1, 576] bf16    the KV pool viewed as pages of one token
``req_to_token`` [reqs, ctx] int32    rows ``req_pool_indices`` [B] as the page table (an index
                                      gather, no KV)
``seq_lens`` [B] int                  prefix lengths: tokens cached before the draft
``out_cache_loc`` [B T] int64         the draft tokens' slots: their latents (written by the engine
                                      before attention) gathered as the tree block, 1152 B a node
``custom_mask`` flat bool/uint8,      per request [T, seq_len + T] row-major from ``mask_indptr[b]``;
``mask_indptr`` [B] or [B + 1]        its last T columns are the tree mask (the engine skips the
                                      prefix columns too: ``skip_prefix_custom_mask``)
``q`` [B T, H, 576] bf16              the queries as they are; the output is [B T, H, 512] bf16
===================================  ============================================================

``EngineVerify`` is made once per decode step from the step's metadata (validated, mask taken,
kernel planned) and called once per layer with that layer's ``q`` and ``kv_buffer``. An engine
that keeps the tree as parent indices passes ``parents`` [B, T] instead of the mask: no
O(T x context) mask is ever built. ``to_verify_inputs`` is the same mapping into the reference's
layout (CPU or GPU), and ``make_engine_batch`` builds engine tensors for tests and benchmarks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .attention.inputs import MLA_HEAD_DIM, MLA_V_DIM, custom_mask_from_tree, tree_mask_from_custom_mask
from .cost import SOFTMAX_SCALE

__all__ = [
    "EngineBatch",
    "EngineVerify",
    "ancestor_mask_from_parents",
    "tree_mask_from_custom_mask",
    "custom_mask_from_tree",
    "to_verify_inputs",
    "make_engine_batch",
    "SglangVerify",
    "sglang_verify",
]


@dataclass
class EngineBatch:
    """One layer's target-verify tensors as SGLang's Triton backend holds them (see the module doc)."""

    q: torch.Tensor
    kv_buffer: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    custom_mask: torch.Tensor
    mask_indptr: torch.Tensor
    parents: torch.Tensor  # [B, T] int64, -1 for the root: the trees the mask was built from
    sm_scale: float

    @property
    def nodes(self) -> int:
        return self.out_cache_loc.numel() // self.seq_lens.numel()

    @property
    def step(self) -> tuple:
        """The step's metadata, as ``EngineVerify`` and ``SglangVerify`` take it first."""
        return (self.req_to_token, self.req_pool_indices, self.seq_lens, self.out_cache_loc, self.sm_scale)


def _draft_tokens(seq_lens: torch.Tensor, out_cache_loc: torch.Tensor) -> int:
    b = seq_lens.numel()
    if b < 1:
        raise ValueError("seq_lens is empty: no request to verify")
    n = out_cache_loc.numel()
    if n % b:
        raise ValueError(f"out_cache_loc has {n} slots, not a whole number of draft tokens for {b} requests")
    return n // b


def ancestor_mask_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """[B, T] parent indices (-1 for the root, every parent before its child) -> [B, T, T] uint8,
    mask[b, i, j] = node j is node i or an ancestor. log2(T) boolean matrix squarings on the device."""
    if parents.dim() != 2:
        raise ValueError(f"parents must be [B, T], got shape {tuple(parents.shape)}")
    b, t = parents.shape
    par = parents.to(torch.int64)
    node = torch.arange(t, device=par.device)
    ok = (par[:, 0] == -1).all() & ((par[:, 1:] >= 0) & (par[:, 1:] < node[1:])).all()
    if not bool(ok):
        raise ValueError("parents must have -1 at node 0 and 0 <= parents[:, i] < i for every other node")
    reach = torch.eye(t, device=par.device).repeat(b, 1, 1)  # reach[b, i, j]: j within 2^k steps up from i
    reach[torch.arange(b, device=par.device)[:, None], node[1:].expand(b, t - 1), par[:, 1:]] = 1.0
    for _ in range(math.ceil(math.log2(t)) if t > 1 else 0):
        reach = (torch.bmm(reach, reach) > 0).float()
    return reach.to(torch.uint8)


def _check(kv_buffer, req_to_token, req_pool_indices, seq_lens, out_cache_loc) -> None:
    if kv_buffer.dim() != 3 or kv_buffer.shape[1:] != (1, MLA_HEAD_DIM):
        raise ValueError(
            f"kv_buffer must be [slots, 1, {MLA_HEAD_DIM}] (one MLA latent per slot), got {tuple(kv_buffer.shape)}"
        )
    if req_pool_indices.numel() != seq_lens.numel():
        raise ValueError(f"req_pool_indices has {req_pool_indices.numel()} requests, seq_lens {seq_lens.numel()}")
    slots = kv_buffer.shape[0]
    rows = req_pool_indices.to(torch.int64)
    if int(rows.min()) < 0 or int(rows.max()) >= req_to_token.shape[0]:
        raise ValueError(f"req_pool_indices point outside req_to_token's {req_to_token.shape[0]} rows")
    lens = seq_lens.to(torch.int64)
    if int(lens.min()) < 0 or int(lens.max()) > req_to_token.shape[1]:
        raise ValueError(f"seq_lens must be within 0..{req_to_token.shape[1]} (req_to_token's width)")
    loc = out_cache_loc.to(torch.int64)
    if int(loc.min()) < 0 or int(loc.max()) >= slots:
        raise ValueError(f"out_cache_loc holds slots {int(loc.min())}..{int(loc.max())}, kv_buffer has {slots}")
    for b, (r, n) in enumerate(zip(rows.tolist(), lens.tolist())):
        used = req_to_token[r, :n]
        if n and (int(used.min()) < 0 or int(used.max()) >= slots):
            raise ValueError(
                f"req_to_token row {r} (request {b}) holds slots {int(used.min())}..{int(used.max())}, "
                f"kv_buffer has {slots}"
            )


def to_verify_inputs(batch: EngineBatch, use_parents: bool = False) -> dict:
    """The engine tensors in ``tree_verify_attention_ref``'s layout (q, kv_pool, page_table,
    prefix_lens, tree_kv, tree_mask), the prefix KV as a view of the buffer: what ``EngineVerify``
    hands the kernel."""
    _draft_tokens(batch.seq_lens, batch.out_cache_loc)
    _check(batch.kv_buffer, *batch.step[:4])
    tree = (
        dict(parents=batch.parents)
        if use_parents
        else dict(custom_mask=batch.custom_mask, mask_indptr=batch.mask_indptr)
    )
    ev = EngineVerify(*batch.step, **tree, check=False)
    b, t = ev.batch, ev.nodes
    return dict(
        q=batch.q.view(b, t, *batch.q.shape[1:]),
        kv_pool=batch.kv_buffer,  # [slots, 1, 576]: pages of one token
        page_table=ev.page_table,
        prefix_lens=ev.prefix_lens,
        tree_kv=batch.kv_buffer[ev.loc, 0].view(b, t, MLA_HEAD_DIM),
        tree_mask=ev.tree_mask,
    )


class EngineVerify:
    """One decode step's tree verify on the engine's tensors: made once from the step's metadata,
    then ``forward(q, kv_buffer)`` per layer returns ``o`` [B T, H, 512] bf16 (or writes ``out``).

    ``custom_mask`` + ``mask_indptr``, or ``parents`` [B, T] (no mask over the prefix needed).
    ``check``: validate slots, rows and mask sizes (host syncs; once per step)."""

    def __init__(
        self,
        req_to_token,
        req_pool_indices,
        seq_lens,
        out_cache_loc,
        sm_scale: float,
        *,
        custom_mask=None,
        mask_indptr=None,
        parents=None,
        impl: str = "auto",
        check: bool = True,
    ):
        if (custom_mask is None) == (parents is None):
            raise ValueError("pass either custom_mask with mask_indptr, or parents")
        if custom_mask is not None and mask_indptr is None:
            raise ValueError("custom_mask needs its mask_indptr")
        self.nodes = _draft_tokens(seq_lens, out_cache_loc)
        self.batch = seq_lens.numel()
        if parents is not None:
            if parents.shape != (self.batch, self.nodes):
                raise ValueError(f"parents must be [B={self.batch}, T={self.nodes}], got {tuple(parents.shape)}")
            self.tree_mask = ancestor_mask_from_parents(parents)
        else:
            self.tree_mask = tree_mask_from_custom_mask(custom_mask, mask_indptr, seq_lens, self.nodes)
        width = max(1, int(seq_lens.max()))
        self.page_table = req_to_token[req_pool_indices.to(torch.int64), :width].to(torch.int32)
        self.prefix_lens = seq_lens.to(torch.int32)
        self.loc = out_cache_loc.to(torch.int64)
        self.meta = (req_to_token, req_pool_indices, seq_lens, out_cache_loc)
        self.scale, self.impl, self.check = float(sm_scale), impl, check
        self.op = None
        self.tree_kv = None

    def forward(self, q: torch.Tensor, kv_buffer: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        from .attention.native import NativeTreeVerify

        b, t = self.batch, self.nodes
        if q.dim() != 3 or q.shape[0] != b * t:
            raise ValueError(f"q must be [B T = {b} x {t}, H, {MLA_HEAD_DIM}], got {tuple(q.shape)}")
        if self.op is None:
            if self.check:
                _check(kv_buffer, *self.meta)
            self.tree_kv = kv_buffer[self.loc, 0].view(b, t, MLA_HEAD_DIM)
            self.op = NativeTreeVerify(
                q.view(b, t, *q.shape[1:]),
                kv_buffer,
                self.page_table,
                self.prefix_lens,
                self.tree_kv,
                self.tree_mask,
                self.scale,
                impl=self.impl,
                check=False,
            )
        else:
            torch.index_select(kv_buffer[:, 0], 0, self.loc, out=self.tree_kv.view(b * t, MLA_HEAD_DIM))
            self.op.bind(q=q.view(b, t, *q.shape[1:]), kv_pool=kv_buffer)
        if out is not None:
            self.op.bind(out=out.view(b, t, q.shape[1], MLA_V_DIM))
        o, _ = self.op.run()
        return o.view(b * t, q.shape[1], MLA_V_DIM)


class SglangVerify:
    """The real sglang kernel on the same tensors, called as SGLang's Triton backend calls it in
    target-verify for MLA: its per-step metadata (``kv_indptr``, ``kv_indices`` from
    ``req_to_token``, ``qo_indptr``) made once, then ``forward(q, kv_buffer)`` per layer with
    k/v_extend = the draft tokens' latents / their first 512 columns, ``is_causal=True``,
    page_size=1. Returns ``o`` [B T, H, 512]."""

    def __init__(
        self, req_to_token, req_pool_indices, seq_lens, out_cache_loc, sm_scale, custom_mask, mask_indptr, source=None
    ):
        from .attention.peers import load_sglang_extend

        self.mod = load_sglang_extend(source)
        b = seq_lens.numel()
        self.nodes = _draft_tokens(seq_lens, out_cache_loc)
        dev = req_to_token.device
        lens = seq_lens.to(torch.int64)
        self.kv_indptr = torch.zeros(b + 1, dtype=torch.int32, device=dev)
        self.kv_indptr[1:] = lens.cumsum(0)
        rows = req_pool_indices.to(torch.int64).tolist()
        self.kv_indices = torch.cat([req_to_token[r, :n] for r, n in zip(rows, lens.tolist())]).to(torch.int64)
        self.qo_indptr = torch.arange(0, (b + 1) * self.nodes, self.nodes, dtype=torch.int32, device=dev)
        self.loc = out_cache_loc.to(torch.int64)
        self.custom_mask, self.mask_indptr = custom_mask, mask_indptr.to(torch.int64)[:b]
        self.scale = float(sm_scale)

    def forward(self, q, kv_buffer, lse=None):
        from .attention.peers import sglang_target_verify

        k_ext = kv_buffer[self.loc]  # [B T, 1, 576]: the draft tokens' latents, as the layer computed them
        o = torch.empty(q.shape[0], q.shape[1], MLA_V_DIM, dtype=q.dtype, device=q.device)
        indptrs = (self.qo_indptr, self.kv_indptr, self.mask_indptr)
        v_ext = k_ext[..., :MLA_V_DIM].contiguous()
        return sglang_target_verify(
            self.mod,
            q,
            k_ext,
            v_ext,
            o,
            kv_buffer,
            indptrs,
            self.kv_indices,
            self.custom_mask,
            self.nodes,
            self.scale,
            lse,
        )


def sglang_verify(batch: EngineBatch, source=None) -> torch.Tensor:
    """``SglangVerify`` on one ``EngineBatch``: o [B T, H, 512]."""
    return SglangVerify(*batch.step, batch.custom_mask, batch.mask_indptr, source).forward(batch.q, batch.kv_buffer)


def make_engine_batch(
    seq_lens,
    nodes: int,
    heads: int,
    *,
    budget_trees: bool = True,
    dtype=torch.bfloat16,
    device="cpu",
    seed: int = 0,
    spare_slots: int = 64,
    spare_rows: int = 3,
) -> EngineBatch:
    """Engine tensors as SGLang holds them at a verify step: shuffled slots, requests at scattered
    ``req_to_token`` rows, the draft tokens' latents already in their ``out_cache_loc`` slots (and in
    ``req_to_token`` after each prefix), DDTree trees (``build_ddtree`` over random draft
    log-probabilities when ``budget_trees``, else random shapes) and the engine's flat mask."""
    from .tree import build_ddtree, random_tree

    lens = [int(n) for n in seq_lens]
    b = len(lens)
    g = torch.Generator().manual_seed(seed)
    slots = sum(lens) + b * nodes + spare_slots
    perm = torch.randperm(slots, generator=g)
    width = max(lens) + nodes + 5
    req_to_token = torch.zeros(b + spare_rows, width, dtype=torch.int32)
    rows = torch.randperm(b + spare_rows, generator=g)[:b]
    loc, at = [], 0
    for i, n in enumerate(lens):
        req_to_token[rows[i], :n] = perm[at : at + n].to(torch.int32)
        at += n
    for i, n in enumerate(lens):
        draft = perm[at : at + nodes]
        at += nodes
        req_to_token[rows[i], n : n + nodes] = draft.to(torch.int32)
        loc.append(draft)
    trees = []
    for _ in range(b):
        if budget_trees:
            logprobs = torch.log_softmax(torch.randn(nodes, 32, generator=g) * 2, -1)
            tree = build_ddtree(logprobs, budget=nodes - 1)
        else:
            tree = random_tree(nodes, generator=g)
        if tree.num_nodes != nodes:
            raise ValueError(f"the DDTree builder made {tree.num_nodes} nodes, {nodes} asked")
        trees.append(tree)
    parents = torch.stack([t.parents for t in trees])
    tree_mask = torch.stack([t.ancestor_mask() for t in trees])
    seq = torch.tensor(lens, dtype=torch.int64)
    custom_mask, mask_indptr = custom_mask_from_tree(seq, tree_mask)
    kv_buffer = torch.randn(slots, 1, MLA_HEAD_DIM, generator=g).to(dtype)
    q = torch.randn(b * nodes, heads, MLA_HEAD_DIM, generator=g).to(dtype)
    return EngineBatch(
        q=q.to(device),
        kv_buffer=kv_buffer.to(device),
        req_to_token=req_to_token.to(device),
        req_pool_indices=rows.to(torch.int64).to(device),
        seq_lens=seq.to(device),
        out_cache_loc=torch.cat(loc).to(torch.int64).to(device),
        custom_mask=custom_mask.to(device),
        mask_indptr=mask_indptr.to(device),
        parents=parents.to(device),
        sm_scale=SOFTMAX_SCALE,
    )
