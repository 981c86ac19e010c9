"""``specdiag`` command line."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="specdiag", description="Tree speculative decoding investigation workbook")
    ap.add_argument("--version", action="version", version=f"specdiag {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="execute notebooks/NN_*.py headless with papermill")
    run.add_argument(
        "--out", default="runs/latest", help="folder for executed notebooks, HTML and summary (default: runs/latest)"
    )
    run.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="notebook parameter (repeatable), e.g. -p smoke True",
    )
    run.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only notebooks whose name starts with this (repeatable), e.g. --only 03",
    )
    run.add_argument("--no-html", action="store_true", help="skip the HTML export")
    run.add_argument("--kernel", default=None, help="Jupyter kernel name (default: the notebook's, python3)")
    a = ap.parse_args(argv)

    if a.cmd == "run":
        from .runner import WorkbookError, find_notebooks, parse_param, run_workbook, summary_table

        params = {name: parse_param(value) for name, value in a.parameter}
        try:
            books = find_notebooks()
            if a.only:
                books = [b for b in books if any(b.name.startswith(o) for o in a.only)]
                if not books:
                    print(f"specdiag: no notebook matches {a.only}", file=sys.stderr)
                    return 2
            results = run_workbook(a.out, params, notebooks=books, html=not a.no_html, kernel_name=a.kernel)
        except WorkbookError as e:
            print(f"specdiag: {e}", file=sys.stderr)
            return 1
        print(summary_table(results))
        print(f"summary: {a.out}/summary.md")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
