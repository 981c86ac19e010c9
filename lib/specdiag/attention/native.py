"""The native CUDA tree-verify kernel as a torch op.

Two implementations of the partial-attention kernel share the launch plan, the partial
buffers and the LSE merge (``tree_verify_merge`` in ``kernels/tree_verify_mla.cu``):

* ``impl="mma"``: ``kernels/tree_verify_mla.cu``, mma.sync m16n8k16 (sm_80 and up);
* ``impl="wgmma"``: ``kernels/tree_verify_mla_wgmma.cu``, Hopper warpgroup MMA reading K/V
  straight from shared memory (sm_90a only, 64 query rows per CTA), tiles in a 128-byte
  swizzled layout loaded by cp.async. ``tma=True`` loads the contiguous key tiles (the tree
  block; a prefix whose page size is a multiple of 32) by TMA instead (``specdiag.tma`` encodes
  the tensor maps): 0-7% slower on the H200 (4% on average), so not the default;
* ``impl="wgmma_ws"``: ``kernels/tree_verify_mla_ws.cu``, the same tiles with the warpgroups
  specialised (FlashMLA's split of roles): warpgroup 0 computes Q K^T over all 576 dims, the
  softmax and half of P V, one or two Q K^T ahead of its P V (``lookahead``); warpgroup 1 loads the key tiles
  (4 stages) and computes the other half of P V; P goes through shared memory (two buffers);
  they meet at named barriers only (sm_90a);
* ``impl="wgmma_ws64"``: ``kernels/tree_verify_mla_ws64.cu``, the wgmma_ws roles on 64-key
  tiles (every Q K^T wgmma m64n64k16: Q read from shared memory once per 64 keys), 2 stages and
  one P buffer (sm_90a);
* ``impl="wgmma_seesaw"``: ``kernels/tree_verify_mla_seesaw.cu``, 64-key tiles taken in turn by
  two math warpgroups (FlashMLA's "seesaw" schedule), each holding half of O, with a third
  warpgroup issuing every load; each tile's P lives in the tile's own rope block (dims 512..575,
  dead once Q K^T is done) and a tile lands in three parts, so Q K^T starts on the first (sm_90a);
* ``impl="wgmma_t"``: ``kernels/tree_verify_mla_t.cu``, the transposed products for few query
  rows: keys are the 64-row M of every wgmma and query rows its N (40 per CTA), so a 72-row
  request is 80 rows of MMA work instead of 128 (sm_90a); 64-key tiles in 2 stages, roles as in
  ``wgmma_ws``;
* ``impl="auto"`` (default): on an sm_90 GPU ``wgmma_seesaw`` from a 4k-token prefix on (65-80
  query rows per request: from 32k; up to 64 rows: from 64k; 2048 rows and more: always),
  ``wgmma`` below those (``resolve_impl``), ``mma`` elsewhere.

All are checked against a float64 reference on the H200 (data/native_check_h200.json,
data/native_check_wgmma_h200.json, data/native_check_wgmma_ws_h200.json,
data/native_check_wgmma_ws64_h200.json, data/native_check_wgmma_seesaw_h200.json,
data/native_check_wgmma_t_h200.json) and timed in
data/context_sweep_h200.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .inputs import MLA_HEAD_DIM, MLA_V_DIM, check_verify_inputs

__all__ = ["NativeTreeVerify", "tree_verify_attention_native", "plan_launch", "plan_makespan", "LaunchPlan", "resolve_impl", "smem_bytes", "ws_lookahead", "WS_LOOKAHEAD_MIN_TILES", "merge_groups", "AUTO_SEESAW_MIN_PREFIX", "AUTO_SEESAW_FEW_MIN_PREFIX", "AUTO_SEESAW_FEWEST_MIN_PREFIX", "AUTO_SEESAW_MIN_ROWS", "T_ROWS", "hopper_auto", "IMPLS", "HOPPER_IMPLS"]

BN = 32  # keys per tile (must match the .cu)
STAGES = 3
DP = MLA_HEAD_DIM + 8
S_STRIDE = BN + 8  # floats per row of the partial-S exchange (tvc::s_stride in the .cuh)
IMPLS = ("mma", "wgmma", "wgmma_ws", "wgmma_ws64", "wgmma_seesaw", "wgmma_t")
HOPPER_IMPLS = ("wgmma", "wgmma_ws", "wgmma_ws64", "wgmma_seesaw", "wgmma_t")  # sm_90a only; no rg choice (64 query rows per CTA, wgmma_t: T_ROWS)
WS_STAGES = 4  # key-tile stages of the wgmma_ws kernel
T_ROWS = 40  # query rows per CTA of the transposed wgmma_t kernel (the N of its wgmmas; must match the .cu)
T_BN = 64  # keys per tile of wgmma_t (the M of its wgmmas)
T_STAGES = 2
WS64_BN = 64  # keys per tile of wgmma_ws64 and wgmma_seesaw (2 stages; must match the .cu)
SEESAW_THREADS = 384  # wgmma_seesaw: two math warpgroups and a loader


# "auto" on sm_90 (hopper_auto), by query rows per request and the longest prefix: wgmma below
# these prefixes, wgmma_seesaw from them on
AUTO_SEESAW_FEWEST_MIN_PREFIX = 65536  # up to 64 rows
AUTO_SEESAW_FEW_MIN_PREFIX = 32768     # 65-80 rows
AUTO_SEESAW_MIN_PREFIX = 4096          # more rows (at any prefix from AUTO_SEESAW_MIN_ROWS rows)
AUTO_SEESAW_MIN_ROWS = 2048


def hopper_auto(rows: int | None, max_prefix: int | None) -> str:
    """The kernel ``"auto"`` picks on sm_90 for ``rows`` query rows per request and the longest
    prefix (either may be unknown: None); see ``resolve_impl``. No torch needed: the notebooks
    apply it to recorded sweeps."""
    if rows is not None and rows <= 80:  # an unknown prefix gets the short-prefix choice
        min_prefix = AUTO_SEESAW_FEWEST_MIN_PREFIX if rows <= 64 else AUTO_SEESAW_FEW_MIN_PREFIX
        return "wgmma_seesaw" if max_prefix is not None and max_prefix >= min_prefix else "wgmma"
    if rows is not None and rows >= AUTO_SEESAW_MIN_ROWS:
        return "wgmma_seesaw"
    return "wgmma" if max_prefix is not None and max_prefix < AUTO_SEESAW_MIN_PREFIX else "wgmma_seesaw"


def resolve_impl(impl: str, device, rg: int | None = None, max_prefix: int | None = None, rows: int | None = None) -> str:
    """``"auto"`` -> the fastest kernel the device can run, by the H200 measurements
    (data/context_sweep_h200.json and the 40- and 64-row probe runs in docs/kernel_notes.md). On
    sm_90, by ``rows`` (query rows per request, heads x nodes) and the longest prefix,
    wgmma_seesaw or, below these prefixes, wgmma:

    * more than 80 rows (or ``rows`` unknown): wgmma_seesaw from a 4k prefix on (or unknown),
      and at any prefix from ``AUTO_SEESAW_MIN_ROWS`` rows. In the sweep it was the fastest kernel
      at every such shape from 16k on (1.06-1.11x over wgmma_ws64 at >= 32k) and at 4k but for
      520 rows (37.1 us against 35.5 for wgmma_ws64 and 36.0 for wgmma); at 1k, 2056 rows, within
      1% of wgmma_ws64 (58.2 vs 57.8 us); wgmma led at 1k for 520 and 576 rows;
    * 65-80 rows: wgmma_seesaw from a 32k prefix on. At 72 rows (the sweep) it took 39.8 / 57.5
      / 117.1 us at 32k / 64k / 185k against 45.7 / 73.9 / 172.4 (wgmma), 43.5 / 65.7 / 135.6
      (wgmma_ws64) and 47.8 / 68.2 / 138.6 (wgmma_t); at 16k wgmma led (31.2 vs 32.0 us);
    * up to 64 rows: wgmma_seesaw from a 64k prefix on, by probe runs at 40 and 64 rows (not in
      the sweep): 46.7 / 66.0 / 81.6 us at 64k / 128k / 185k and 40 rows against 49.0 / 77.4 /
      101.1 (wgmma) and 55.0 / 75.5 / 91.3 (wgmma_t); at 32k wgmma led (34.2 vs 38.1 us).

    wgmma_ws, wgmma_ws64 and wgmma_t are never picked now. In the sweep, only wgmma_ws64 beats
    both picks anywhere: 520 rows at 4k and 2056 rows at 1k, by 4% and 1% (above).

    Elsewhere it is mma, also when an ``rg`` other than 4 asks for fewer query rows per CTA,
    which only mma has."""
    if impl == "auto":
        if torch.cuda.get_device_capability(device) != (9, 0) or rg not in (None, 4):
            return "mma"
        return hopper_auto(rows, max_prefix)
    if impl not in IMPLS:
        raise ValueError(f"impl must be 'auto' or one of {IMPLS}, got {impl!r}")
    return impl


def smem_bytes(rg: int, impl: str = "mma") -> int:
    """Dynamic shared memory of one CTA (must match the .cu)."""
    if impl == "wgmma":  # Q (64 rows) + STAGES key tiles, unpadded swizzled layout, + 2 partial S,
        # + STAGES mbarriers (64 B), + 1024 B to align the base to the swizzle pattern
        return 64 * MLA_HEAD_DIM * 2 + STAGES * BN * MLA_HEAD_DIM * 2 + 2 * 64 * S_STRIDE * 4 + 64 + 1024
    if impl == "wgmma_ws":  # Q + WS_STAGES key tiles + 2 P buffers (64 x BN bf16) + 4 floats per row
        # (2 factor buffers, max, sum), + 1024 B alignment
        return 64 * MLA_HEAD_DIM * 2 + WS_STAGES * BN * MLA_HEAD_DIM * 2 + 2 * 64 * BN * 2 + 4 * 64 * 4 + 1024
    if impl == "wgmma_ws64":  # Q + 2 stages of WS64_BN keys + one P buffer (64 x WS64_BN bf16) + 3 floats
        # per row (factor, max, sum), + 1024 B alignment
        return 64 * MLA_HEAD_DIM * 2 + 2 * WS64_BN * MLA_HEAD_DIM * 2 + 64 * WS64_BN * 2 + 3 * 64 * 4 + 1024
    if impl == "wgmma_seesaw":  # Q + 2 stages of WS64_BN keys (each stage's P in its rope block) +
        # 6 floats per row (2 factor and 2 max buffers, 2 sums) + 2 x 3 mbarriers (a tile lands in
        # 3 parts), + 1024 B alignment
        return 64 * MLA_HEAD_DIM * 2 + 2 * WS64_BN * MLA_HEAD_DIM * 2 + 6 * 64 * 4 + 6 * 8 + 1024
    if impl == "wgmma_t":  # Q (T_ROWS rows) + T_STAGES 64-key tiles + 2 P^T buffers + 8 floats per
        # query row (2 factor buffers, 4 per-warp reductions, max, sum), + 1024 B alignment
        return T_ROWS * MLA_HEAD_DIM * 2 + T_STAGES * T_BN * MLA_HEAD_DIM * 2 + 2 * T_ROWS * T_BN * 2 + 8 * T_ROWS * 4 + 1024
    bm, nw = 16 * rg, 2 * rg
    return bm * DP * 2 + STAGES * BN * DP * 2 + nw * 16 * S_STRIDE * 4


@dataclass
class LaunchPlan:
    rg: int  # row groups of 16 query rows per CTA (1, 2 or 4)
    m_tiles: int
    n_prefix_splits: int
    prefix_tiles_per_split: int
    n_tree_splits: int
    tree_tiles_per_split: int
    bn: int = BN  # keys per tile (the unit of the tile counts above)
    cta_rows: int | None = None  # query rows per CTA where not 16 * rg (wgmma_t)

    @property
    def rows_per_cta(self) -> int:
        return self.cta_rows or 16 * self.rg

    @property
    def splits(self) -> int:
        return self.n_prefix_splits + self.n_tree_splits


# A CTA's fixed cost (Q load, pipeline fill, epilogue, its share of the merge) in key-tile
# times, and the cost a tree CTA (a few tiles, launched last) adds past its own tiles: fitted to
# the H200 tuning run (data/native_tune_h200.json: 1, 2 and 4 waves of splits at three shapes),
# whose time ratios ``plan_makespan`` reproduces within 5% (tests/test_native.py).
CTA_OVERHEAD_TILES = 7
TREE_CTA_OVERHEAD_TILES = 1


def plan_makespan(m_ctas: int, prefix_tiles: int, per: int, tree_ctas: int, tree_per: int, num_sms: int, overhead: float = CTA_OVERHEAD_TILES, tree_overhead: float = TREE_CTA_OVERHEAD_TILES) -> float:
    """Estimated kernel time in key-tile times: one CTA per SM, prefix CTAs in waves of
    ``num_sms``, tree CTAs (launched last, short) filling the last wave's idle SMs first."""
    prefix_ctas = m_ctas * math.ceil(prefix_tiles / per) if prefix_tiles else 0
    waves = math.ceil(prefix_ctas / num_sms)
    free = waves * num_sms - prefix_ctas
    extra = 0 if tree_ctas <= free else math.ceil((tree_ctas - free) / num_sms) * (tree_per + tree_overhead)
    return waves * (per + overhead) + extra


def _tree_per(tree_tiles: int, per: int, prefix_tiles: int) -> int:
    return min(tree_tiles, max(per, 4)) if prefix_tiles else tree_tiles


def plan_launch(rows: int, nodes: int, max_prefix: int, batch: int, num_sms: int, rg: int | None = None, prefix_splits: int | None = None, *, cta_rows: int | None = None, bn: int = BN) -> LaunchPlan:
    """Split-KV plan.

    64 query rows per CTA (rg=4) by default: fastest at every shape of the H200 tuning run
    (data/native_tune_h200.json), even at 72 rows, since a CTA's time per key tile barely
    depends on its rows. The prefix split count minimises ``plan_makespan``: whole waves of
    CTAs (one per SM), each split long enough to pay for a CTA's fixed cost. (The earlier rule,
    ceil(SMs / query tiles) splits, launched 135 CTAs on 132 SMs for 9 query tiles and made
    those shapes take two full CTA lifetimes: ncu, H=8 T=65 at 185k, SMs active 49% of the time.)

    ``cta_rows`` and ``bn`` describe a kernel with other CTA and tile sizes (wgmma_t: 40 query
    rows, 64-key tiles); a CTA's fixed cost is then ``CTA_OVERHEAD_TILES`` 32-key tiles' worth.
    """
    if rg is None:
        rg = 4
    if rg not in (1, 2, 4):
        raise ValueError(f"rg must be 1, 2 or 4, got {rg}")
    if min(rows, nodes, batch, num_sms) < 1 or max_prefix < 0:
        raise ValueError("rows, nodes, batch and num_sms must be >= 1 and max_prefix >= 0")
    if prefix_splits is not None and prefix_splits < 1:
        raise ValueError(f"prefix_splits must be >= 1, got {prefix_splits}")
    if (cta_rows is not None and cta_rows < 1) or bn < 1:
        raise ValueError(f"cta_rows and bn must be >= 1, got {cta_rows}, {bn}")
    m_tiles = math.ceil(rows / (cta_rows or 16 * rg))
    m_ctas = m_tiles * batch
    prefix_tiles = math.ceil(max_prefix / bn)
    tree_tiles = math.ceil(nodes / bn)
    overhead = CTA_OVERHEAD_TILES * BN / bn
    if prefix_tiles == 0:
        n_prefix, per = 0, 1
    else:
        if prefix_splits is not None:
            candidates = [min(prefix_splits, prefix_tiles)]
        else:  # enough to fill 8 waves; beyond that a CTA's fixed cost only grows the total
            candidates = range(1, min(prefix_tiles, max(1, 8 * num_sms // m_ctas)) + 1)
        best = None
        for n in candidates:
            p = math.ceil(prefix_tiles / n)
            tp = _tree_per(tree_tiles, p, prefix_tiles)
            cost = plan_makespan(m_ctas, prefix_tiles, p, m_ctas * math.ceil(tree_tiles / tp), tp, num_sms, overhead=overhead)
            if best is None or cost < best[0]:
                best = (cost, p)
        per = best[1]
        n_prefix = math.ceil(prefix_tiles / per)
    tree_per = _tree_per(tree_tiles, per, prefix_tiles)
    n_tree = math.ceil(tree_tiles / tree_per)
    return LaunchPlan(rg, m_tiles, n_prefix, per, n_tree, tree_per, bn=bn, cta_rows=cta_rows)


WS_LOOKAHEAD_MIN_TILES = 3  # query tiles from which wgmma_ws keeps two Q K^T ahead


def ws_lookahead(plan: LaunchPlan) -> int:
    """Q K^T tiles the wgmma_ws kernel issues ahead of P V for a plan.

    2 overlaps the softmax with the next Q K^T but leaves one of the 4 stages for a tile in
    flight instead of two. Measured on the H200 in one run (32k, 64k, 185k; H=8, 64; 9, 65, 257
    nodes): with 2 query tiles (72 rows) lookahead 1 was 0.5-4.7% faster, with 9 or more tiles
    (>= 520 rows) lookahead 2 was 0.1-4.9% faster. 3-8 tiles were not measured; they get 2."""
    return 2 if plan.m_tiles >= WS_LOOKAHEAD_MIN_TILES else 1


MERGE_GROUPS_MIN_SPLITS = 16


def merge_groups(splits: int) -> int:
    """Split groups of ``tree_verify_merge`` (its grid's z): 4 from 16 splits on (a row's 512
    columns over 4 CTAs, each walking a quarter of the splits: more loads in flight), else 1 (with
    few splits 4 CTAs per row would only add CTAs and reductions)."""
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    return 4 if splits >= MERGE_GROUPS_MIN_SPLITS else 1


class NativeTreeVerify:
    """Validated, allocated and planned once; ``run()`` only launches (two kernels).

    Same contract as ``tree_verify_attention_ref``: needs bf16 ``q``/``kv_pool``/``tree_kv`` of
    head dim 576 on one CUDA device; ``run()`` returns ``out`` bf16 [B, T, H, 512] and ``lse``
    float32 [B, T, H].  ``rg`` (query rows per CTA / 16) and ``prefix_splits`` override the plan;
    ``impl`` picks the partial kernel (module docstring); ``tma=True`` makes the wgmma kernel
    load contiguous tiles by TMA (for comparison); ``lookahead`` (1 or 2) how many Q K^T tiles
    the wgmma_ws kernel keeps ahead of its P V (default: ``ws_lookahead``).
    """

    def __init__(self, q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, *, rg=None, prefix_splits=None, check=True, impl="auto", tma=False, lookahead=None):
        import numpy as np

        from .. import kernels

        if impl != "auto" and impl not in IMPLS:
            raise ValueError(f"impl must be 'auto' or one of {IMPLS}, got {impl!r}")
        if tma and impl == "mma":
            raise ValueError("tma=True needs the wgmma kernel (impl='wgmma' or 'auto' on sm_90); the mma kernel loads with cp.async only")
        if tma and impl in ("wgmma_ws", "wgmma_ws64", "wgmma_seesaw", "wgmma_t"):
            raise ValueError(f"tma=True needs the wgmma kernel; the {impl} kernel loads with cp.async only")
        if lookahead not in (None, 1, 2):
            raise ValueError(f"lookahead must be 1 or 2 (Q K^T tiles issued ahead of P V), got {lookahead!r}")
        if lookahead is not None and impl not in ("wgmma_ws", "auto"):
            raise ValueError(f"lookahead is an option of the wgmma_ws kernel, not of {impl!r}")

        if impl in HOPPER_IMPLS:
            if rg not in (None, 4):
                raise ValueError(f"the {impl} kernel always takes {T_ROWS if impl == 'wgmma_t' else 64} query rows per CTA (rg=4 or None), got rg={rg}")
            rg = 4
        x = check_verify_inputs(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, MLA_V_DIM, check_pages=check)
        for name, t in (("q", x.q), ("kv_pool", x.kv_pool), ("tree_kv", x.tree_kv)):
            if t.dtype != torch.bfloat16:
                raise ValueError(f"the native kernel needs bf16 {name}, got {t.dtype}")
            if not t.is_cuda:
                raise ValueError(f"the native kernel needs {name} on a CUDA device")
        if x.head_dim != MLA_HEAD_DIM:
            raise ValueError(f"the native kernel is built for head dim {MLA_HEAD_DIM}, got {x.head_dim}")
        dev = x.q.device
        if tma and impl == "auto":
            impl = "wgmma" if resolve_impl("auto", dev, rg) != "mma" else "mma"  # the one kernel with TMA loads, where it runs
        impl = resolve_impl(impl, dev, rg, max_prefix=int(x.prefix_lens.max()), rows=x.q.shape[1] * x.q.shape[2])
        if tma and impl != "wgmma":
            raise ValueError(f"tma=True needs the wgmma kernel; 'auto' picked {impl!r} on this GPU")
        if lookahead is not None and impl != "wgmma_ws":
            raise ValueError(f"lookahead is an option of the wgmma_ws kernel, not of {impl!r}")
        if impl in HOPPER_IMPLS:
            rg = 4
        for name, t in (("kv_pool", x.kv_pool), ("tree_kv", x.tree_kv)):
            if t.device != dev:
                raise ValueError(f"{name} is on {t.device}, q on {dev}")
        b, t, h, _ = x.q.shape
        rows = t * h
        self.batched = x.batched
        self.device = dev
        self._keep = (
            x.q.contiguous(),
            x.kv_pool.contiguous(),
            x.page_table.to(device=dev, dtype=torch.int32).contiguous(),
            x.prefix_lens.to(device=dev, dtype=torch.int32).contiguous(),
            x.tree_kv.contiguous(),
            x.tree_mask.to(device=dev, dtype=torch.uint8).contiguous(),
        )
        q_, pool, pt, lens, tkv, mask = self._keep
        num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
        tiles = dict(cta_rows=T_ROWS, bn=T_BN) if impl == "wgmma_t" else dict(bn=WS64_BN) if impl in ("wgmma_ws64", "wgmma_seesaw") else {}
        self.plan = plan = plan_launch(rows, t, int(x.prefix_lens.max()), b, num_sms, rg=rg, prefix_splits=prefix_splits, **tiles)
        ns = plan.splits
        self.o_part = torch.empty(b, ns, rows, MLA_V_DIM, device=dev, dtype=torch.float32)
        self.lse_part = torch.empty(b, ns, rows, device=dev, dtype=torch.float32)
        self.out = torch.empty(b, t, h, MLA_V_DIM, device=dev, dtype=torch.bfloat16)
        self.lse = torch.empty(b, t, h, device=dev, dtype=torch.float32)
        self.impl = impl
        self.lookahead = None  # wgmma_ws only
        with torch.cuda.device(dev):
            mod = kernels.load_module("tree_verify_mla", dev.index)
            if impl == "wgmma":
                self._partial = kernels.load_module("tree_verify_mla_wgmma", dev.index).get_function("tree_verify_partial_wgmma")
            elif impl == "wgmma_ws":
                self.lookahead = lookahead or ws_lookahead(plan)
                name = "tree_verify_partial_ws" if self.lookahead == 1 else "tree_verify_partial_ws_la2"
                self._partial = kernels.load_module("tree_verify_mla_ws", dev.index).get_function(name)
            elif impl == "wgmma_ws64":
                self._partial = kernels.load_module("tree_verify_mla_ws64", dev.index).get_function("tree_verify_partial_ws64")
            elif impl == "wgmma_seesaw":
                self._partial = kernels.load_module("tree_verify_mla_seesaw", dev.index).get_function("tree_verify_partial_seesaw")
            elif impl == "wgmma_t":
                self._partial = kernels.load_module("tree_verify_mla_t", dev.index).get_function(f"tree_verify_partial_t{T_ROWS}")
            else:
                self._partial = mod.get_function(f"tree_verify_partial_rg{plan.rg}")
        self._merge = mod.get_function("tree_verify_merge")
        ptr = lambda a: np.uintp(a.data_ptr())  # noqa: E731
        i32 = np.int32
        self.tma_parts = ()
        extra = ()
        if impl == "wgmma":
            pool_map, tree_map = _tma_maps(pool, tkv, b * t) if tma else (None, None)
            self.tma_parts = tuple(n for n, m in (("prefix", pool_map), ("tree", tree_map)) if m is not None)
            self._maps = (pool_map, tree_map)  # keep the device copies alive
            extra = tuple(np.uintp(0) if m is None else ptr(m) for m in (pool_map, tree_map))
        self._partial_args = (
            ptr(q_), ptr(pool), ptr(pt), ptr(lens), ptr(tkv), ptr(mask), ptr(self.o_part), ptr(self.lse_part),
            i32(rows), i32(t), i32(h), i32(pool.shape[1]), i32(pt.shape[1]), i32(plan.n_prefix_splits),
            i32(plan.prefix_tiles_per_split), i32(plan.tree_tiles_per_split), i32(ns),
            np.float32(scale * math.log2(math.e)), *extra,
        )
        self._merge_args = (ptr(self.o_part), ptr(self.lse_part), ptr(self.out), ptr(self.lse), i32(rows), i32(ns))
        self._grid = (plan.m_tiles, ns, b)
        self._block = (SEESAW_THREADS if impl == "wgmma_seesaw" else 64 * plan.rg, 1, 1)  # Hopper: rg=4, two warpgroups (seesaw: three)
        self._smem = smem_bytes(plan.rg, impl)
        self._merge_grid = (rows, b, merge_groups(ns))
        self._launches = None

    @property
    def _partial(self):
        return self._partial_func

    @_partial.setter
    def _partial(self, func):  # a new partial kernel (the ablation's variants) is prepared again
        self._partial_func = func
        self._launches = None

    def run(self):
        from .. import kernels

        if self._launches is None:  # prepared on first use (packed arguments, shared-memory limit)
            idx = self.device.index
            self._launches = (
                kernels.PreparedLaunch(self._partial, self._grid, self._block, self._partial_args, shared=self._smem, device_index=idx),
                kernels.PreparedLaunch(self._merge, self._merge_grid, (128, 1, 1), self._merge_args, device_index=idx),
            )
        for launch in self._launches:
            launch()
        return (self.out, self.lse) if self.batched else (self.out[0], self.lse[0])


def _tma_maps(pool: torch.Tensor, tree_kv: torch.Tensor, tree_rows: int):
    """Device copies of the TMA maps of the wgmma kernel (``specdiag.tma``): the pool as
    pages * page_size token rows (only when a 32-key tile never straddles a page) and the tree
    latents as B * T rows; None where that part must use cp.async."""
    from .. import tma

    row_bytes = MLA_HEAD_DIM * 2
    maps = []
    for t, rows, ok in ((pool, pool.shape[0] * pool.shape[1], pool.shape[1] % BN == 0), (tree_kv, tree_rows, True)):
        ok = ok and rows < 2**31  # the kernel's token coordinates are int32
        if not ok or rows == 0 or t.data_ptr() % 16:
            maps.append(None)
            continue
        desc = tma.encode_tiled(tma.token_rows_map(t.data_ptr(), rows, row_bytes, BN))
        maps.append(torch.frombuffer(bytearray(desc), dtype=torch.uint8).to(t.device))
    return tuple(maps)


def tree_verify_attention_native(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, *, rg=None, prefix_splits=None, check=True, impl="auto", tma=False, lookahead=None):
    """MLA tree-verify attention on the GPU; same contract as ``tree_verify_attention_ref``."""
    op = NativeTreeVerify(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, rg=rg, prefix_splits=prefix_splits, check=check, impl=impl, tma=tma, lookahead=lookahead)
    out, lse = op.run()
    return out.clone(), lse.clone()
