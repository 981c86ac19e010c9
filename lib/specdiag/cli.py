"""``specdiag`` command line."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def _notebook_help() -> str:
    """The notebooks and the parameters each declares (for --help)."""
    from .runner import WorkbookError, find_notebooks, notebook_parameters

    try:
        books = find_notebooks()
    except WorkbookError as e:
        return str(e)
    lines = ["notebooks and their parameters (defaults):"]
    for b in books:
        try:
            params = notebook_parameters(b)
        except WorkbookError as e:
            params = {"?": str(e)}
        lines.append(f"  {b.stem}: " + ", ".join(f"{k}={v!r}" for k, v in params.items()))
    return "\n".join(lines)


def _fail(msg: str) -> int:
    print(f"specdiag: {msg}", file=sys.stderr)
    return 2


def _check_out(path: str) -> str | None:
    """Why ``path`` cannot take the run's files, or None."""
    from pathlib import Path

    p = Path(path)
    if p.exists() and not p.is_dir():
        return f"--out {path} is a file, not a folder"
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"--out {path}: cannot create it ({e.strerror})"
    probe = p / ".specdiag-write-test"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return f"--out {path}: cannot write there ({e.strerror})"
    return None


def _check_kernel(name: str) -> str | None:
    from jupyter_client.kernelspec import KernelSpecManager

    known = sorted(KernelSpecManager().find_kernel_specs())
    return (
        None
        if name in known
        else f"--kernel {name!r} is not an installed Jupyter kernel; installed: {', '.join(known)}"
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(
        prog="specdiag",
        description="Tree speculative decoding investigation workbook",
        epilog="specdiag run --help lists the notebooks and their parameters",
    )
    ap.add_argument("--version", action="version", version=f"specdiag {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser(
        "run",
        help="execute notebooks/NN_*.py headless with papermill",
        epilog=_notebook_help() if "-h" in argv or "--help" in argv else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    lab = sub.add_parser(
        "lab",
        help="open the notebooks in JupyterLab, as notebooks (jupytext), saved back unchanged",
        description="jupyter lab on the notebooks folder, with the workbook's JupyterLab settings (the .py "
        "notebooks open in the notebook view). Other arguments go to jupyter lab, as --name=value "
        "(e.g. --port=8890 --no-browser).",
    )
    lab.add_argument("folder", nargs="?", default=None, help="the notebooks folder (default: the workbook's)")
    rec = sub.add_parser(
        "record",
        help="re-record every measurement the notebooks show, on this GPU",
        description="Runs each recorder (python -m specdiag.bench ..., specdiag.probes.study, and with --models "
        "the models' training and the drafter validation) into DATA, each file named with this GPU's tag.",
    )
    rec.add_argument("--data", default=None, help="the folder to write (default: the workbook's data/)")
    rec.add_argument("--only", default="", help="comma-separated step names (default: all); see --list")
    rec.add_argument("--tag", default=None, help="file name tag (default: this GPU's, e.g. h200)")
    rec.add_argument("--models", action="store_true", help="also retrain the models and re-run notebook 01's sweep")
    rec.add_argument("--list", action="store_true", help="list the steps and exit")
    run.add_argument("--kernel", default=None, help="Jupyter kernel name (default: the notebook's, python3)")
    a, extra = ap.parse_known_args(argv)
    if extra and a.cmd != "lab":
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
    if a.cmd == "lab":
        return lab_main(a.folder, extra)
    if a.cmd == "record":
        return record_main(a)

    if a.cmd == "run":
        from .runner import WorkbookError, check_parameters, find_notebooks, parse_param, run_workbook, summary_table

        params = {name: parse_param(value) for name, value in a.parameter}
        try:
            books = find_notebooks()
            if a.only:
                books = [b for b in books if any(b.name.startswith(o) for o in a.only)]
                if not books:
                    names = ", ".join(b.stem for b in find_notebooks())
                    return _fail(f"--only {' '.join(a.only)} matches no notebook; they are: {names}")
            params = check_parameters(params, books)
        except WorkbookError as e:
            return _fail(str(e))
        why = (_check_kernel(a.kernel) if a.kernel else None) or _check_out(a.out)
        if why:
            return _fail(why)
        try:
            results = run_workbook(a.out, params, notebooks=books, html=not a.no_html, kernel_name=a.kernel)
        except WorkbookError as e:
            print(f"specdiag: {e}", file=sys.stderr)
            return 1
        print(summary_table(results))
        print(f"summary: {a.out}/summary.md")
        return 0
    return 2


def record_main(a) -> int:
    from pathlib import Path

    from . import data, record

    folder = Path(a.data) if a.data else data.data_dir()
    if a.list:
        for s in record.steps(a.tag or "TAG", folder, models=True):
            print(f"{s.name:>14}  {s.what:<42} python -m {' '.join(s.argv)} --out {folder / s.out}")
        return 0
    try:
        rows = record.record(folder, [x for x in a.only.split(",") if x], a.tag, a.models)
    except (RuntimeError, ValueError) as e:
        return _fail(str(e))
    bad = [r for r in rows if r["exit_code"]]
    print(
        f"{len(rows) - len(bad)} of {len(rows)} steps ok"
        + (f"; failed: {', '.join(r['step'] for r in bad)}" if bad else "")
    )
    return 1 if bad else 0


def lab_env(environ=None) -> dict:
    """The environment for JupyterLab: the workbook's settings folder first on JUPYTER_CONFIG_PATH."""
    import os
    from pathlib import Path

    env = dict(os.environ if environ is None else environ)
    ours = str(Path(__file__).resolve().parent / "jupyter")
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (ours, env.get("JUPYTER_CONFIG_PATH", "")) if p)
    return env


def lab_main(folder: str | None, extra: list[str]) -> int:
    import os
    import subprocess
    from pathlib import Path

    from .runner import REPO_ROOT

    where = folder or str(REPO_ROOT / "notebooks")
    if not Path(where).is_dir():
        return _fail(f"lab: {where} is not a folder (give jupyter lab's options as --name=value)")
    # the JupyterLab of this interpreter, not whichever `jupyter` is first on PATH
    if subprocess.run([sys.executable, "-m", "jupyterlab", "--version"], capture_output=True).returncode:
        return _fail(f'JupyterLab is not installed for {sys.executable}: pip install -e ".[notebook]"')
    # this process becomes the server (no child left behind when it is stopped: its kernels with it)
    os.execve(sys.executable, [sys.executable, "-m", "jupyterlab", *extra, f"--ServerApp.root_dir={where}"], lab_env())


if __name__ == "__main__":
    sys.exit(main())
