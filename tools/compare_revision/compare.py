"""Bit-for-bit and timing comparison of two side.py runs: old.pt new.pt OUT.json TIMING.json..."""

import json
import sys

import pandas as pd
import torch

a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
out = []
for k in sorted(a.keys() ^ b.keys()):  # a kernel one revision has and the other lacks
    print(f"{k}: only in the {'old' if k in a else 'new'} revision's run")
for k in (k for k in a if k in b):
    oa, la, sa = a[k]
    ob, lb, sb = b[k]
    out.append(
        dict(
            case=k,
            splits_old=sa,
            splits_new=sb,
            out_identical=bool(torch.equal(oa, ob)),
            lse_identical=bool(torch.equal(la, lb)),
            max_abs_out=float((oa.float() - ob.float()).abs().max()),
            max_abs_lse=float((la - lb).abs().max()),
        )
    )
rows = [r for f in sys.argv[4:] for r in json.load(open(f))]
t = pd.DataFrame(rows)
g = t.groupby(["context", "heads", "nodes", "impl", "side"]).ms.agg(["min", "max"]).unstack("side")
g["new/old (best)"] = g[("min", "new")] / g[("min", "old")]
print(pd.DataFrame(out).to_string())
print((g * 1).round(4).to_string())
json.dump({"bitwise": out, "timing": rows}, open(sys.argv[3], "w"), indent=1)
