"""Which commits built a recording: each commit's ``specdiag.kernels.sources_digest`` (its kernels/
CUDA sources and launch plan, read from git) against a recording's ``machine.native_digest``.

    python tools/compare_revision/digest.py RECORDING.json|DIGEST [--last N]

Prints the newest N commits (default 200) whose sources give that digest, newest first, or says
there are none. Recordings made before the digest was recorded have none to look up.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from specdiag.kernels import sources_digest

PLAN = "lib/specdiag/attention/plan.py"


def git(*args: str, repo: Path) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True).stdout


def revision_digest(rev: str, repo: Path) -> str | None:
    """``sources_digest`` of ``rev``'s files (None where it has no launch plan module)."""
    names = git("ls-tree", "--name-only", rev, "kernels/", repo=repo).decode().split()
    files = {n: git("show", f"{rev}:{n}", repo=repo) for n in names if n.endswith((".cu", ".cuh"))}
    try:
        files[PLAN] = git("show", f"{rev}:{PLAN}", repo=repo)
    except subprocess.CalledProcessError:
        return None
    return sources_digest(files)


def wanted_digest(arg: str) -> str:
    p = Path(arg)
    if not p.is_file():
        return arg
    digest = json.loads(p.read_text()).get("machine", {}).get("native_digest")
    if not digest:
        raise SystemExit(f"{arg}: no machine.native_digest (recorded before digests were)")
    return digest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", help="a recording (JSON) or a digest")
    ap.add_argument("--last", type=int, default=200, help="how many commits back to look")
    args = ap.parse_args(argv)
    digest, repo = wanted_digest(args.what), Path(__file__).resolve().parents[2]
    revs = git("rev-list", f"--max-count={args.last}", "HEAD", repo=repo).decode().split()
    found = [r for r in revs if revision_digest(r, repo) == digest]
    for r in found:
        print(git("log", "-1", "--format=%h %cs %s", r, repo=repo).decode().strip()[:120])
    if not found:
        print(f"no commit among the last {len(revs)} gives {digest}", file=sys.stderr)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
