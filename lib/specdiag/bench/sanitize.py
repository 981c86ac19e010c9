"""compute-sanitizer (memcheck, racecheck, synccheck) over every native kernel and the merge, on
small shapes: ragged batches, page sizes 1 and 64, an empty prefix, splits from none to several tiles
(a stage refilled, both tail parities).

``sanitize()`` runs each tool on ``python -m specdiag.bench.sanitize --workload IMPL`` in a child
process and parses the tool's summary line and, for racecheck, the distinct (write, read) code
offsets of the hazards it prints. ``probe()`` runs racecheck on ``tests/cuda/racecheck_probe.cu``:
named-barrier handoffs that are correct by the PTX memory model, to tell the tool's reach from a
kernel's race; and synccheck on the warpgroup modes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck")
# the last two cases give every kernel splits of 4 and more tiles, odd and even, so that the
# steady loop (a stage refilled) and both tail parities run
WORKLOAD_FIELDS = ("prefix_lens", "nodes", "heads", "page_size", "prefix_splits")
WORKLOAD = (
    ([300], 9, 8, 64, 3),
    ([0, 200, 31], 33, 4, 1, 2),
    ([129], 65, 2, 16, None),
    ([600], 9, 8, 1, 2),
    ([512], 33, 4, 64, 2),
)
_SUMMARY = re.compile(r"(ERROR|RACECHECK) SUMMARY: (\d+) (errors?|hazards?)(?: displayed \((\d+) errors?)?")
_ACCESS = re.compile(r"(Write|Read) (?:Thread \S+ at|access at) (.+?\+0x[0-9a-f]+)")
_FIRST = re.compile(r"(?:Potential \w+ hazard|Race reported between)")
PROBE = Path(__file__).resolve().parents[3] / "tests" / "cuda" / "racecheck_probe.cu"
PROBE_MODES = (
    "sync",
    "arrive",
    "arrive_reg",
    "sync_partial",
    "pingpong",
    "pingpong_sync",
    "pingpong_then_sync",
    "seesaw",
    "seesaw_wg",
    "seesaw_wg_loader",
    "red_or_wg",
    "red_or_wg_split",
    "red_or_wg_unaligned",
    "flag_wg_split",
    "flag_wg_arrive",
    "seesaw_mbar",
    "seesaw_mbar_stay",
    "seesaw_named",
    "seesaw_named_nofence",
    "seesaw_named_fence_first",
    "seesaw_mbar_fence_first",
    "seesaw_bare",
    "seesaw_bare_nofence",
    "bare_plain",
    "bare_ids12",
    "bare_sync0",
    "bare_2wg",
    "seesaw_wg_2",
    "bare_swapped",
)
# synccheck: named barriers as the seesaw and wide kernels use them
SYNC_PROBE_MODES = (
    "seesaw_wg",
    "red_or_wg",
    "red_or_wg_split",
    "red_or_wg_unaligned",
    "flag_wg_split",
    "flag_wg_arrive",
)

__all__ = [
    "TOOLS",
    "WORKLOAD",
    "WORKLOAD_FIELDS",
    "PROBE_MODES",
    "SYNC_PROBE_MODES",
    "run_workload",
    "split_tiles",
    "sanitize",
    "probe",
]


def run_workload(impl: str, defines: dict[str, int] | None = None) -> None:
    """Every WORKLOAD case through ``impl``'s partial kernel (built with ``defines``) and the merge,
    checked against float64."""
    import torch

    from ..attention import make_verify_inputs, relative_error, tree_verify_attention_ref
    from ..attention.native import NativeTreeVerify
    from ..cost import SOFTMAX_SCALE

    for lens, t, h, ps, splits in WORKLOAD:
        x, _ = make_verify_inputs(lens, t, h, page_size=ps, seed=t, device="cuda")
        out, lse = NativeTreeVerify(**x, scale=SOFTMAX_SCALE, impl=impl, prefix_splits=splits, defines=defines).run()
        torch.cuda.synchronize()
        ref, _ = tree_verify_attention_ref(**{k: v.cpu() for k, v in x.items()}, scale=SOFTMAX_SCALE)
        err = relative_error(out.cpu(), ref)
        if err > 1e-2:
            raise SystemExit(f"{impl} {lens} T={t} H={h} ps={ps}: relative error {err:.2e}")


def split_tiles(impl: str, workload=WORKLOAD, num_sms: int = 132) -> list[int]:
    """The tile count of every (row block, split) CTA that ``impl`` runs over ``workload`` (its
    launch plan on a GPU of ``num_sms`` SMs, with the workload's split counts)."""
    from ..attention.plan import plan_launch
    from ..attention.registry import KERNELS

    spec, counts = KERNELS[impl], []
    for lens, t, h, _, splits in workload:
        plan = plan_launch(
            t * h, t, max(lens), len(lens), num_sms, splits, rows_per_cta=spec.rows_per_cta, bn=spec.keys_per_tile
        )
        counts += [n for length in lens for n in plan.split_tiles(length, t)] * plan.m_tiles
    return counts


def sanitize(impls, tools=TOOLS, progress=print) -> list[dict]:
    """One row per (tool, impl): the tool's count of errors or hazards and its summary line."""
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        raise RuntimeError("compute-sanitizer is not on PATH")
    rows = []
    for tool in tools:
        for impl in impls:
            t0 = time.time()
            row = _run(exe, tool, [sys.executable, "-m", "specdiag.bench.sanitize", "--workload", impl])
            row = dict(tool=tool, impl=impl, **row, seconds=round(time.time() - t0, 1))
            rows.append(row)
            progress(f"{tool:>9} {impl:>13}: {row['findings']} findings, exit {row['exit_code']} ({row['seconds']} s)")
    return rows


def _run(exe: str, tool: str, cmd: list[str]) -> dict:
    """One compute-sanitizer run: exit code, findings (the summary's count), the hazards' distinct
    (write, read) code offsets as printed (up to 200 reports)."""
    res = subprocess.run([exe, "--tool", tool, "--print-limit", "200", *cmd], capture_output=True, text=True)
    text = res.stdout + res.stderr
    found = _SUMMARY.findall(text)
    findings = None
    if found:
        kind, shown, _, total = found[-1]
        findings = int(total) if total else int(shown)
    pairs = sorted(_hazard_pairs(text))
    return dict(
        exit_code=res.returncode,
        findings=findings,
        hazard_pcs=[list(p) for p in pairs],
        summary=" ".join(x for x in found[-1] if x) if found else text[-2000:],
        output=text[-400:] if res.returncode else "",
    )


def _hazard_pairs(text: str) -> set[tuple[str, str]]:
    """(first access, other access) per hazard: a "Potential ... hazard" report names two threads'
    accesses; "Race reported between A" is followed by one "and B" line per other access."""
    pairs, first = set(), None
    for line in text.splitlines():
        m = _ACCESS.search(line)
        if _FIRST.search(line):
            first = f"{m[1]} {m[2]}" if m else None  # (a hazard's header names no access)
        elif m and first is None:
            first = f"{m[1]} {m[2]}"
        elif m:
            pairs.add((first, f"{m[1]} {m[2]}"))
            if "Thread" in line:  # a hazard's second thread ends it
                first = None
    return pairs


def probe(progress=print) -> list[dict]:
    """racecheck on each mode of tests/cuda/racecheck_probe.cu (correct programs all), synccheck
    on SYNC_PROBE_MODES."""
    exe = shutil.which("compute-sanitizer")
    if exe is None or shutil.which("nvcc") is None or not PROBE.is_file():
        raise RuntimeError("the probe needs compute-sanitizer, nvcc and a checkout's tests/cuda/racecheck_probe.cu")
    rows = []
    with tempfile.TemporaryDirectory() as td:
        binary = str(Path(td) / "probe")
        subprocess.run(["nvcc", "-arch=sm_90", "-o", binary, str(PROBE)], check=True, capture_output=True)
        runs = [("racecheck", m) for m in PROBE_MODES] + [("synccheck", m) for m in SYNC_PROBE_MODES]
        for tool, mode in runs:
            row = dict(tool=tool, impl=f"probe:{mode}", **_run(exe, tool, [binary, mode]))
            rows.append(row)
            progress(f"{tool} probe {mode:>10}: {row['findings']} findings, exit {row['exit_code']}")
    return rows


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] != "--workload":
        raise SystemExit("usage: python -m specdiag.bench.sanitize --workload IMPL ['NAME=INT,...']")
    from .variants import check_switches, parse_variants

    try:
        defines = parse_variants(sys.argv[3])[0] if len(sys.argv) == 4 else None
        check_switches(sys.argv[2], [defines or {}])
    except ValueError as e:
        raise SystemExit(f"bad defines: {e}") from None
    run_workload(sys.argv[2], defines)
