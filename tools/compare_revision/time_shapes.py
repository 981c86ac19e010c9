"""One side of an A/B at chosen shapes: one kernel at page size 1, timed with the lib this process
imports (PYTHONPATH: this checkout's lib, or another revision's, e.g. a `git archive REV lib kernels`
unpacked elsewhere). Where that lib's NativeTreeVerify takes ``tree_in_last`` (commit 927e843), both
placements are timed.

Usage (on the GPU):
  python tools/compare_revision/time_shapes.py TAG OUT.json IMPL "CTX:HEADS:NODES[:SPLITS],..." [DEFINES]
(SPLITS: the prefix split count, in place of the plan's; DEFINES: the kernel's -D switches, "NAME=INT,...").
Rows: do_bench medians (40 ms, twice, rotated inputs), each with the SM clock and power NVML read
meanwhile where the lib has specdiag.probes.nvml.clocked (``clocks``; null without NVML). Recorded:
data/history/session30_h100.json, session31_h100.json.
"""

import inspect
import json
import sys
from functools import partial

import torch

from specdiag.attention.native import NativeTreeVerify
from specdiag.bench.timing import Rotation, time_rotating
from specdiag.bench.variants import check_switches, parse_variants

try:
    from specdiag.probes.nvml import clocked
except ImportError:  # (an older revision's lib)

    def clocked(fn):
        return fn(), None


def main(tag: str, path: str, impl: str, shapes: str, defines: str = "") -> None:
    try:
        shape_list = [[int(x) for x in sh.split(":")] for sh in shapes.split(",")]
    except ValueError:
        raise SystemExit(f"time_shapes: SHAPES are CTX:HEADS:NODES[:SPLITS],..., got {shapes!r}") from None
    try:  # (a switch the kernel never names would silently time its default build)
        switches = parse_variants(defines)[0] if defines else {}
        if switches:
            check_switches(impl, [switches])
    except ValueError as e:
        raise SystemExit(f"time_shapes: {e}") from None
    if any(len(sh) not in (3, 4) for sh in shape_list):
        raise SystemExit(f"time_shapes: each shape is CTX:HEADS:NODES[:SPLITS], got {shapes!r}")
    fold_ok = "tree_in_last" in inspect.signature(NativeTreeVerify.__init__).parameters
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for sh, (ctx, h, t, *splits) in zip(shapes.split(","), shape_list):
        rot = Rotation(ctx, 1, t, h, l2, seed=ctx + h + t)
        for fold in (False, None) if fold_ok else ("-",):
            kw = {} if fold == "-" else {"tree_in_last": fold}
            if splits:
                kw["prefix_splits"] = splits[0]
            if switches:
                kw["defines"] = switches
            ops = rot.native_ops(impl=impl, **kw)
            plan = ops[0].plan
            if fold is None and not plan.tree_in_last:
                print(tag, sh, "plan keeps tree CTAs", flush=True)
                continue
            timed = [clocked(partial(time_rotating, [op.run for op in ops], 40.0)) for _ in range(2)]
            ms, clocks = [m for m, _ in timed], [c for _, c in timed]
            rows.append(
                dict(
                    side=tag,
                    impl=impl,
                    defines=switches,
                    build=getattr(ops[0], "defines", switches),  # (with the page-size build, where the lib has one)
                    context=ctx,
                    heads=h,
                    nodes=t,
                    tree_in_last=str(fold),
                    folded=bool(getattr(plan, "tree_in_last", False)),
                    splits=plan.splits,
                    per=plan.prefix_tiles_per_split,
                    ms=min(ms),
                    ms_runs=ms,
                    clocks=clocks,
                )
            )
            mhz = [round(c["sm_clock_mhz"]) if c and c["sm_clock_mhz"] > 0 else None for c in clocks]
            us = [round(m * 1e3, 1) for m in ms]
            print(tag, sh, fold, plan.splits, plan.prefix_tiles_per_split, us, "MHz", mhz, flush=True)
            del ops
        del rot
    json.dump(rows, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:6])
