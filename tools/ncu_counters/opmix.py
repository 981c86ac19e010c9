"""Which instructions each warp role of a verify's main kernel executes, and where its warps stall:
Nsight Compute's per-SASS-instruction counters (SourceCounters) of one launch per IMPL (the one
counters.py profiles), summed per role and opcode and divided by the launch's 64-key x 64-row
prefix tiles. A role starts at each USETMAXREG (DEALLOC: "loader", TRY_ALLOC: "math"); the code
before the first is "prologue", a kernel without one is all "kernel", and the blocks after the last
EXIT are "out_of_line" (recordings before the forty-fourth session's counted them in the last role).

Usage (on the GPU, ncu on PATH, FlashMLA's wheel importable for its peers):
  python tools/ncu_counters/opmix.py OUT.json CTXxHEADSxNODES IMPL[,...]
  python tools/ncu_counters/opmix.py --summary OUT.json   (prints a recording's table)
IMPL as in counters.py. Counts under SASS patching: the spin loops of mbarrier waits run more
than in a plain launch (counters.py counts a plain one). Its first recording:
data/history/session33_h100.json run2 (docs/kernel_notes.md, thirty-third session).
"""

import json
import sys
from pathlib import Path

from specdiag.kernels import opcode

sys.path.insert(0, str(Path(__file__).parent))
from counters import KERNELS, parse_shape, preflight  # noqa: E402

TILE = 64  # keys and query rows of the prefix tiles the counts are divided by


def roles(instructions: list[dict]) -> list[tuple[str, int, int]]:
    """(role, first, past-last index) of one kernel's instructions, split at each USETMAXREG; what
    follows the last unpredicated EXIT is "out_of_line": the blocks ptxas places after the code (the
    retries of mbarrier waits), reached by branches from any role."""
    n = len(instructions)
    exits = [i for i, x in enumerate(instructions) if x["sass"].split()[:1] == ["EXIT"]]
    end = exits[-1] + 1 if exits else n
    tail = [("out_of_line", end, n)] if end < n else []
    cuts = [
        (i, "loader" if "DEALLOC" in x["sass"] else "math")
        for i, x in enumerate(instructions[:end])
        if x["sass"].startswith("USETMAXREG")
    ]
    if not cuts:
        return [("kernel", 0, end), *tail]
    bounds = [i for i, _ in cuts] + [end]
    out = [("prologue", 0, cuts[0][0])] if cuts[0][0] else []
    return out + [(name, bounds[j], bounds[j + 1]) for j, (_, name) in enumerate(cuts)] + tail


def summarize(instructions: list[dict], tiles: int, top: int = 24) -> dict:
    """Per role: warp instructions executed per tile, the ``top`` opcodes per tile, stall samples by reason."""
    out = {}
    for name, lo, hi in roles(instructions):
        part = instructions[lo:hi]
        ops: dict[str, int] = {}
        stalls: dict[str, int] = {}
        for x in part:
            ops[opcode(x["sass"])] = ops.get(opcode(x["sass"]), 0) + x["executed"]
            for r, v in x["stalls"].items():
                stalls[r] = stalls.get(r, 0) + v
        ranked = sorted(ops.items(), key=lambda kv: -kv[1])[:top]
        out[name] = dict(
            executed_per_tile=round(sum(ops.values()) / tiles, 1),
            opcodes_per_tile={k: round(v / tiles, 1) for k, v in ranked},
            samples=sum(x["samples"] for x in part),
            stalls=dict(sorted(stalls.items(), key=lambda kv: -kv[1])),
        )
    return out


def main(out: str, shape: str, impls: str) -> None:
    from specdiag.bench.stalls import parse_source_csv, source_page
    from specdiag.machine import machine_metadata

    ctx, heads, nodes = parse_shape(shape)
    impl_list = preflight(impls, "opmix")
    tiles = -(-ctx // TILE) * -(-heads * nodes // TILE)
    rows = []
    for impl in impl_list:
        try:
            argv = [str(Path(__file__).parent / "counters.py"), "--launch", shape, impl]
            page = source_page(argv, f"regex:{KERNELS}")
        except RuntimeError as e:
            raise SystemExit(f"opmix: {impl}: {str(e)[-500:]}") from None
        found = parse_source_csv(page)
        if len(found) != 1:
            raise SystemExit(f"opmix: {len(found)} kernel launches profiled for {impl}, expected one")
        kernel = found[0]
        rows.append(dict(impl=impl, kernel=kernel["kernel"], roles=summarize(kernel["instructions"], tiles)))
        print(table(rows[-1]), flush=True)
    record = {"kind": "ncu_opmix", "machine": machine_metadata(), "shape": shape, "tiles": tiles, "rows": rows}
    Path(out).write_text(json.dumps(record, indent=1))


def table(row: dict, width: int = 12) -> str:
    lines = [f"{row['impl']} ({row['kernel'][:60]})"]
    for name, r in row["roles"].items():
        ops = "  ".join(f"{k} {v:.0f}" for k, v in list(r["opcodes_per_tile"].items())[:width])
        lines.append(f"  {name:8s} {r['executed_per_tile']:7.0f} a tile: {ops}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--summary":
        for row in json.loads(Path(sys.argv[2]).read_text())["rows"]:
            print(table(row))
    elif len(sys.argv) == 4 and not sys.argv[1].startswith("-"):
        main(*sys.argv[1:])
    else:
        raise SystemExit(__doc__.split("\n\n")[1])
