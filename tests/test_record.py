"""specdiag record: its steps are real recorders writing the files the notebooks read."""

import subprocess
import sys
from pathlib import Path

from specdiag import record, runner


def test_every_step_is_a_recorder_that_takes_out():
    names = set()
    for s in record.steps("h200", Path("data"), models=True):
        assert s.name not in names
        names.add(s.name)
        res = subprocess.run([sys.executable, "-m", s.argv[0], "--help"], capture_output=True, text=True)
        assert res.returncode == 0 and "--out" in res.stdout, s


def test_the_h200_steps_write_the_files_the_notebooks_read():
    written = {s.out for s in record.steps("h200", Path("data"), models=True)}
    written.add("constraints_sglang.json")  # no GPU recording: notebook 04's scan of the engines' source
    for b in runner.find_notebooks():
        for name, value in runner.notebook_parameters(b).items():
            files = value.values() if isinstance(value, dict) else [value]
            for f in files:
                if isinstance(f, str) and f.endswith(".json"):
                    assert f in written, (b.name, name, f)


def test_record_on_cpu_says_so_in_one_line():
    import torch

    if torch.cuda.is_available():
        return
    res = subprocess.run([sys.executable, "-m", "specdiag.cli", "record"], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip() == (
        "specdiag: record needs a CUDA GPU (without one the notebooks show the recordings in data/)"
    )


def test_record_runs_without_the_notebook_extras():
    """A GPU machine may have the kernels' packages but not jupytext: only `run --help` reads the
    notebooks' parameters, so `record` must not import it."""
    code = (
        "import sys; sys.modules['jupytext'] = None; sys.argv = ['specdiag', 'record', '--list']\n"
        "from specdiag.cli import main; sys.exit(main())"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-500:]
    assert "check-wgmma_seesaw" in res.stdout
