"""The steady loops of a kernel build, opcode by opcode: every innermost backward branch whose body
holds wgmmas (a math warpgroup's tile loop) or cp.async (a loader's), from cuobjdump's SASS. No GPU.
With --flashmla, FlashMLA's SM90 dense decode (bf16, head dim 576; --kind sparse: its sparse
prefill, which gathers single tokens) from the installed flash_mla wheel beside it. Static counts:
a loop's cold branches count as if taken (the no_mask ablation, TV_SKIP=32, drops the masking
branch of the Hopper kernels).

    python tools/sass_loops/loops.py [IMPL] [--defines 'NAME=INT,...'] [--flashmla [SO]] [--kind sparse]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from specdiag import kernels
from specdiag.attention.registry import KERNELS
from specdiag.bench.variants import check_switches, parse_variants

_BACK = re.compile(r"BRA (?:`\(\.L_x_\d+\)\s*)?(0x[0-9a-f]+)")
# FlashMLA's SM90 kernels by what their mangled names hold: the dense bf16 decode and the sparse
# prefill (page size 1 gathers), both at head dim 576
FLASHMLA = {
    "dense": ("decode5dense28flash_fwd_splitkv_mla_kernel", "bfloat16_tELi576"),
    "sparse": ("prefill10sparse_fwd22sparse_attn_fwd_kernel", "KernelTemplateILi576ELb0"),
}


def loops(sass: str, marks=("HGMMA", "LDGSTS")) -> list[dict]:
    """Innermost loops (a backward branch's target to the branch) holding any of ``marks``:
    ``start``, ``end`` (addresses) and ``body`` (instructions), in address order."""
    ins = kernels.sass_instructions(sass)
    # (a loop's back edge is predicated; the unconditional ones return from cold wait code placed
    # after the function's body into the middle of it)
    spans = [
        (int(m.group(1), 16), a)
        for a, x in ins
        if x.startswith("@") and (m := _BACK.search(x)) and int(m.group(1), 16) < a
    ]
    held = []
    for s, e in spans:
        body = [x for a, x in ins if s <= a <= e]
        if any(k in x for x in body for k in marks):
            held.append(dict(start=s, end=e, body=body))
    inner = [
        lp for lp in held if not any(o is not lp and lp["start"] <= o["start"] and o["end"] <= lp["end"] for o in held)
    ]
    return sorted(inner, key=lambda lp: lp["start"])


def flashmla_sass(so: Path | None = None, kind: str = "dense") -> str:
    """The SASS of FlashMLA's SM90 ``kind`` kernel (``FLASHMLA``) in its legacy module ``so``
    (default: the installed wheel's)."""
    if so is None:
        import importlib.util

        spec = importlib.util.find_spec("flash_mla")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("loops: flash_mla is not installed (the sgl-flash-mla wheel)")
        so = next(Path(spec.submodule_search_locations[0]).glob("_C_legacy*.so"), None)
        if so is None:
            raise SystemExit("loops: this flash_mla has no legacy module")
    if not Path(so).is_file():
        raise SystemExit(f"loops: no such file: {so}")
    exe = kernels.find_cuobjdump()
    if exe is None:
        raise SystemExit("loops: no cuobjdump (the CUDA toolkit's, or Triton's copy)")
    listing = subprocess.run([exe, "-lelf", str(so)], capture_output=True, text=True, check=True).stdout
    names = [ln.split()[-1] for ln in listing.splitlines() if ln.strip().endswith("sm_90a.cubin")]
    with tempfile.TemporaryDirectory() as td:
        for name in names:
            subprocess.run([exe, "-xelf", name, str(so)], cwd=td, capture_output=True, check=True)
            text = subprocess.run([exe, "-sass", str(Path(td) / name)], capture_output=True, text=True).stdout
            for fn in re.split(r"\n\s*Function : ", text):
                if all(k in fn.split("\n", 1)[0] for k in FLASHMLA[kind]):
                    return fn
    raise SystemExit(f"loops: no SM90 {kind} kernel of head dim 576 in {so}")


def table(named: dict[str, list[str]], top: int = 30) -> str:
    """Opcode counts of each named instruction list, most frequent first, and the totals."""
    counts = {k: Counter(kernels.opcode(x) for x in v) for k, v in named.items()}
    ops = sorted(set().union(*counts.values()), key=lambda o: -sum(c[o] for c in counts.values()))
    w = max(12, *(len(k) + 2 for k in named))
    lines = ["opcode".ljust(10) + "".join(k.rjust(w) for k in named)]
    lines += [o.ljust(10) + "".join(str(counts[k][o]).rjust(w) for k in named) for o in ops[:top]]
    lines.append("total".ljust(10) + "".join(str(len(v)).rjust(w) for v in named.values()))
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("impl", nargs="?", default="wgmma_seesaw", choices=sorted(KERNELS))
    ap.add_argument("--defines", default="", help="the build's switches, 'NAME=INT,...'")
    ap.add_argument("--kind", choices=sorted(FLASHMLA), default="dense", help="which FlashMLA kernel --flashmla reads")
    ap.add_argument(
        "--flashmla",
        nargs="?",
        const="",
        help="FlashMLA's dense decode loops beside ours (its _C_legacy .so, else the installed wheel's)",
    )
    a = ap.parse_args(argv)
    try:
        defines = parse_variants(a.defines)[0] if a.defines else {}
        if defines:  # (a switch the source never names would silently build the default)
            check_switches(a.impl, [defines])
    except ValueError as e:
        ap.error(f"--defines: {e}")
    spec = KERNELS[a.impl]
    named = {}
    for i, lp in enumerate(loops(kernels.sass(spec.source, defines={**dict(spec.defines), **defines}))):
        named[f"ours {i} ({sum('HGMMA' in x for x in lp['body'])} mma)"] = lp["body"]
    if a.flashmla is not None:
        for i, lp in enumerate(loops(flashmla_sass(Path(a.flashmla) if a.flashmla else None, a.kind))):
            named[f"{a.kind} {i} ({sum('HGMMA' in x for x in lp['body'])} mma)"] = lp["body"]
    print(table(named))


if __name__ == "__main__":
    main()
