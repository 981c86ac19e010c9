"""Which sources a recording was made with: specdiag.kernels.sources_digest in every recording's
machine metadata, and tools/compare_revision/digest.py finding the commits that give it."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from specdiag import data
from specdiag.kernels import native_sources, sources_digest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("digest_tool", ROOT / "tools" / "compare_revision" / "digest.py")
digest_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(digest_tool)


def _repo_files() -> dict[str, bytes]:
    files = {f"kernels/{p.name}": p.read_bytes() for p in (ROOT / "kernels").iterdir() if p.suffix in (".cu", ".cuh")}
    files[digest_tool.PLAN] = (ROOT / digest_tool.PLAN).read_bytes()
    return files


def test_the_digest_covers_the_kernel_sources_and_the_plan():
    files = native_sources()
    assert digest_tool.PLAN in files and any(k.endswith(".cuh") for k in files)
    assert files == _repo_files()  # (what this install builds from is the repository's)
    d = sources_digest()
    assert len(d) == 12 and int(d, 16) >= 0
    assert sources_digest(dict(reversed(list(files.items())))) == d  # path order, not insertion order
    edited = dict(files)
    edited["kernels/tree_verify_merge.cu"] += b"\n"
    assert sources_digest(edited) != d
    renamed = {("kernels/x.cu" if k == "kernels/tree_verify_merge.cu" else k): v for k, v in files.items()}
    assert sources_digest(renamed) != d


def test_every_recording_carries_the_digest(tmp_path):
    doc = json.loads(data.save(tmp_path / "r.json", "test", {"rows": []}).read_text())
    assert doc["machine"]["native_digest"] == sources_digest()


def test_a_recording_without_a_digest_is_refused_in_one_line(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"machine": {"gpu": "H200"}}))
    with pytest.raises(SystemExit, match="no machine.native_digest"):
        digest_tool.wanted_digest(str(old))
    assert digest_tool.wanted_digest("4792a23e4b1a") == "4792a23e4b1a"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_head_gives_the_working_tree_digest_when_its_sources_are_committed():
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "kernels", digest_tool.PLAN],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if dirty:
        pytest.skip(f"uncommitted source changes: {dirty.splitlines()[0]}")
    assert digest_tool.revision_digest("HEAD", ROOT) == sources_digest(_repo_files())
    assert digest_tool.main([sources_digest(_repo_files()), "--last", "1"]) == 0
    assert digest_tool.main(["000000000000", "--last", "3"]) == 1
