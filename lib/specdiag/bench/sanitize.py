"""compute-sanitizer (memcheck, racecheck, synccheck) over every native kernel and the merge, on
small shapes: ragged batches, page sizes 1 and 64, an empty prefix, several splits.

``sanitize()`` runs each tool on ``python -m specdiag.bench.sanitize --workload IMPL`` in a child
process and parses the tool's summary line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

TOOLS = ("memcheck", "racecheck", "synccheck")
# (prefix_lens, nodes, heads, page_size, prefix_splits)
WORKLOAD = (
    ([300], 9, 8, 64, 3),
    ([0, 200, 31], 33, 4, 1, 2),
    ([129], 65, 2, 16, None),
)
_SUMMARY = re.compile(r"(ERROR|RACECHECK) SUMMARY: (\d+) (errors|hazards)")

__all__ = ["TOOLS", "WORKLOAD", "run_workload", "sanitize"]


def run_workload(impl: str) -> None:
    """Every WORKLOAD case through ``impl``'s partial kernel and the merge, checked against float64."""
    import torch

    from ..attention import make_verify_inputs, relative_error, tree_verify_attention_ref
    from ..attention.native import NativeTreeVerify
    from ..cost import SOFTMAX_SCALE

    for lens, t, h, ps, splits in WORKLOAD:
        x, _ = make_verify_inputs(lens, t, h, page_size=ps, seed=t, device="cuda")
        out, lse = NativeTreeVerify(**x, scale=SOFTMAX_SCALE, impl=impl, prefix_splits=splits).run()
        torch.cuda.synchronize()
        ref, _ = tree_verify_attention_ref(**{k: v.cpu() for k, v in x.items()}, scale=SOFTMAX_SCALE)
        err = relative_error(out.cpu(), ref)
        if err > 1e-2:
            raise SystemExit(f"{impl} {lens} T={t} H={h} ps={ps}: relative error {err:.2e}")


def sanitize(impls, tools=TOOLS, progress=print) -> list[dict]:
    """One row per (tool, impl): the tool's count of errors or hazards and its summary line."""
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        raise RuntimeError("compute-sanitizer is not on PATH")
    rows = []
    for tool in tools:
        for impl in impls:
            t0 = time.time()
            cmd = [exe, "--tool", tool, sys.executable, "-m", "specdiag.bench.sanitize", "--workload", impl]
            res = subprocess.run(cmd, capture_output=True, text=True)
            found = _SUMMARY.findall(res.stdout + res.stderr)
            row = dict(
                tool=tool,
                impl=impl,
                exit_code=res.returncode,
                findings=int(found[-1][1]) if found else None,
                summary=" ".join(found[-1]) if found else (res.stdout + res.stderr)[-2000:],
                seconds=round(time.time() - t0, 1),
            )
            rows.append(row)
            progress(f"{tool:>9} {impl:>13}: {row['findings']} findings, exit {res.returncode} ({row['seconds']} s)")
    return rows


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--workload":
        raise SystemExit("usage: python -m specdiag.bench.sanitize --workload IMPL")
    run_workload(sys.argv[2])
