"""Is a change to kernels/ behaviour-neutral? Every registry row's SASS (and the merge's), built from
a git revision's kernels/ and from the working tree's, compared instruction for instruction. No GPU:
nvcc and cuobjdump only. A build whose SASS is byte-identical runs the same instructions, so a
refactor that leaves every build identical needs no device run to prove it (run.sh does the GPU
comparison of outputs and times for changes that are not). Only instructions are compared: the
launch shape a module exports is data, which tests/test_native.py checks against the registry.

    python tools/compare_revision/sass.py REV [--defines 'NAME=INT,...;...'] [--check]

Each ``--defines`` set is built as well, on top of each row's own defines, for every row whose
source (headers included) names all its switches.
``--check`` exits 1 when any build differs.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from specdiag import kernels
from specdiag.attention.registry import KERNELS, MERGE
from specdiag.bench.variants import parse_variants


def extract_kernels(rev: str, dest: Path, repo: Path) -> Path:
    """``rev``'s kernels/ under ``dest`` (git archive); its path."""
    res = subprocess.run(["git", "-C", str(repo), "archive", rev, "kernels"], capture_output=True)
    if res.returncode != 0:
        raise SystemExit(f"git archive {rev} kernels: {res.stderr.decode().strip()}")
    with tarfile.open(fileobj=BytesIO(res.stdout)) as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # (Python before 3.11.4 has no extraction filters; git's own archive)
            tar.extractall(dest)
    return dest / "kernels"


KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"


def instructions(text: str) -> int:
    """The SASS listing's instruction count (lines with an address, not the encoding lines)."""
    return len(kernels.sass_instructions(text))


def compare(old_root: Path, new_root: Path = KERNELS_DIR, extra=(), specs=None, progress=print) -> list[dict]:
    """One row per build of each of ``specs`` (default: every registry row and the merge), with its
    own defines, then with each set of ``extra`` whose switches its source (in ``new_root``) names:
    instruction counts and whether the SASS built from ``old_root`` is ``new_root``'s byte for byte
    (``None``: ``old_root`` lacks the source)."""
    rows = []
    for spec in specs or (*KERNELS.values(), MERGE):
        text = kernels.kernel_source(spec.source, root=new_root)  # (its headers pasted in)
        for more in [{}, *extra]:
            if not all(re.search(rf"\b{re.escape(name)}\b", text) for name in more):
                continue
            defines = {**dict(spec.defines), **more}
            new = kernels.sass(spec.source, defines=defines, root=new_root)
            has_old = (old_root / f"{spec.source}.cu").is_file()
            old = kernels.sass(spec.source, defines=defines, root=old_root) if has_old else None
            row = dict(
                kernel=spec.name,
                defines=",".join(f"{k}={v}" for k, v in sorted(defines.items())),
                old=None if old is None else instructions(old),
                new=instructions(new),
                identical=None if old is None else old == new,
            )
            rows.append(row)
            word = {True: "identical", False: "DIFFERS", None: "new source"}[row["identical"]]
            progress(f"{row['kernel']:>13} {row['defines'] or '-':<36} {row['old']!s:>6} -> {row['new']:>6}  {word}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the git revision to compare the working tree's kernels/ with")
    ap.add_argument("--defines", default="", help="extra builds: 'NAME=INT,...' sets separated by ';'")
    ap.add_argument("--check", action="store_true", help="exit 1 when any build differs")
    a = ap.parse_args(argv)
    try:
        extra = parse_variants(a.defines) if a.defines else []
    except ValueError as e:
        ap.error(f"--defines: {e}")
    named = "".join(kernels.kernel_source(s.source, root=KERNELS_DIR) for s in (*KERNELS.values(), MERGE))
    for name in sorted({n for d in extra for n in d}):
        if not re.search(rf"\b{re.escape(name)}\b", named):
            ap.error(f"--defines: {name} is not a switch of any kernel source")
    with tempfile.TemporaryDirectory() as td:
        old_root = extract_kernels(a.rev, Path(td), KERNELS_DIR.parent)
        rows = compare(old_root, KERNELS_DIR, extra)
    differ = sum(r["identical"] is False for r in rows)
    same = sum(r["identical"] is True for r in rows)
    print(f"{a.rev} -> working tree: {same} of {len(rows)} builds identical, {differ} differ")
    return 1 if a.check and differ else 0


if __name__ == "__main__":
    sys.exit(main())
