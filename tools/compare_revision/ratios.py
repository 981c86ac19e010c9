"""Two sides of an A/B from time_shapes.py recordings: every timing of a shape pooled per side,
each side's median, and B's median over A's, shape by shape. No GPU.

    python tools/compare_revision/ratios.py A.json[,A2.json...] B.json[,B2.json...]
"""

from __future__ import annotations

import json
import statistics
import sys


def pooled(rows) -> dict[tuple[int, int, int], list[float]]:
    """Every timing (ms) of each (context, heads, nodes) in time_shapes.py rows."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["context"], r["heads"], r["nodes"]), []).extend(r["ms_runs"])
    return out


def ratio_rows(a_rows, b_rows) -> list[dict]:
    """Per shape both sides time: each side's median ms, B over A, and the spread of all timings."""
    a, b = pooled(a_rows), pooled(b_rows)
    out = []
    for shape in (s for s in a if s in b):
        ma, mb = statistics.median(a[shape]), statistics.median(b[shape])
        both = a[shape] + b[shape]
        out.append(dict(shape=shape, a_ms=ma, b_ms=mb, ratio=mb / ma, spread=max(both) / min(both)))
    return out


def main(a_files: str, b_files: str) -> None:
    def load(files):
        return [r for f in files.split(",") for r in json.load(open(f))]

    rows = ratio_rows(load(a_files), load(b_files))
    if not rows:
        raise SystemExit("ratios: the two sides share no shape")
    for r in rows:
        c, h, n = r["shape"]
        print(
            f"{c:>7} x {h:>3} x {n:>3}: A {r['a_ms'] * 1e3:9.1f} us  B {r['b_ms'] * 1e3:9.1f} us  "
            f"B/A {r['ratio']:.3f}x  spread {r['spread']:.3f}x"
        )
    q = [r["ratio"] for r in rows]
    print(f"B/A: {min(q):.3f}-{max(q):.3f}x, median {statistics.median(q):.3f}x over {len(q)} shapes")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    main(*sys.argv[1:])
