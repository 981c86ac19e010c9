"""Where the seesaw kernel's warps wait: Nsight Compute's warp-stall sampling (its SourceCounters
section), per SASS instruction, summed per warp role.

``profile()`` runs ncu on ``python -m specdiag.bench.stalls --launch SHAPES`` in a child process
(one launch of the default build per shape, after a warm-up, between cudaProfilerStart and Stop)
and returns ncu's source page as CSV text. ``parse_source_csv`` reads that page; ``summarize``
splits each kernel's instructions at the loader's register release (``USETMAXREG.DEALLOC``: the
math warpgroups' code comes before it, the loader's after) and sums the samples per stall reason,
and lists the instructions that hold the most samples.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import tempfile
from pathlib import Path

from ..probes.ncu import find_ncu

__all__ = ["STALL_SHAPES", "parse_source_csv", "summarize", "profile", "launch"]

STALL_SHAPES = ((185000, 8, 9), (32768, 64, 65))  # the deployment's; many query rows
_SPLIT = "USETMAXREG.DEALLOC"  # the loader warpgroup's first instruction of its own
_TOTAL = "Warp Stall Sampling (All Samples)"


def parse_source_csv(text: str) -> list[dict]:
    """ncu's ``--page source --csv --print-source sass`` output: one entry per profiled kernel
    launch, in order, with its instructions (``sass``, ``samples``, ``executed`` and one count per
    stall reason, the ``stall_*`` columns without their "(Not Issued)" twins)."""
    kernels = []
    for block in text.split('"Kernel Name"')[1:]:
        name_line, _, rest = block.partition("\n")
        rows = list(csv.reader(io.StringIO(rest)))
        if not rows:
            continue
        head, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
        col = {h: i for i, h in enumerate(head)}
        missing = {"Source", _TOTAL, "Instructions Executed"} - set(col)
        if missing:
            raise ValueError(f"ncu source page without {sorted(missing)}: not a --page source --csv export")
        reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]

        def num(r, h):
            v = r[col[h]]
            return int(v) if v not in ("", "-") else 0

        kernels.append(
            dict(
                kernel=name_line.strip().strip(",").strip('"'),
                instructions=[
                    dict(
                        sass=r[col["Source"]].strip(),
                        samples=num(r, _TOTAL),
                        executed=num(r, "Instructions Executed"),
                        stalls={h[len("stall_") :]: num(r, h) for h in reasons},
                    )
                    for r in body
                ],
            )
        )
    return kernels


def summarize(kernels: list[dict], shapes, top: int = 6) -> list[dict]:
    """Per kernel launch (``shapes`` names them, in launch order): for the math warpgroups and the
    loader, the samples, the warp instructions executed, the samples per stall reason, and the
    ``top`` instructions by samples (index, SASS, the instruction before it, samples, their
    largest reason)."""
    if len(kernels) != len(shapes):
        raise ValueError(f"{len(kernels)} profiled launches for {len(shapes)} shapes")
    out = []
    for k, shape in zip(kernels, shapes):
        ins = k["instructions"]
        split = next((i for i, x in enumerate(ins) if _SPLIT in x["sass"]), None)
        if split is None:
            raise ValueError(f"no {_SPLIT} in {k['kernel']}: not a warp-specialised kernel")
        roles = {}
        for role, lo, hi in (("math", 0, split), ("loader", split, len(ins))):
            part = ins[lo:hi]
            reasons: dict[str, int] = {}
            for x in part:
                for r, v in x["stalls"].items():
                    reasons[r] = reasons.get(r, 0) + v
            ranked = sorted(range(lo, hi), key=lambda i: -ins[i]["samples"])[:top]
            roles[role] = dict(
                samples=sum(x["samples"] for x in part),
                executed=sum(x["executed"] for x in part),
                stalls=dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
                top=[
                    dict(
                        index=i,
                        sass=ins[i]["sass"],
                        after=ins[i - 1]["sass"] if i else None,  # a warp waiting at a barrier is sampled past it
                        samples=ins[i]["samples"],
                        reason=max(ins[i]["stalls"].items(), key=lambda kv: kv[1])[0] if ins[i]["stalls"] else None,
                    )
                    for i in ranked
                ],
            )
        out.append(dict(kernel=k["kernel"], shape="x".join(map(str, shape)), roles=roles))
    return out


def launch(shapes) -> None:
    """The profiled workload: one launch of the default seesaw build per shape (page size 1),
    after two warm-ups and a launch on other buffers (L2 holds no tile of the profiled one)."""
    import torch

    from .timing import Rotation

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for ctx, heads, nodes in shapes:
        op, *other = Rotation(ctx, 1, nodes, heads, l2, seed=0, max_sets=2).native_ops(impl="wgmma_seesaw")
        op.run()
        op.run()
        (other or [op])[0].run()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        op.run()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def profile(shapes=STALL_SHAPES, timeout: float = 600.0) -> str:
    """ncu's source page (CSV) for ``launch(shapes)``: SourceCounters on the seesaw partial kernel."""
    ncu = find_ncu()
    spec = ",".join("x".join(map(str, s)) for s in shapes)

    def run(cmd):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"ncu exited {res.returncode}: {(res.stderr or res.stdout).strip()[-1500:]}")
        return res.stdout

    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "stalls"
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--kernel-name", "regex:partial_seesaw"]
        cmd += ["--section", "SourceCounters", "--import-source", "no", "-o", str(rep), "-f"]
        run([*cmd, sys.executable, "-m", "specdiag.bench.stalls", "--launch", spec])
        return run([ncu, "-i", f"{rep}.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--launch":
        launch([tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")])
    else:
        print("usage: python -m specdiag.bench.stalls --launch CTXxHEADSxNODES[,...]", file=sys.stderr)
        sys.exit(2)
