"""Run the workbook headless: notebooks/NN_*.py (jupytext percent) -> papermill -> ipynb + HTML.

Notebooks run in name order; each gets the same parameters (only those its ``parameters``
cell declares are injected by papermill, the rest are ignored).  A failure stops the run and
names the notebook and the failing cell.
"""

from __future__ import annotations

import ast
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["NotebookResult", "WorkbookError", "find_notebooks", "notebook_parameters", "parse_param", "run_workbook"]

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


def _failing_cell(nb) -> str:
    """'code cell N (first line): Error: message', N counting the notebook's own code cells from 1."""
    n = 0
    for cell in nb.cells:
        if cell.cell_type != "code" or "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            continue
        n += 1
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
                return f"code cell {n} ({first[:60]!r}): {out.get('ename')}: {out.get('evalue')}"
    return "unknown cell"


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
        html_path = None
        if html and executed.exists():
            from nbconvert import HTMLExporter

            body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
            html_path = out / f"{src.stem}.html"
            html_path.write_text(body)
        results.append(
            NotebookResult(
                src.name, status, round(time.time() - t0, 2), str(executed), str(html_path) if html_path else None, err
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


def _write_summary_md(path: Path, results: list[NotebookResult], params: dict) -> None:
    lines = ["| notebook | status | seconds | executed | html |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r.notebook} | {r.status} | {r.seconds} | "
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
