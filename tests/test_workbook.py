"""The workbook end to end: every notebook runs headless (smoke parameters) through the CLI."""

import json
import subprocess
import sys

import pytest

from specdiag.runner import find_notebooks, notebook_parameters, parse_param


def test_every_notebook_has_a_parameters_cell_with_smoke_and_measure():
    books = find_notebooks()
    assert [b.name[:2] for b in books] == sorted(b.name[:2] for b in books)
    for b in books:
        params = notebook_parameters(b)
        assert "smoke" in params and params["smoke"] is False, b.name
        assert params.get("measure") == "auto", b.name


def test_no_notebook_parameter_is_a_path_relative_to_the_repository():
    """JupyterLab runs a notebook with its own folder (notebooks/) as the working directory,
    the CLI with the repository root: a default such as "data/models" works in one and not the
    other. Defaults name files inside data/ (resolved by specdiag.data) or None."""
    for b in find_notebooks():
        for name, value in notebook_parameters(b).items():
            assert not (isinstance(value, str) and value.startswith(("data/", "./", "../", "notebooks/"))), (
                b.name,
                name,
                value,
            )


def test_parse_param():
    assert parse_param("True") is True
    assert parse_param("3") == 3
    assert parse_param("[1, 2]") == [1, 2]
    assert parse_param("hello") == "hello"


@pytest.mark.slow
def test_cli_runs_the_whole_workbook(tmp_path):
    out = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "specdiag.cli", "run", "--out", str(out), "-p", "smoke", "True"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["notebook"] for s in summary] == [b.name for b in find_notebooks()]
    assert all(s["status"] == "ok" for s in summary)
    for s in summary:
        assert (out / (s["notebook"][:-3] + ".ipynb")).is_file()
        html = (out / (s["notebook"][:-3] + ".html")).read_text()
        assert "<html" in html.lower() and "Traceback" not in html


def test_cli_names_the_failing_notebook_and_cell(tmp_path, monkeypatch):
    from specdiag import runner

    nb = tmp_path / "01_broken.py"
    nb.write_text(
        '# %% tags=["parameters"]\nsmoke = False\nmeasure = "auto"\n\n# '
        '%%\nx = 1\n\n# %%\nraise RuntimeError("boom here")\n'
    )
    with pytest.raises(runner.WorkbookError, match=r"01_broken.py: code cell 3 .*RuntimeError: boom here"):
        runner.run_workbook(tmp_path / "out", {"smoke": True}, notebooks=[nb], html=False, progress=False)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary[0]["status"] == "failed"


def test_cli_rejects_unknown_notebook_filter(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "specdiag.cli", "run", "--out", str(tmp_path), "--only", "99"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "no notebook matches" in res.stderr
