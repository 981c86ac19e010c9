"""Run the workbook headless: notebooks/NN_*.py (jupytext percent) -> papermill -> ipynb + HTML.

Notebooks run in name order; each gets the parameters its ``parameters`` cell declares, checked
against that cell's defaults first (``check_parameters``: an unknown name, or a value of another
type than the default's, is an error before anything runs). A failure stops the run and names the
notebook, the failing cell by number and the line that raised. The summary says, per notebook,
which of its data it measured here and which it showed from a recording (machine and date).
"""

from __future__ import annotations

import ast
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "NotebookResult",
    "WorkbookError",
    "find_notebooks",
    "notebook_parameters",
    "parse_param",
    "check_parameters",
    "run_workbook",
]

REPO_ROOT = Path(__file__).resolve().parents[2]


class WorkbookError(RuntimeError):
    pass


@dataclass
class NotebookResult:
    notebook: str
    status: str
    seconds: float
    executed: str
    html: str | None
    error: str | None = None
    data: list[str] | None = None  # "measured here on ..." / "recorded: data/<file>, <gpu>, <date>"


def find_notebooks(folder: str | Path | None = None) -> list[Path]:
    d = Path(folder) if folder else REPO_ROOT / "notebooks"
    if not d.is_dir():
        raise WorkbookError(f"notebook folder not found: {d}")
    books = sorted(p for p in d.glob("[0-9][0-9]_*.py"))
    if not books:
        raise WorkbookError(f"no notebooks named NN_*.py in {d}")
    return books


def notebook_parameters(path: Path, nb=None) -> dict:
    """Names and defaults of a notebook's ``parameters`` cell (``nb``: the notebook, if already read)."""
    import jupytext

    nb = jupytext.read(path) if nb is None else nb
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            out = {}
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    try:
                        out[node.targets[0].id] = ast.literal_eval(node.value)
                    except ValueError:
                        out[node.targets[0].id] = ast.unparse(node.value)
            return out
    raise WorkbookError(f"{path.name} has no cell tagged 'parameters'")


def parse_param(text: str):
    """Command-line value -> Python literal where it parses (True, 3, 'x', [1, 2]), else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _type_name(value) -> str:
    return "True or False" if isinstance(value, bool) else type(value).__name__


def check_parameters(params: dict, books) -> dict:
    """``params`` checked against the parameters cells of ``books``: every name declared by at
    least one of them, every value of its default's type (an int is taken for a float; a None
    default takes anything). Raises WorkbookError with one line naming what is wrong."""
    declared: dict[str, object] = {}
    for b in books:
        for name, default in notebook_parameters(b).items():
            declared.setdefault(name, default)
    for name, value in params.items():
        if name not in declared:
            raise WorkbookError(f"unknown parameter {name!r}; the notebooks declare: {', '.join(sorted(declared))}")
        want = declared[name]
        if want is None or isinstance(value, type(want)) and isinstance(value, bool) == isinstance(want, bool):
            continue
        if isinstance(want, float) and isinstance(value, int) and not isinstance(value, bool):
            params[name] = float(value)
            continue
        if isinstance(want, (list, tuple)) and isinstance(value, (list, tuple)):
            params[name] = type(want)(value)
            continue
        raise WorkbookError(f"parameter {name} expects {_type_name(want)} (default {want!r}), got {value!r}")
    return params


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _failing_cell(nb) -> str:
    """'code cell N, line L: <the line>: Error: message', N counting the notebook's own code cells
    from 1 and L the cell's line that raised (from IPython's traceback; the first line if none)."""
    n = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            continue
        n += 1
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                lines = cell.source.splitlines() or [""]
                tb = _ANSI.sub("", "\n".join(out.get("traceback", [])))
                m = re.search(r"Cell In\[\d+\], line (\d+)", tb)
                at = int(m.group(1)) if m and 1 <= int(m.group(1)) <= len(lines) else 1
                return (
                    f"code cell {n}, line {at}: {lines[at - 1].strip()[:80]!r}: {out.get('ename')}: {out.get('evalue')}"
                )
    return "unknown cell"


_MEASURED = re.compile(r"^measured now on: (.*)$", re.M)
_RECORDED = re.compile(r"the recording data/(\S+), made on: (.*)$", re.M)


def _data_sources(nb) -> list[str]:
    """What a notebook's data came from, from the lines ``data.measure_or_load`` prints."""
    text = "\n".join(
        out.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for out in c.get("outputs", [])
        if out.get("output_type") == "stream"
    )

    def short(machine: str) -> str:
        f = dict(part.split("=", 1) for part in machine.split(", ") if "=" in part)
        return ", ".join(x for x in (f.get("gpu"), (f.get("recorded_utc") or "")[:10]) if x) or machine

    found = [f"measured here on {short(m)}" for m in _MEASURED.findall(text)]
    found += [f"recorded: data/{name}, {short(m)}" for name, m in _RECORDED.findall(text)]
    return found


def _ipc_kernel_manager():
    """papermill's kernel manager over IPC sockets (no TCP: no ipykernel warning about it)."""
    from jupyter_client.manager import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.transport = "ipc"

    return IPCKernelManager


def run_workbook(
    out_dir: str | Path = "runs/latest",
    parameters: dict | None = None,
    notebooks=None,
    html: bool = True,
    progress: bool = True,
    kernel_name: str | None = None,
    timeout: int = 1800,
) -> list[NotebookResult]:
    import jupytext
    import nbformat
    import papermill as pm
    from tqdm.auto import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    books = [Path(p) for p in notebooks] if notebooks else find_notebooks()
    params = dict(parameters or {})
    results: list[NotebookResult] = []
    bar = tqdm(books, desc="workbook", unit="nb", disable=not progress)
    for src in bar:
        bar.set_postfix_str(src.stem)
        nb = jupytext.read(src)
        declared = notebook_parameters(src, nb)
        nb_params = {k: v for k, v in params.items() if k in declared}
        ipynb_in = out / f"{src.stem}.source.ipynb"
        executed = out / f"{src.stem}.ipynb"
        nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"})
        nbformat.write(nb, ipynb_in)
        t0 = time.time()
        try:
            pm.execute_notebook(
                str(ipynb_in),
                str(executed),
                parameters=nb_params,
                cwd=str(REPO_ROOT),
                progress_bar=False,
                kernel_name=kernel_name,
                execution_timeout=timeout,
                kernel_manager_class=_ipc_kernel_manager(),
            )
            status, err = "ok", None
        except pm.PapermillExecutionError as e:
            status, err = (
                "failed",
                f"{src.name}: {_failing_cell(nbformat.read(executed, as_version=4))}"
                if executed.exists()
                else f"{src.name}: {e.ename}: {e.evalue}",
            )
        finally:
            ipynb_in.unlink(missing_ok=True)
        html_path, sources = None, None
        if executed.exists():
            done = nbformat.read(executed, as_version=4)
            sources = _data_sources(done)
            if html:
                from nbconvert import HTMLExporter

                title = _title(done, src)
                body, _ = HTMLExporter().from_notebook_node(done, resources={"metadata": {"name": title}})
                html_path = out / f"{src.stem}.html"
                html_path.write_text(body)
        results.append(
            NotebookResult(
                src.name,
                status,
                round(time.time() - t0, 2),
                str(executed),
                str(html_path) if html_path else None,
                err,
                sources,
            )
        )
        if status != "ok":
            break
    (out / "summary.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    _write_summary_md(out / "summary.md", results, params)
    failed = [r for r in results if r.status != "ok"]
    if failed:
        raise WorkbookError(f"notebook failed: {failed[0].error}")
    return results


def _title(nb, src: Path) -> str:
    """The notebook's first markdown heading, else its file name."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#+\s*(.+)$", cell.source, re.M)
            if m:
                return m.group(1).strip()
    return src.stem


def _write_summary_md(path: Path, results: list[NotebookResult], params: dict) -> None:
    lines = ["| notebook | status | seconds | data | executed | html |", "|---|---|---|---|---|---|"]
    for r in results:
        data = "; ".join(r.data) if r.data else "-"
        lines.append(
            f"| {r.notebook} | {r.status} | {r.seconds} | {data} | "
            f"{Path(r.executed).name} | {Path(r.html).name if r.html else '-'} |"
        )
    if params:
        lines += ["", "parameters: " + ", ".join(f"{k}={v!r}" for k, v in params.items())]
    path.write_text("\n".join(lines) + "\n")


def summary_table(results: list[NotebookResult]) -> str:
    w = max(len(r.notebook) for r in results)
    rows = [f"{'notebook':<{w}}  status  seconds  output"]
    rows += [f"{r.notebook:<{w}}  {r.status:<6}  {r.seconds:>7.1f}  {r.html or r.executed}" for r in results]
    return "\n".join(rows)
