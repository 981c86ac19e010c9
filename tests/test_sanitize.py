"""specdiag.bench.sanitize's reading of compute-sanitizer's reports (no GPU: the tool's output is
replayed), and the racecheck and evict-last probes compile."""

import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdiag.attention.registry import KERNELS
from specdiag.bench import sanitize

RACE = """========= COMPUTE-SANITIZER
========= Error: Potential RAW hazard detected at __shared__ 0x365a0 in block (0,0,0) :
=========     Write Thread (192,0,0) at k+0xa940
=========     Read Thread (64,0,0) at k+0x17900
========= Error: Race reported between Write access at k+0xa8d0
=========     and Read access at k+0x17920 [16 hazards]
========= Error: Potential RAW hazard detected at __shared__ 0x365a1 in block (0,0,0) :
=========     Write Thread (196,0,0) at k+0xa940
=========     Read Thread (68,0,0) at k+0x17900
========= Error: Race reported between Write access at k+0x18c30
=========     and Read access at k+0xe430 [32 hazards]
=========     and Read access at k+0xe470 [64 hazards]
========= RACECHECK SUMMARY: 3 hazards displayed (8370 errors, 0 warnings)
"""


def test_reports_are_read_into_counts_and_code_offsets(monkeypatch):
    one = "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n"
    outputs = iter([RACE, "========= ERROR SUMMARY: 0 errors\n", one])
    monkeypatch.setattr(
        subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=0, stdout=next(outputs), stderr="")
    )
    row = sanitize._run("compute-sanitizer", "racecheck", ["x"])
    assert row["findings"] == 8370  # the total, not the displayed count
    assert row["hazard_pcs"] == [
        ["Write k+0x18c30", "Read k+0xe430"],  # one write raced by several reads: each pair
        ["Write k+0x18c30", "Read k+0xe470"],
        ["Write k+0xa8d0", "Read k+0x17920"],
        ["Write k+0xa940", "Read k+0x17900"],
    ]
    clean = sanitize._run("compute-sanitizer", "memcheck", ["x"])
    assert clean["findings"] == 0 and clean["hazard_pcs"] == []
    assert sanitize._run("compute-sanitizer", "racecheck", ["x"])["findings"] == 1  # (singular)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_racecheck_probe_compiles(tmp_path):
    res = subprocess.run(
        ["nvcc", "-arch=sm_90", "-o", str(tmp_path / "probe"), str(sanitize.PROBE)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_evict_last_probe_builds_its_three_copy_forms(tmp_path):
    """tests/cuda/evict_last_probe.cu builds, and its modes become 256-byte-prefetch copies: plain,
    with an L2 policy and the shared address split into register + uniform register (the form
    that faults on the GPU), and with the address one register (the form that runs)."""
    from specdiag import kernels

    src = Path(__file__).parent / "cuda" / "evict_last_probe.cu"
    cubin = tmp_path / "probe.cubin"
    res = subprocess.run(
        ["nvcc", "-gencode", "arch=compute_90a,code=sm_90a", "-cubin", "-o", str(cubin), str(src)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    exe = kernels.find_cuobjdump()
    if exe is None:
        pytest.skip("no cuobjdump")
    sass = subprocess.run([exe, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    copies = [ln for ln in sass.splitlines() if "LDGSTS" in ln]
    assert len(copies) == 3 and all("LTC256B" in ln for ln in copies)
    dsts = sorted(re.search(r"LDGSTS\S* \[([^\]]*)\]", ln).group(1) for ln in copies)
    assert sum("+UR" in d for d in dsts) == 1, dsts  # the policy copy as ptxas splits it
    assert sum(re.fullmatch(r"R\d+", d) is not None for d in dsts) == 2, dsts


def test_probe_modes_are_the_probes_own():
    """bench.sanitize runs each mode the probe's main() knows, and no other (a mode named in one
    place only would be skipped, or fail as unknown)."""
    text = sanitize.PROBE.read_text()
    listed = re.search(r"const char\* modes\[\] = \{([^}]*)\}", text).group(1)
    assert set(re.findall(r'"(\w+)"', listed)) == set(sanitize.PROBE_MODES)


@pytest.mark.parametrize("impl", sorted(KERNELS))
def test_workload_runs_every_kernels_steady_loop(impl):
    """The sanitizers see a stage refilled (a split of 3 tiles or more, with two stages) and both tail
    parities (an odd and an even split of 3 or more) in every kernel, not only 1- and 2-tile splits."""
    tiles = sanitize.split_tiles(impl)
    assert any(n >= 3 and n % 2 for n in tiles) and any(n >= 4 and n % 2 == 0 for n in tiles), sorted(set(tiles))
    assert 0 in tiles and 1 in tiles  # (and the empty and one-tile splits, as before)
