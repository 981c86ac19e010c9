"""tools/compare_revision/sass.py: another revision's kernels/ built beside the working tree's and
their SASS compared (nvcc and cuobjdump, no GPU)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from specdiag.attention.registry import KERNELS, MERGE

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sass_compare", ROOT / "tools" / "compare_revision" / "sass.py")
sass_compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_compare)


def test_instruction_count_skips_encoding_lines():
    listing = (
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */\n"
        "                                                            /* 0x000fe40000000800 */\n"
        "        /*0010*/                   EXIT ;                   /* 0x000000000000794d */\n"
        "                                                            /* 0x000fea0003800000 */\n"
    )
    assert sass_compare.instructions(listing) == 2


@pytest.mark.sass
def test_a_copy_is_identical_and_an_edit_differs(tmp_path):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    quiet = dict(specs=(MERGE,), progress=lambda *_: None)
    (row,) = sass_compare.compare(tmp_path / "kernels", **quiet)
    assert row["identical"] is True and row["old"] == row["new"] > 0
    src = tmp_path / "kernels" / "tree_verify_merge.cu"
    text = src.read_text()
    assert "MERGE_UNROLL = 8" in text
    src.write_text(text.replace("MERGE_UNROLL = 8", "MERGE_UNROLL = 4", 1))  # (the other side: fewer loads in flight)
    (row,) = sass_compare.compare(tmp_path / "kernels", **quiet)
    assert row["identical"] is False and row["old"] != row["new"]
    src.unlink()
    (row,) = sass_compare.compare(tmp_path / "kernels", **quiet)
    assert row["identical"] is None and row["old"] is None


@pytest.mark.sass
def test_extra_defines_only_where_the_source_names_them(tmp_path):
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    rows = sass_compare.compare(
        tmp_path / "kernels", extra=[{"TV_TRACE": 1}], specs=(MERGE, KERNELS["wgmma_wide"]), progress=lambda *_: None
    )
    builds = [(r["kernel"], r["defines"]) for r in rows]
    assert builds == [("merge", ""), ("wgmma_wide", ""), ("wgmma_wide", "TV_TRACE=1")]
    assert all(r["identical"] for r in rows)
    assert rows[2]["new"] != rows[1]["new"]  # (the traced build: the clock reads are code)


@pytest.mark.sass
def test_cli_refuses_bad_input(capsys):
    res = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip("not a git checkout")
    with pytest.raises(SystemExit, match="git archive nosuchrev"):
        sass_compare.main(["nosuchrev"])
    with pytest.raises(SystemExit):
        sass_compare.main(["HEAD", "--defines", "TV_WIDE_WARM"])
    with pytest.raises(SystemExit):  # a typo builds nothing new: refused, not skipped
        sass_compare.main(["HEAD", "--defines", "TV_WIDE_WARN=0"])
    assert "TV_WIDE_WARN is not a switch of any kernel source" in capsys.readouterr().err
