"""Shared shape checks and test-input generation for MLA tree-verify attention.

Layout (absorbed MLA, Kimi-K2 style):
  q          [B, T, H, D]      bf16/float  queries: T tree nodes x H heads, D = 576 (512 latent + 64 rope)
  kv_pool    [P, page_size, D] the paged latent KV pool; V is the first ``dv`` (512) columns of K
  page_table [B, max_pages]    int, page ids of each request's prefix in order
  prefix_lens[B]               int, prefix tokens per request (ragged)
  tree_kv    [B, T, D]         the tree nodes' own latents
  tree_mask  [B, T, T]         bool/uint8, mask[b, i, j]: node j is node i or an ancestor

A 3-D ``q`` [T, H, D] (with ``tree_kv`` [T, D], ``tree_mask`` [T, T], a 1-D page table
and an int prefix length) is accepted as a batch of one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MLA_HEAD_DIM = 576
MLA_V_DIM = 512
KV_BYTES_PER_TOKEN = MLA_HEAD_DIM * 2  # bf16, per layer


@dataclass
class VerifyInputs:
    q: torch.Tensor
    kv_pool: torch.Tensor
    page_table: torch.Tensor
    prefix_lens: torch.Tensor
    tree_kv: torch.Tensor
    tree_mask: torch.Tensor
    dv: int
    batched: bool  # whether the caller passed a batch dimension

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def nodes(self) -> int:
        return self.q.shape[1]

    @property
    def heads(self) -> int:
        return self.q.shape[2]

    @property
    def head_dim(self) -> int:
        return self.q.shape[3]

    @property
    def page_size(self) -> int:
        return self.kv_pool.shape[1]


def check_verify_inputs(
    q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, dv=MLA_V_DIM, check_pages=True
) -> VerifyInputs:
    """Validate and normalise inputs; raises ValueError with the offending shape."""
    for name, t in (("q", q), ("kv_pool", kv_pool), ("tree_kv", tree_kv), ("tree_mask", tree_mask)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    batched = q.dim() == 4
    if q.dim() == 3:
        q = q.unsqueeze(0)
        tree_kv = tree_kv.unsqueeze(0)
        tree_mask = tree_mask.unsqueeze(0)
        page_table = torch.as_tensor(page_table).reshape(1, -1)
        prefix_lens = torch.as_tensor(prefix_lens).reshape(1)
    elif q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, D] or [T, H, D], got shape {tuple(q.shape)}")
    page_table = torch.as_tensor(page_table)
    prefix_lens = torch.as_tensor(prefix_lens)
    b, t, h, d = q.shape
    if t < 1 or h < 1:
        raise ValueError(f"q needs at least one node and one head, got shape {tuple(q.shape)}")
    if kv_pool.dim() != 3 or kv_pool.shape[2] != d:
        raise ValueError(f"kv_pool must be [pages, page_size, {d}], got {tuple(kv_pool.shape)}")
    if not 0 < dv <= d:
        raise ValueError(f"dv must be in 1..{d}, got {dv}")
    if tree_kv.shape != (b, t, d):
        raise ValueError(f"tree_kv must be {(b, t, d)} to match q, got {tuple(tree_kv.shape)}")
    if tree_mask.shape != (b, t, t):
        raise ValueError(f"tree_mask must be {(b, t, t)}, got {tuple(tree_mask.shape)}")
    if tree_mask.dtype not in (torch.bool, torch.uint8):
        raise ValueError(f"tree_mask must be bool or uint8, got {tree_mask.dtype}")
    if not bool(torch.diagonal(tree_mask.bool(), dim1=1, dim2=2).all()):
        raise ValueError("tree_mask must let every node see itself (its diagonal must be all True)")
    if page_table.dim() != 2 or page_table.shape[0] != b:
        raise ValueError(f"page_table must be [B={b}, max_pages], got {tuple(page_table.shape)}")
    if page_table.dtype.is_floating_point or prefix_lens.dtype.is_floating_point:
        raise ValueError("page_table and prefix_lens must be integer tensors")
    if prefix_lens.shape != (b,):
        raise ValueError(f"prefix_lens must be [B={b}], got {tuple(prefix_lens.shape)}")
    lens = prefix_lens.tolist()
    ps = kv_pool.shape[1]
    cap = page_table.shape[1] * ps
    for i, n in enumerate(lens):
        if n < 0 or n > cap:
            raise ValueError(
                f"prefix_lens[{i}]={n} is outside 0..{cap} (page_table has {page_table.shape[1]} pages of {ps})"
            )
    if check_pages:
        for i, n in enumerate(lens):
            used = page_table[i, : (n + ps - 1) // ps]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= kv_pool.shape[0]):
                raise ValueError(
                    f"page_table row {i} points outside the pool: pages {int(used.min())}..{int(used.max())}, "
                    f"pool has {kv_pool.shape[0]}"
                )
    return VerifyInputs(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, dv, batched)


# ---- the engine's flat custom mask (SGLang's Triton backend in target-verify) ----
# per request a [T, seq_len + T] row-major block (prefix columns all 1, then the tree block),
# concatenated; mask_indptr locates each request's block


def _tree_columns(starts: torch.Tensor, lens: torch.Tensor, nodes: int) -> torch.Tensor:
    """[B, T, T] flat positions of each request's tree block in the engine's mask: request b's
    row i starts at starts[b] + i (seq_lens[b] + T), its tree columns at seq_lens[b] .. + T."""
    i = torch.arange(nodes, device=starts.device)
    return starts[:, None, None] + i[None, :, None] * (lens + nodes)[:, None, None] + lens[:, None, None] + i


def custom_mask_from_tree(seq_lens: torch.Tensor, tree_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the engine builds for the Triton backend: per request [T, seq_len + T] (prefix columns
    all 1, then the tree block), flattened and concatenated; returns (custom_mask uint8, mask_indptr [B + 1])."""
    b, t, _ = tree_mask.shape
    lens = seq_lens.to(torch.int64).to(tree_mask.device)
    sizes = t * (lens + t)
    indptr = torch.zeros(b + 1, dtype=torch.int64, device=tree_mask.device)
    indptr[1:] = sizes.cumsum(0)
    mask = torch.ones(int(indptr[-1]), dtype=torch.uint8, device=tree_mask.device)
    mask[_tree_columns(indptr[:-1], lens, t).reshape(-1)] = tree_mask.to(torch.uint8).reshape(-1)
    return mask, indptr


def tree_mask_from_custom_mask(custom_mask, mask_indptr, seq_lens, nodes: int) -> torch.Tensor:
    """The engine's flat mask -> the tree block [B, T, T] (uint8): request b's row i, columns
    seq_lens[b] .. seq_lens[b] + T. Raises if a request's rows do not hold T x (seq_len + T) values."""
    lens = seq_lens.to(torch.int64)
    starts = mask_indptr.to(torch.int64)[: lens.numel()]
    need = nodes * (lens + nodes)
    if mask_indptr.numel() == lens.numel() + 1:
        held = mask_indptr.to(torch.int64).diff()
        bad = (held != need).nonzero()
        if bad.numel():
            b = int(bad[0])
            raise ValueError(
                f"custom_mask holds {int(held[b])} values for request {b}; seq_lens[{b}]={int(lens[b])} with "
                f"{nodes} draft tokens needs {nodes} x {int(lens[b]) + nodes} = {int(need[b])}"
            )
    elif mask_indptr.numel() != lens.numel():
        raise ValueError(f"mask_indptr has {mask_indptr.numel()} entries for {lens.numel()} requests")
    end = int((starts + need).max())
    if end > custom_mask.numel():
        raise ValueError(f"custom_mask has {custom_mask.numel()} values; the requests' rows reach {end}")
    return custom_mask.reshape(-1)[_tree_columns(starts, lens, nodes)].to(torch.uint8)


def gather_prefix(kv_pool: torch.Tensor, page_row: torch.Tensor, length: int) -> torch.Tensor:
    """The ``length`` prefix latents of one request, [length, D], in token order."""
    ps = kv_pool.shape[1]
    idx = torch.arange(length, device=kv_pool.device)
    pages = page_row.to(kv_pool.device).long()[idx // ps]
    return kv_pool[pages, idx % ps]


def make_verify_inputs(
    prefix_lens,
    nodes: int,
    heads: int,
    page_size: int = 64,
    head_dim: int = MLA_HEAD_DIM,
    tree_shape: str = "random",
    dtype=torch.bfloat16,
    device="cpu",
    seed: int = 0,
    shuffle_pages: bool = True,
    extra_pages: int = 3,
    q_scale: float = 1.0,
):
    """Random, valid verify inputs (fresh values every seed): ragged prefixes, shuffled pages.

    Returns (inputs: dict of keyword arguments, trees: list of DraftTree).
    """
    from ..tree import random_tree

    lens = [int(x) for x in (prefix_lens if hasattr(prefix_lens, "__len__") else [prefix_lens])]
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    pages_per = [(n + page_size - 1) // page_size for n in lens]
    max_pages = max(1, max(pages_per))
    total = sum(pages_per) + extra_pages
    perm = torch.randperm(total, generator=g) if shuffle_pages else torch.arange(total)
    page_table = torch.full((b, max_pages), -1, dtype=torch.int32)
    at = 0
    for i, p in enumerate(pages_per):
        page_table[i, :p] = perm[at : at + p].to(torch.int32)
        at += p
    page_table[page_table < 0] = 0  # unused tail entries still point at a real page
    kv_pool = torch.randn(total, page_size, head_dim, generator=g).to(dtype)
    q = (torch.randn(b, nodes, heads, head_dim, generator=g) * q_scale).to(dtype)
    tree_kv = torch.randn(b, nodes, head_dim, generator=g).to(dtype)
    trees = [random_tree(nodes, generator=g, shape=tree_shape) for _ in range(b)]
    tree_mask = torch.stack([t.ancestor_mask() for t in trees])
    inputs = dict(
        q=q.to(device),
        kv_pool=kv_pool.to(device),
        page_table=page_table.to(device),
        prefix_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        tree_kv=tree_kv.to(device),
        tree_mask=tree_mask.to(device),
    )
    return inputs, trees


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives inf."""
    o = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    if not torch.isfinite(o).all():
        return float("inf")
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r).clamp_min(1e-300))
