"""One side of tools/compare_revision/run.sh: with PYTHONPATH=<a revision's lib>, mode out|time TAG FILE."""

import json
import math
import sys

import torch

from specdiag.attention import make_verify_inputs
from specdiag.attention.native import NativeTreeVerify

mode, tag, path = sys.argv[1:4]

SCALE = 1 / math.sqrt(192)
try:  # every kernel of this revision's registry (revisions before it: the three it started with)
    from specdiag.attention.registry import KERNELS

    IMPLS = tuple(KERNELS)
except ImportError:
    IMPLS = ("mma", "wgmma", "wgmma_seesaw")
if mode == "out":
    cases = [
        ([1000], 9, 8, 64),
        ([70000], 9, 8, 1),
        ([4097, 33, 2000], 65, 8, 16),
        ([5000], 65, 64, 128),
        ([777, 3001], 257, 8, 64),
        ([185000], 9, 8, 1),
    ]
    res = {}
    for i, (lens, n, h, ps) in enumerate(cases):
        x, _ = make_verify_inputs(lens, n, h, page_size=ps, seed=100 + i, q_scale=1.0)
        x = {k: v.cuda() for k, v in x.items()}
        for impl in IMPLS:
            op = NativeTreeVerify(**x, scale=SCALE, impl=impl)
            o, l = op.run()
            torch.cuda.synchronize()
            res[f"{i}:{impl}"] = (o.cpu().clone(), l.cpu().clone(), op.plan.n_prefix_splits + op.plan.n_tree_splits)
    torch.save(res, path)
else:
    try:
        from specdiag.bench.timing import Rotation, time_rotating
    except ImportError:  # revisions up to 9b20fc9
        from specdiag.bench import _Rotation as Rotation
        from specdiag.bench import _time_rotating as time_rotating
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for ctx, h, t in [
        (185000, 8, 9),
        (185000, 8, 65),
        (131072, 64, 65),
        (65536, 64, 257),
        (32768, 8, 9),
        (4096, 8, 65),
        (1024, 8, 9),
    ]:
        rot = Rotation(ctx, 64, t, h, l2, seed=ctx + h + t)
        for impl in (*IMPLS, "auto"):
            ops = [NativeTreeVerify(**rot.inputs(i), scale=SCALE, check=False, impl=impl) for i in range(rot.n)]
            ms = time_rotating([op.run for op in ops], 60)
            rows.append(dict(side=tag, context=ctx, heads=h, nodes=t, impl=impl, kernel=ops[0].impl, ms=ms))
            del ops
        del rot
        torch.cuda.empty_cache()
    json.dump(rows, open(path, "w"))
