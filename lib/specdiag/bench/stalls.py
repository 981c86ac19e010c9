"""Where a warp-specialised kernel's warps wait: Nsight Compute's warp-stall sampling (its
SourceCounters section), per SASS instruction, summed per warp role.

``profile()`` runs ncu on ``python -m specdiag.bench.stalls --launch SHAPES IMPL`` in a child
process (one launch of the default build per shape, after a warm-up, between cudaProfilerStart and
Stop) and returns ncu's source page as CSV text. ``parse_source_csv`` reads that page; ``summarize``
splits each kernel's instructions into roles and sums the samples per stall reason, and lists the
instructions that hold the most samples. The seesaw kernel splits at the loader's register release
(``USETMAXREG.DEALLOC``: the math warpgroups' code comes before it, the loader's after); the wide
kernel's three roles each begin at their own ``USETMAXREG`` (``WIDE_ROLES``).
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import tempfile
from pathlib import Path

from ..probes.ncu import find_ncu

__all__ = [
    "STALL_SHAPES",
    "STALL_IMPLS",
    "WIDE_ROLES",
    "parse_source_csv",
    "summarize",
    "source_page",
    "profile",
    "launch",
]

STALL_SHAPES = ((185000, 8, 9), (32768, 64, 65))  # the deployment's; many query rows
_SPLIT = "USETMAXREG.DEALLOC"  # the loader warpgroup's first instruction of its own
# the wide kernel's roles by the register count each one's USETMAXREG sets (tvwide::SOFTMAX_REGS,
# PV_REGS, LOAD_REGS; a test checks them against its SASS)
WIDE_ROLES = {256: "softmax", 176: "pv", 72: "loader"}
# kernel -> (the partial kernel's name as ncu matches it, its roles: None for the seesaw split,
# the shapes sampled by default: the wide kernel takes up to 72 rows a CTA, the deployment's)
STALL_IMPLS = {
    "wgmma_seesaw": ("regex:partial_seesaw", None, STALL_SHAPES),
    "wgmma_wide": ("regex:partial_wide", WIDE_ROLES, STALL_SHAPES[:1]),
}
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


def _regions(k: dict, roles: dict[int, str] | None) -> list[tuple[str, int, int]]:
    """(role, first, past-last instruction) of kernel ``k``: the seesaw split (``roles`` None), or
    one region per USETMAXREG whose register count ``roles`` names, the code before the first one
    going to it too."""
    ins = k["instructions"]
    if roles is None:
        split = next((i for i, x in enumerate(ins) if _SPLIT in x["sass"]), None)
        if split is None:
            raise ValueError(f"no {_SPLIT} in {k['kernel']}: not a warp-specialised kernel")
        return [("math", 0, split), ("loader", split, len(ins))]
    starts = []
    for i, x in enumerate(ins):
        if x["sass"].startswith("USETMAXREG"):
            n = int(x["sass"].rstrip(" ;").split()[-1], 0)
            if n in roles:
                starts.append((i, roles[n]))
    if sorted(r for _, r in starts) != sorted(roles.values()):
        found, want = [r for _, r in starts], sorted(roles.values())
        raise ValueError(f"{k['kernel']}: USETMAXREG roles {found}, expected one each of {want}")
    bounds = [0] + [i for i, _ in starts[1:]] + [len(ins)]
    return [(r, bounds[j], bounds[j + 1]) for j, (_, r) in enumerate(starts)]


def summarize(kernels: list[dict], shapes, top: int = 6, roles: dict[int, str] | None = None) -> list[dict]:
    """Per kernel launch (``shapes`` names them, in launch order): for each warp role (the seesaw's
    math warpgroups and loader, or ``roles``: see ``_regions``), the samples, the warp instructions
    executed, the samples per stall reason, and the ``top`` instructions by samples (index, SASS,
    the instruction before it, samples, their largest reason)."""
    if len(kernels) != len(shapes):
        raise ValueError(f"{len(kernels)} profiled launches for {len(shapes)} shapes")
    out = []
    for k, shape in zip(kernels, shapes):
        ins = k["instructions"]
        regions = _regions(k, roles)
        roles_out = {}
        for role, lo, hi in regions:
            part = ins[lo:hi]
            reasons: dict[str, int] = {}
            for x in part:
                for r, v in x["stalls"].items():
                    reasons[r] = reasons.get(r, 0) + v
            ranked = sorted(range(lo, hi), key=lambda i: -ins[i]["samples"])[:top]
            roles_out[role] = dict(
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
        out.append(dict(kernel=k["kernel"], shape="x".join(map(str, shape)), roles=roles_out))
    return out


def launch(shapes, impl: str = "wgmma_seesaw") -> None:
    """The profiled workload: one launch of ``impl``'s default build per shape (page size 1),
    after two warm-ups and a launch on other buffers (L2 holds no tile of the profiled one)."""
    import torch

    from .timing import Rotation

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for ctx, heads, nodes in shapes:
        op, *other = Rotation(ctx, 1, nodes, heads, l2, seed=0, max_sets=2).native_ops(impl=impl)
        op.run()
        op.run()
        (other or [op])[0].run()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        op.run()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def source_page(argv: list[str], kernel_name: str, timeout: float = 600.0) -> str:
    """ncu's source page (CSV) for ``python argv...``: SourceCounters on the kernels ``kernel_name``
    (ncu's --kernel-name: a name or ``regex:...``) launched between cudaProfilerStart and Stop."""
    ncu = find_ncu()

    def run(cmd):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"ncu exited {res.returncode}: {(res.stderr or res.stdout).strip()[-1500:]}")
        return res.stdout

    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(tmp) / "stalls"
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--kernel-name", kernel_name]
        cmd += ["--section", "SourceCounters", "--import-source", "no", "-o", str(rep), "-f"]
        run([*cmd, sys.executable, *argv])
        return run([ncu, "-i", f"{rep}.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"])


def profile(shapes=STALL_SHAPES, timeout: float = 600.0, impl: str = "wgmma_seesaw") -> str:
    """ncu's source page (CSV) for ``launch(shapes, impl)``: SourceCounters on its partial kernel."""
    if impl not in STALL_IMPLS:
        raise ValueError(f"stalls samples {tuple(STALL_IMPLS)}, got {impl!r}")
    spec = ",".join("x".join(map(str, s)) for s in shapes)
    return source_page(["-m", "specdiag.bench.stalls", "--launch", spec, impl], STALL_IMPLS[impl][0], timeout)


if __name__ == "__main__":
    if len(sys.argv) in (3, 4) and sys.argv[1] == "--launch" and (len(sys.argv) == 3 or sys.argv[3] in STALL_IMPLS):
        from .variants import parse_shapes

        launch(parse_shapes(sys.argv[2]), *sys.argv[3:])
    else:
        impls = "|".join(STALL_IMPLS)
        print(f"usage: python -m specdiag.bench.stalls --launch CTXxHEADSxNODES[,...] [{impls}]", file=sys.stderr)
        sys.exit(2)
