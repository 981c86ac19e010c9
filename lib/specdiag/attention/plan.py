"""Launch planning for the split-KV kernels: how many CTAs take each request's prefix and tree
block, and how many groups the merge uses. Pure arithmetic, no GPU."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "LaunchPlan",
    "plan_launch",
    "plan_makespan",
    "merge_cost",
    "merge_groups",
    "MERGE_BYTES_PER_TILE",
    "MERGE_FREE_BYTES",
    "CTA_OVERHEAD_TILES",
    "TILE_UNIT",
]

# A CTA's fixed cost (Q load, pipeline fill, epilogue, its share of the merge) in 32-key tile
# times, and what a tree CTA (a few tiles, launched last) adds past its own tiles: fitted to the
# H200 tuning run (data/native_tune_h200.json), whose time ratios plan_makespan reproduces
# within 5% (tests/test_native.py).
TILE_UNIT = 32
CTA_OVERHEAD_TILES = 7
TREE_CTA_OVERHEAD_TILES = 1
# Bytes of split partials (fp32 rows of 512) that cost one 32-key tile time past the first
# MERGE_FREE_BYTES (what L2 keeps for the merge): fitted to the H100 split-count runs of
# data/history/session30_h100.json (runs 9 and 10; tests/test_native.py checks the plan against them).
PARTIAL_ROW_BYTES = 512 * 4
MERGE_BYTES_PER_TILE = 1.6e6
MERGE_FREE_BYTES = 16e6
MERGE_GROUPS_MIN_SPLITS = 16


@dataclass(frozen=True)
class LaunchPlan:
    m_tiles: int  # query tiles (CTAs per split) per request
    n_prefix_splits: int
    prefix_tiles_per_split: int
    n_tree_splits: int
    tree_tiles_per_split: int
    bn: int  # keys per tile (the unit of the tile counts)
    rows_per_cta: int

    @property
    def splits(self) -> int:
        return self.n_prefix_splits + self.n_tree_splits

    def split_tiles(self, prefix_len: int, nodes: int) -> list[int]:
        """The tiles each split CTA of one request takes, prefix splits then tree splits (the
        kernels' ``tvc::split_work``): a request shorter than the plan's longest gets empty splits."""
        prefix, tree = math.ceil(prefix_len / self.bn), math.ceil(nodes / self.bn)
        per, tree_per = self.prefix_tiles_per_split, self.tree_tiles_per_split
        return [max(0, min(per, prefix - s * per)) for s in range(self.n_prefix_splits)] + [
            max(0, min(tree_per, tree - s * tree_per)) for s in range(self.n_tree_splits)
        ]


def plan_makespan(
    m_ctas: int,
    prefix_tiles: int,
    per: int,
    tree_ctas: int,
    tree_per: int,
    num_sms: int,
    overhead: float = CTA_OVERHEAD_TILES,
    tree_overhead: float = TREE_CTA_OVERHEAD_TILES,
    ragged: bool = False,
) -> float:
    """Estimated kernel time in key-tile times: one CTA per SM, prefix CTAs in waves of
    ``num_sms``, tree CTAs (launched last, short) filling the last wave's idle SMs first, one after
    another there as long as they end before its prefix CTAs (each tree CTA counted with a CTA's
    whole fixed cost for that), then (``ragged``: one request, whose last split's CTAs are the last
    prefix CTAs launched) the SMs of a last split shorter than ``per``, each taking the tree CTAs
    that end before the other splits do (counted the same way), the rest after it. An even split's
    rounding gets no such credit (docs/kernel_notes.md, forty-fourth session)."""
    splits = math.ceil(prefix_tiles / per) if prefix_tiles else 0
    prefix_ctas = m_ctas * splits
    waves = math.ceil(prefix_ctas / num_sms)
    free = waves * num_sms - prefix_ctas
    fit = free * max(1, math.floor(per / (tree_per + overhead))) if waves else free
    short = splits * per - prefix_tiles  # tiles the last split lacks
    if ragged and short and prefix_ctas - (waves - 1) * num_sms >= m_ctas:
        fit += m_ctas * math.floor(short / (tree_per + overhead))
    extra = 0 if tree_ctas <= fit else math.ceil((tree_ctas - fit) / num_sms) * (tree_per + tree_overhead)
    return waves * (per + overhead) + extra


def merge_cost(splits: int, rows: int, bn: int = TILE_UNIT) -> float:
    """The split partials' cost in ``bn``-key tile times: ``splits`` x ``rows`` (all requests')
    fp32 rows of 512, written by the partial kernel and read back by the merge, past the first
    MERGE_FREE_BYTES (which L2 keeps for the merge)."""
    excess = max(0, splits * rows * PARTIAL_ROW_BYTES - MERGE_FREE_BYTES)
    return excess / MERGE_BYTES_PER_TILE * TILE_UNIT / bn


def _tree_per(tree_tiles: int, per: int, prefix_tiles: int) -> int:
    return min(tree_tiles, max(per, 4)) if prefix_tiles else tree_tiles


def _ragged_length(prefix_tiles: int, per: int, tree_tiles: int, overhead: float) -> int | None:
    """The shortest split length above ``per`` with as many splits whose last split is short
    enough for a tree CTA (its tiles and ``overhead``) to end before the others; None if none."""
    n = math.ceil(prefix_tiles / per)
    if n == 1:
        return None
    for p in range(per + 1, math.ceil(prefix_tiles / (n - 1))):  # (longer still would take n - 1 splits)
        if n * p - prefix_tiles >= _tree_per(tree_tiles, p, prefix_tiles) + overhead:
            return p
    return None


def plan_launch(
    rows: int,
    nodes: int,
    max_prefix: int,
    batch: int,
    num_sms: int,
    prefix_splits: int | None = None,
    *,
    rows_per_cta: int = 64,
    bn: int = TILE_UNIT,
) -> LaunchPlan:
    """Split-KV plan for ``rows`` query rows per request (``rows_per_cta`` to a CTA) and tiles of
    ``bn`` keys: the prefix split count minimises ``plan_makespan`` (whole waves of CTAs, each
    split long enough to pay for a CTA's fixed cost) plus ``merge_cost`` (the partials the splits
    write) unless ``prefix_splits`` is given; for one request, the splits are then made longer
    (``_ragged_length``) where a short last split lets the tree CTAs end sooner."""
    if min(rows, nodes, batch, num_sms) < 1 or max_prefix < 0:
        raise ValueError("rows, nodes, batch and num_sms must be >= 1 and max_prefix >= 0")
    if prefix_splits is not None and prefix_splits < 1:
        raise ValueError(f"prefix_splits must be >= 1, got {prefix_splits}")
    if rows_per_cta < 1 or bn < 1:
        raise ValueError(f"rows_per_cta and bn must be >= 1, got {rows_per_cta}, {bn}")
    m_tiles = math.ceil(rows / rows_per_cta)
    m_ctas = m_tiles * batch
    prefix_tiles = math.ceil(max_prefix / bn)
    tree_tiles = math.ceil(nodes / bn)
    overhead = CTA_OVERHEAD_TILES * TILE_UNIT / bn
    if prefix_tiles == 0:
        n_prefix, per = 0, 1
    else:
        if prefix_splits is not None:
            candidates = [min(prefix_splits, prefix_tiles)]
        else:  # enough to fill 8 waves; beyond that a CTA's fixed cost only grows the total
            candidates = range(1, min(prefix_tiles, max(1, 8 * num_sms // m_ctas)) + 1)

        def cost(p: int, ragged: bool = False) -> float:
            tp = _tree_per(tree_tiles, p, prefix_tiles)
            n_tree = math.ceil(tree_tiles / tp)
            est = plan_makespan(m_ctas, prefix_tiles, p, m_ctas * n_tree, tp, num_sms, overhead=overhead, ragged=ragged)
            return est + merge_cost(math.ceil(prefix_tiles / p) + n_tree, rows * batch, bn)

        per = min((math.ceil(prefix_tiles / n) for n in candidates), key=cost)
        if prefix_splits is None and batch == 1:  # the same count, a short last split for the tree CTAs
            longer = _ragged_length(prefix_tiles, per, tree_tiles, overhead)
            if longer is not None and cost(longer, True) < cost(per):
                per = longer
        n_prefix = math.ceil(prefix_tiles / per)
    tree_per = _tree_per(tree_tiles, per, prefix_tiles)
    n_tree = math.ceil(tree_tiles / tree_per)
    return LaunchPlan(m_tiles, n_prefix, per, n_tree, tree_per, bn=bn, rows_per_cta=rows_per_cta)


def merge_groups(splits: int) -> int:
    """Split groups of the merge (its grid's z): 4 from 16 splits on (a row's 512 columns over 4
    CTAs, each walking a quarter of the splits: more loads in flight), else 1."""
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    return 4 if splits >= MERGE_GROUPS_MIN_SPLITS else 1
