"""A kernel's compile-time switch against its default build, on one GPU, in one run: out and lse bit
for bit at the identity cases, the float64 check with poisoned buffers, then both builds timed at
nine shapes, alternating, twice (time_shapes.py), and B / A shape by shape (ratios.py).

    python tools/compare_revision/switch.py "NAME=INT[,NAME=INT]" OUT_DIR [IMPL] [SHAPES]

IMPL: wgmma_seesaw by default. SHAPES: time_shapes.py's CTX:HEADS:NODES,... (default: the nine
shapes every session's A/B has used since the thirtieth). OUT_DIR gets identity.json,
check.json, base_1.json, switch_1.json, base_2.json, switch_2.json and ratios.txt.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
USAGE = 'usage: python tools/compare_revision/switch.py "NAME=INT[,NAME=INT]" OUT_DIR [IMPL] [SHAPES]'
NINE = "32768:8:65,65536:8:65,32768:16:65,32768:64:9,32768:128:9,32768:8:257,32768:64:65,185000:8:65,131072:128:65"


def _switches(impl: str, text: str) -> dict[str, int]:
    """The one set of switches in ``text``, each one the kernel's source names; SystemExit otherwise."""
    from specdiag.bench.variants import check_switches, parse_variants

    try:
        variants = parse_variants(text)
        if len(variants) != 1:
            raise ValueError(f"one set of switches (NAME=INT[,NAME=INT]), got {len(variants)}: {text!r}")
        check_switches(impl, variants)
    except ValueError as e:
        raise SystemExit(f"switch.py: {e}") from None
    return variants[0]


def main(switches: str, out: str, impl: str = "wgmma_seesaw", shapes: str = NINE) -> None:
    sw = _switches(impl, switches)
    from specdiag.machine import gpu_available

    if not gpu_available():
        raise SystemExit("switch.py: no CUDA GPU here: it times the kernel's builds on one")
    from specdiag.bench.variants import identity

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    rows = identity(impl, [sw])
    (folder / "identity.json").write_text(json.dumps(rows, indent=1))
    py = sys.executable
    text = ",".join(f"{k}={v}" for k, v in sw.items())

    def run(*cmd) -> None:  # a step that fails (a float64 case, say) ends the run, in one line
        res = subprocess.run([py, *map(str, cmd)])
        if res.returncode:
            raise SystemExit(f"switch.py: {' '.join(map(str, cmd[:3]))} ... exited {res.returncode} (its output above)")

    run("-m", "specdiag.bench", "check", "--impl", impl, "--defines", text, "--out", folder / "check.json")
    for i in (1, 2):  # the two builds alternate, so a drift of the clock falls on both
        run(HERE / "time_shapes.py", f"base_{i}", folder / f"base_{i}.json", impl, shapes, "")
        run(HERE / "time_shapes.py", f"switch_{i}", folder / f"switch_{i}.json", impl, shapes, text)
    pair = [",".join(str(folder / f"{side}_{i}.json") for i in (1, 2)) for side in ("base", "switch")]
    ratios = subprocess.run([py, HERE / "ratios.py", *pair], check=True, capture_output=True, text=True).stdout
    (folder / "ratios.txt").write_text(ratios)
    print(ratios, end="")
    same = sum(r["bit_identical"] for r in rows)
    print(f"{text}: bit-identical at {same} of {len(rows)} identity cases; float64: {folder / 'check.json'}")


if __name__ == "__main__":
    if not 3 <= len(sys.argv) <= 5:
        raise SystemExit(USAGE)
    main(*sys.argv[1:])
