"""impl="auto" at page size 1 with the launch plan's prefix split count and with others, one shape
after another (the merge reads splits x rows x 2 KB of partials; tree CTAs share the idle SMs).

Usage (on the GPU): python tools/split_counts/splits.py OUT.json "CTX:HEADS:NODES=N1/N2/pT1/...,..."
N: a prefix split count (each split ceil(tiles / N) tiles); pT: T tiles a split, the last split
taking what is left (a shorter last split frees its SMs first for the tree CTAs launched after it).
Each row: what was asked (None: the plan's), the plan that ran, do_bench medians (40 ms, twice,
rotated inputs). Recorded: data/history/session30_h100.json, run9_splits and run10_splits
(tests/test_native.py checks the plan against them); data/history/session42_h100.json, run1_ragged;
data/history/session44_h100.json, run2_ragged (the plan's short last split against even splits,
alternating: analysis.split_length_table).
"""

import dataclasses
import json
import math
import sys

import torch

from specdiag.attention import native
from specdiag.bench.timing import Rotation, time_rotating

_plan_launch = native.plan_launch


def _tiles_per_split(per: int):
    """``native.plan_launch`` with ``per`` prefix tiles a split (the tree splits as planned)."""

    def plan(*args, **kw):
        p = _plan_launch(*args, **kw)
        tiles = math.ceil(args[2] / p.bn)
        if not 1 <= per <= tiles:
            raise SystemExit(f"splits: p{per} asks 1..{tiles} tiles a split")
        return dataclasses.replace(p, n_prefix_splits=math.ceil(tiles / per), prefix_tiles_per_split=per)

    return plan


def _parse(spec: str) -> list:
    """[((ctx, heads, nodes), [None, N or "pT", ...]), ...] from SPEC, or a one-line exit."""
    try:
        out = []
        for item in spec.split(","):
            shape, asked = item.split("=")
            ctx, h, t = (int(x) for x in shape.split(":"))
            counts = [int(a.removeprefix("p")) for a in asked.split("/")]
            if min(ctx, h, t, *counts) < 1:
                raise ValueError
            asked = [f"p{c}" if a.startswith("p") else c for a, c in zip(asked.split("/"), counts)]
            out.append(((ctx, h, t), [None, *asked]))
        return out
    except ValueError:
        raise SystemExit(f"splits: SPEC is CTX:HEADS:NODES=N/pT/...,... with positive integers, got {spec!r}") from None


def main(path: str, spec: str) -> None:
    shapes = _parse(spec)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for (ctx, h, t), asked in shapes:
        shape = f"{ctx}:{h}:{t}"
        rot = Rotation(ctx, 1, t, h, l2, seed=ctx + h + t)
        for n in asked:
            if isinstance(n, str):
                native.plan_launch = _tiles_per_split(int(n[1:]))
                try:
                    ops = rot.native_ops()
                finally:
                    native.plan_launch = _plan_launch
            else:
                ops = rot.native_ops(prefix_splits=n)
            pl = ops[0].plan
            ms = [time_rotating([op.run for op in ops], 40.0) for _ in range(2)]
            rows.append(
                dict(
                    context=ctx,
                    heads=h,
                    nodes=t,
                    asked=n,
                    impl=ops[0].impl,
                    prefix_splits=pl.n_prefix_splits,
                    per=pl.prefix_tiles_per_split,
                    tree_splits=pl.n_tree_splits,
                    m_tiles=pl.m_tiles,
                    ms=min(ms),
                    ms_runs=ms,
                )
            )
            print(
                shape,
                n,
                ops[0].impl,
                pl.n_prefix_splits,
                pl.prefix_tiles_per_split,
                [round(m * 1e3, 1) for m in ms],
                flush=True,
            )
            del ops
        del rot
        json.dump(rows, open(path, "w"), indent=1)  # (after each shape: a timeout keeps those done)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: splits.py OUT.json CTX:HEADS:NODES=N/pT/...,...")
    main(*sys.argv[1:3])
