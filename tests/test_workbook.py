"""The workbook end to end: every notebook runs headless (smoke parameters) through the CLI."""

import json
import subprocess
import sys

import pytest

from specdiag import data
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
        title = html.split("<title>", 1)[1].split("</title>", 1)[0]
        assert title.startswith(s["notebook"][:2]) and title != "Notebook", title  # "05 · The native fix..."
    # on CPU every notebook that loads data says it showed a recording, from which machine and date
    with_data = {s["notebook"]: s["data"] for s in summary if s["data"]}
    assert "05_native_fix.py" in with_data and all(
        d.startswith(("recorded: data/", "measured here")) for v in with_data.values() for d in v
    )
    peers_date = data.load_json("peers_h200.json")["machine"]["recorded_utc"][:10]
    assert f"data/peers_h200.json, NVIDIA H200, {peers_date}" in " ".join(with_data["05_native_fix.py"])
    assert "recorded: data/" in (out / "summary.md").read_text()
    assert "without encryption" not in res.stderr  # the kernel runs over IPC, not TCP


def test_cli_names_the_failing_notebook_and_cell(tmp_path, monkeypatch):
    from specdiag import runner

    nb = tmp_path / "01_broken.py"
    nb.write_text(
        '# %% tags=["parameters"]\nsmoke = False\nmeasure = "auto"\n\n# '
        '%%\nx = 1\n\n# %%\ny = 2\nraise RuntimeError("boom here")\nz = 3\n'
    )
    want = r"01_broken.py: code cell 3, line 2: 'raise RuntimeError\(\"boom here\"\)': RuntimeError: boom here"
    with pytest.raises(runner.WorkbookError, match=want):
        runner.run_workbook(tmp_path / "out", {"smoke": True}, notebooks=[nb], html=False, progress=False)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary[0]["status"] == "failed"


def test_cli_rejects_unknown_notebook_filter(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "specdiag.cli", "run", "--out", str(tmp_path), "--only", "99"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "--only 99 matches no notebook; they are: 01_drafter_validation" in res.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["-p", "nonexistent", "1"], "unknown parameter 'nonexistent'; the notebooks declare: "),
        (["-p", "smoke", "maybe"], "parameter smoke expects True or False (default False), got 'maybe'"),
        (["--only", "02", "-p", "heads", "8"], "unknown parameter 'heads'; the notebooks declare: measure, period_s"),
        (["-p", "heads", "'8'"], "parameter heads expects int (default 8), got '8'"),
        (["--kernel", "nope"], "--kernel 'nope' is not an installed Jupyter kernel"),
    ],
)
def test_cli_rejects_bad_input_in_one_line_before_running(tmp_path, args, message):
    res = subprocess.run(
        [sys.executable, "-m", "specdiag.cli", "run", "--out", str(tmp_path / "o"), *args],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and res.stderr.startswith("specdiag: " + message), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "o" / "summary.json").exists()


def test_cli_rejects_an_out_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("keep me")
    res = subprocess.run(
        [sys.executable, "-m", "specdiag.cli", "run", "--out", str(tmp_path / "f")], capture_output=True, text=True
    )
    assert res.returncode == 2 and res.stderr.strip() == f"specdiag: --out {tmp_path / 'f'} is a file, not a folder"
    assert (tmp_path / "f").read_text() == "keep me"


def test_parameters_are_typed_against_the_defaults():
    from specdiag import runner

    books = [b for b in runner.find_notebooks() if b.name.startswith(("05", "06"))]
    assert runner.check_parameters({"deployment_copy_tb_s": 2}, books) == {"deployment_copy_tb_s": 2.0}
    assert runner.check_parameters({"commits": [1, 8]}, books) == {"commits": (1, 8)}
    assert runner.check_parameters({"smoke": True, "heads": 16}, books) == {"smoke": True, "heads": 16}
    with pytest.raises(runner.WorkbookError, match="parameter heads expects int"):
        runner.check_parameters({"heads": True}, books)


def test_help_lists_the_notebooks_and_their_parameters():
    res = subprocess.run([sys.executable, "-m", "specdiag.cli", "run", "--help"], capture_output=True, text=True)
    for b in find_notebooks():
        assert f"  {b.stem}: smoke=False, measure='auto'" in res.stdout


def test_gpu_only_commands_say_so_in_one_line_on_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    for mod in ("specdiag.probes.study", "specdiag.bench"):
        res = subprocess.run(
            [sys.executable, "-m", mod, *(["check"] if mod == "specdiag.bench" else []), "--out", "/tmp/x.json"],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
