"""specdiag.bench.stalls: ncu's source page parsed and summed per warp role; the recording behind
notebook 05 section 9 and the sixteenth session's notes."""

import gzip

import pytest

from specdiag import analysis, data, kernels
from specdiag.bench.stalls import WIDE_ROLES, _regions, parse_source_csv, summarize

HEAD = (
    '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
    '"Instructions Executed","stall_barrier","stall_long_sb","stall_barrier (Not Issued)"'
)


def page(rows, name="k"):
    lines = [f'"Kernel Name","{name}",', HEAD]
    for i, (sass, n, ex, b, lsb) in enumerate(rows):
        lines.append(f'"0x{i:x}","{sass}","{n}","{n}","{ex}","{b}","{lsb}","{b}"')
    return "\n".join(lines) + "\n"


def test_summary_splits_the_roles_at_the_loaders_register_release():
    text = page(
        [
            ("BAR.SYNC 0x3, 0x100", 1, 10, 0, 0),
            ("@!PT LDS RZ, [RZ]", 7, 10, 6, 1),
            ("USETMAXREG.DEALLOC.CTAPOOL 0x68", 0, 4, 0, 0),
            ("LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]", 3, 40, 0, 3),
        ]
    )
    text += page([("USETMAXREG.DEALLOC.CTAPOOL 0x68", 2, 1, 2, 0)], name="k2")
    ks = parse_source_csv(text)
    assert [k["kernel"] for k in ks] == ["k", "k2"] and len(ks[0]["instructions"]) == 4
    runs = summarize(ks, ((10, 8, 9), (20, 8, 9)))
    math, loader = runs[0]["roles"]["math"], runs[0]["roles"]["loader"]
    assert (math["samples"], math["executed"], math["stalls"]) == (8, 20, {"barrier": 6, "long_sb": 1})
    assert (loader["samples"], loader["stalls"]["long_sb"]) == (3, 3)
    top = math["top"][0]
    assert (top["index"], top["after"], top["reason"]) == (1, "BAR.SYNC 0x3, 0x100", "barrier")
    assert runs[1]["shape"] == "20x8x9" and runs[1]["roles"]["math"]["samples"] == 0


def test_wide_roles_each_begin_at_their_register_count():
    """The wide kernel's page: each role's instructions run from its USETMAXREG to the next one's
    (the code before the first goes to the first); a page without one of them is refused."""
    rows = [
        ("S2R R0, SR_TID.X", 1, 3, 0, 0),
        ("USETMAXREG.TRY_ALLOC.CTAPOOL UP1, 0xb0", 0, 1, 0, 0),
        ("BAR.SYNC R3, 0x100", 5, 9, 5, 0),
        ("USETMAXREG.TRY_ALLOC.CTAPOOL UP1, 0x100", 0, 1, 0, 0),
        ("MUFU.EX2 R4, R5", 4, 30, 0, 0),
        ("USETMAXREG.DEALLOC.CTAPOOL 0x48", 0, 1, 0, 0),
        ("LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]", 2, 40, 0, 2),
    ]
    runs = summarize(parse_source_csv(page(rows)), ((185000, 8, 9),), roles=WIDE_ROLES)
    r = runs[0]["roles"]
    assert list(r) == ["pv", "softmax", "loader"]
    assert (r["pv"]["samples"], r["pv"]["executed"], r["pv"]["stalls"]["barrier"]) == (6, 13, 5)
    assert (r["softmax"]["samples"], r["softmax"]["executed"]) == (4, 31)
    assert (r["loader"]["samples"], r["loader"]["stalls"]["long_sb"]) == (2, 2)
    with pytest.raises(ValueError, match="expected one each of"):
        summarize(parse_source_csv(page(rows[:5])), ((1, 1, 1),), roles=WIDE_ROLES)


@pytest.mark.sass
def test_wide_roles_are_the_wide_kernels_register_counts():
    """WIDE_ROLES names the register counts the wide kernel's SASS sets, one USETMAXREG each."""
    sass = kernels.sass("tree_verify_wide").splitlines()
    lines = [ln.split("*/", 1)[1].split(";", 1)[0].strip() for ln in sass if "USETMAXREG" in ln]
    ins = [dict(sass=x, samples=0, executed=0, stalls={}) for x in lines]
    assert [r for r, _, _ in _regions(dict(kernel="wide", instructions=ins), WIDE_ROLES)] == ["pv", "softmax", "loader"]


def test_bad_pages_are_refused_in_one_line():
    with pytest.raises(ValueError, match="source page without"):
        parse_source_csv('"Kernel Name","k",\n"Address","Foo"\n"0x0","x"\n')
    ks = parse_source_csv(page([("MOV R1, R2", 1, 1, 0, 0)]))
    with pytest.raises(ValueError, match="not a warp-specialised kernel"):
        summarize(ks, ((1, 1, 1),))
    with pytest.raises(ValueError, match="1 profiled launches for 2 shapes"):
        summarize(ks, ((1, 1, 1), (2, 1, 1)))


def test_recorded_stalls_match_their_source_page_and_the_notes():
    """The recording is its source page summed; both roles wait mostly at a barrier (the loader at
    the stage barrier, the math warpgroups at the P hand-off), as notebook 05 and the notes say."""
    doc = data.load_json("ncu_stalls_seesaw_h200.json")
    text = gzip.decompress((data.data_dir() / "ncu_stalls_seesaw_h200.source.csv.gz").read_bytes())
    again = summarize(parse_source_csv(text.decode()), [tuple(s) for s in doc["shapes"]])
    assert again == doc["runs"]
    t = analysis.stall_table(doc)
    assert set(t.index.get_level_values("role")) == {"math", "loader"} and len(t) == 4
    assert (t.barrier > 40).all() and (t.xs("loader", level="role").barrier > 50).all()
    for r in doc["runs"]:
        assert r["roles"]["loader"]["top"][0]["after"].startswith("BAR.SYNC")
        assert r["roles"]["math"]["top"][0]["after"].startswith("BAR.SYNC.DEFER_BLOCKING 0x3")


def test_source_page_profiles_the_workload_then_prints_its_source_page(monkeypatch):
    """stalls.source_page (bench stalls and tools/ncu_counters/opmix.py): ncu's SourceCounters on
    the named kernels of ``python argv...``, then the report's source page as CSV; a failing ncu
    is a one-line RuntimeError."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from specdiag.bench import stalls

    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return SimpleNamespace(returncode=0, stdout="page" if "-i" in cmd else "", stderr="")

    monkeypatch.setattr(stalls, "find_ncu", lambda: "ncu")
    monkeypatch.setattr(subprocess, "run", run)
    assert stalls.source_page(["tool.py", "--launch", "1x2x3", "flashmla"], "regex:partial") == "page"
    profiled, printed = calls
    assert profiled[profiled.index("--kernel-name") + 1] == "regex:partial" and "SourceCounters" in profiled
    assert profiled[-5:] == [sys.executable, "tool.py", "--launch", "1x2x3", "flashmla"]
    assert printed[printed.index("-i") + 1] == profiled[profiled.index("-o") + 1] + ".ncu-rep"
    assert printed[-4:] == ["source", "--csv", "--print-source", "sass"]
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: SimpleNamespace(returncode=1, stdout="", stderr="boom"))
    with pytest.raises(RuntimeError, match="ncu exited 1: boom"):
        stalls.source_page(["tool.py"], "x")


def test_recorded_out_of_line_blocks_hold_few_samples():
    """The blocks after the kernel's last EXIT (the mbarrier retries ptxas places there) fall in the
    loader's range of ``summarize``'s seesaw split; in the recorded page they hold 38 and 34 samples,
    under 0.4% of each launch's (docs/kernel_notes.md, forty-fourth session)."""
    text = gzip.decompress((data.data_dir() / "ncu_stalls_seesaw_h200.source.csv.gz").read_bytes()).decode()
    out = []
    for k in parse_source_csv(text):
        ins = k["instructions"]
        end = max(i for i, x in enumerate(ins) if x["sass"].split()[:1] == ["EXIT"]) + 1
        assert any("TRYWAIT" in x["sass"] for x in ins[end:])
        out.append((sum(x["samples"] for x in ins[end:]), sum(x["samples"] for x in ins)))
    assert [a for a, _ in out] == [38, 34] and all(a < 0.004 * b for a, b in out)
