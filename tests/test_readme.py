"""The README's numbers are the data's: its results table is what specdiag.analysis prints."""

import re

from specdiag import analysis, data
from specdiag.runner import REPO_ROOT


def test_results_table_is_generated_from_the_recording():
    text = (REPO_ROOT / "README.md").read_text()
    m = re.search(r"<!-- results:[^>]*-->\n(.*?)\n<!-- /results -->", text, re.S)
    assert m, "the README lost its results markers"
    assert m.group(1) == analysis.results_markdown(data.load_json("peers_h200.json"))


def test_readme_commands_exist():
    text = (REPO_ROOT / "README.md").read_text()
    for cmd in ("specdiag run", "specdiag lab", "specdiag record", "python -m pytest -q"):
        assert cmd in text
