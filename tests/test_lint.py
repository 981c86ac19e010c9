"""The code's style is checked like its behaviour: ruff (pyproject.toml's [tool.ruff]) over the
library, the tests, the notebooks and the tools."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install -e '.[dev]')")
def test_ruff_is_clean():
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "lib", "tests", "notebooks", "tools"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
