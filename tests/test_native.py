"""Native CUDA kernels: the registry and the sources agree, nvcc compile checks (CPU, needs nvcc),
launch planning, GPU correctness."""

import ctypes
import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdiag import kernels
from specdiag.attention import make_verify_inputs, relative_error, tree_verify_attention_ref
from specdiag.attention.native import NativeTreeVerify, VerifyParams
from specdiag.attention.plan import (
    CTA_OVERHEAD_TILES,
    MERGE_BYTES_PER_TILE,
    MERGE_FREE_BYTES,
    TILE_UNIT,
    LaunchPlan,
    merge_cost,
    merge_groups,
    plan_launch,
    plan_makespan,
)
from specdiag.attention.registry import KERNELS, MERGE, KernelSpec, auto_kernel, resolve_impl

HAS_NVCC = shutil.which("nvcc") is not None
SCALE = 1 / math.sqrt(192)
ROOT = Path(__file__).resolve().parents[1]


def test_every_source_is_a_registry_row_or_the_merge():
    assert sorted(kernels.kernel_names()) == sorted({k.source for k in KERNELS.values()} | {MERGE.source})
    for spec in KERNELS.values():
        assert re.search(
            rf"^TV_DEFINE_PARTIAL_KERNEL\(\w+, {spec.entry}\)$", kernels.kernel_source(spec.source), re.M
        ), spec
    merge = kernels.kernel_source(MERGE.source)
    assert f"{MERGE.entry}(const __grid_constant__ tv::VerifyParams p)" in merge
    assert len({k.label for k in KERNELS.values()}) == len(KERNELS)
    # two rows of one source differ in their compile-time parameters
    assert len({(k.source, k.defines) for k in KERNELS.values()}) == len(KERNELS)
    with pytest.raises(FileNotFoundError, match="no CUDA source"):
        kernels.kernel_source("nope")


def test_kernel_source_pastes_the_projects_own_headers(tmp_path, monkeypatch):
    for spec in KERNELS.values():
        src = kernels.kernel_source(spec.source)  # what pycuda compiles: no include path needed
        assert src.count("struct VerifyParams") == 1 and '#include "tree_verify_params.cuh"' not in src
        assert src.count("struct SplitWork") == 1 and '#include "tree_verify_common.cuh"' not in src
        assert not spec.hopper_only or (
            src.count("namespace tvg {") == 1 and '#include "tree_verify_sm90.cuh"' not in src
        )
    (tmp_path / "h.cuh").write_text('#pragma once\n#include "g.cuh"\nint from_h;\n')
    (tmp_path / "g.cuh").write_text("int from_g;\n")
    (tmp_path / "k.cu").write_text(
        '#include <stdint.h>\n#include "h.cuh"\n#include "g.cuh"\n#include "elsewhere.h"\nint k;\n'
    )
    monkeypatch.setattr(kernels, "_kernel_dir", lambda: tmp_path)
    src = kernels.kernel_source("k")
    assert src.count("int from_g;") == 1 and src.count("int from_h;") == 1  # each header once
    assert "#include <stdint.h>" in src and '#include "elsewhere.h"' in src  # not ours: left alone
    assert "pragma once" not in src
    assert kernels.kernel_names() == ["k"]


@pytest.mark.nvcc
@pytest.mark.parametrize("name", kernels.kernel_names())
def test_compiles_for_sm90_without_spills(name):
    funcs = kernels.nvcc_check(name)  # sm_90, or sm_90a where the source says so
    assert funcs, "ptxas reported no kernels"
    for f in funcs.values():
        assert not f.spills, f"{f.name} spills: {f}"
        assert f.stack_frame == 0, f"{f.name} uses a stack frame (local memory): {f}"
        assert f.registers <= 255
        assert not f.wgmma_serialized, f"ptxas serialized {f.name}'s wgmma pipeline"


@pytest.mark.nvcc
@pytest.mark.parametrize("spec", [*KERNELS.values(), MERGE], ids=lambda s: s.name)
def test_each_module_exports_its_registry_shape(spec):
    """The launch shape a module exports (sizeof its shared-memory struct included) is the one
    its registry row declares, and fits an sm_90 CTA."""
    cfg = kernels.ptx_config(spec.source, defines=dict(spec.defines))
    assert cfg.check(spec) is cfg
    assert 0 <= cfg.smem_bytes <= 227 * 1024
    wrong = KernelSpec(**{**spec.__dict__, "threads": spec.threads + 32})
    with pytest.raises(RuntimeError, match="the registry row"):
        cfg.check(wrong)


@pytest.mark.nvcc
def test_params_layout_matches_the_host_mirror(tmp_path):
    """tests/cuda/params_layout.cu prints tv::VerifyParams' field offsets and sizes as the
    compiler lays them out; the ctypes mirror the host packs must agree field by field."""
    exe = tmp_path / "params_layout"
    build = subprocess.run(
        ["nvcc", "-std=c++17", "-o", str(exe), str(ROOT / "tests" / "cuda" / "params_layout.cu")],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    device = {
        name: (int(off), int(size))
        for name, off, size in (ln.split() for ln in lines if ln and not ln.startswith("sizeof"))
    }
    host = {
        name: (getattr(VerifyParams, name).offset, getattr(VerifyParams, name).size)
        for name, _ in VerifyParams._fields_
    }
    assert host == device
    assert f"sizeof {ctypes.sizeof(VerifyParams)}" in lines


# the targets the portable kernel is built for, and the variant auto runs on each
PORTABLE_TARGETS = {"sm_80": (8, 0), "sm_86": (8, 6), "sm_89": (8, 9), "sm_100": (10, 0), "sm_120": (12, 0)}


@pytest.mark.sass
@pytest.mark.parametrize("arch", PORTABLE_TARGETS)
def test_portable_kernel_builds_for_each_target(arch):
    """On every target, the variant auto picks there compiles without spills or local memory,
    runs on tensor cores (mma.sync) and fits the target's shared memory per CTA."""
    from specdiag.attention.registry import SMEM_PER_BLOCK

    cap = PORTABLE_TARGETS[arch]
    spec = KERNELS[auto_kernel(cap, 72, 185000)]
    defines = dict(spec.defines)
    f = kernels.nvcc_check(spec.source, arch=arch, defines=defines)[spec.entry]
    assert not f.spills and f.stack_frame == 0 and f.registers <= 255, f
    assert kernels.ptx_config(spec.source, arch=arch, defines=defines).check(spec).smem_bytes <= SMEM_PER_BLOCK[cap]
    sass = kernels.sass(spec.source, arch=arch, defines=defines)
    assert "HMMA.16816.F32.BF16" in sass and "LDSM" in sass
    assert "LDL" not in sass and "STL" not in sass


@pytest.mark.sass
def test_mma_kernel_sass_uses_tensor_cores_and_async_copies():
    sass = kernels.sass("tree_verify_mma", arch="sm_90")
    assert "HMMA.16816.F32.BF16" in sass  # mma.sync m16n8k16 bf16 -> fp32
    assert "LDGSTS.E.BYPASS.128" in sass  # 16-byte cp.async.cg
    assert "LDSM.16.MT88.4" in sass  # transposed ldmatrix for V
    assert "LDL" not in sass and "STL" not in sass  # no local-memory traffic


@pytest.mark.sass
def test_wgmma_kernel_sass_uses_warpgroup_mma():
    sass = kernels.sass("tree_verify_wgmma")
    assert "HGMMA.64x32x16.F32.BF16" in sass  # S = Q K^T, both operands from shared memory
    assert "HGMMA.64x256x16.F32.BF16" in sass  # O += P V, P from registers
    assert "LDGSTS.E.BYPASS.128" in sass
    assert "LDL" not in sass and "STL" not in sass


@pytest.mark.sass
def test_seesaw_kernel_sass_uses_warpgroup_mma_and_named_barriers():
    sass = kernels.sass("tree_verify_seesaw")
    assert "HGMMA.64x64x16.F32.BF16" in sass  # S = Q K^T on 64-key tiles
    assert "HGMMA.64x256x16.F32.BF16" in sass  # O += P V, both halves
    assert "LDGSTS.E.BYPASS.128" in sass  # the loader's tiles
    assert "BAR.ARV" in sass and "BAR.SYNC" in sass  # named barriers between the warpgroups
    assert "LDL" not in sass and "STL" not in sass
    # the scores' exponents are one MUFU each (score_exp2<true>): exp2f's guard against results
    # under 2^-126 is left only on the few row factors
    guards = len(re.findall(r"FSETP\.GEU\.AND .*-126", sass))
    assert sass.count("MUFU.EX2") >= 64 and guards <= 8


@pytest.mark.sass
def test_wide_kernel_sass_uses_one_wgmma_shape_and_no_collective_fallback():
    sass = kernels.sass("tree_verify_wide")
    # S^T = K Q^T and O^T += V^T P^T, both m64n72 (S^T in one chain: two of 40 and 32 columns read
    # the key tile twice)
    assert set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass)) == {"64x72x16"}
    assert "LDGSTS.E.BYPASS.128" in sass and "BAR.RED.OR" in sass  # the loads; the per-tile votes
    assert sass.count("USETMAXREG") == 3  # each warpgroup's register count: softmax, P V, loader
    # shuffles nvcc cannot prove warp-converged get a collective fallback, which spilled here
    assert "COLLECTIVE" not in sass
    assert "LDL" not in sass and "STL" not in sass


def test_kernel_targets():
    assert {k: s.arch for k, s in KERNELS.items()} == {
        "mma": "sm_90",
        "mma_k16": "sm_90",
        "mma_small": "sm_90",
        "wgmma": "sm_90a",
        "wgmma_seesaw": "sm_90a",
        "wgmma_wide": "sm_90a",
    }
    assert not KERNELS["mma"].hopper_only and KERNELS["wgmma_seesaw"].hopper_only
    assert kernels.arch_flags("sm_90") == ["-arch=sm_90"]
    assert kernels.arch_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    with pytest.raises(ValueError, match="unknown target"):
        kernels.arch_flags("hopper")
    assert kernels.define_flags({"TV_SKIP": 3, "A": 1}) == ["-DA=1", "-DTV_SKIP=3"]


@pytest.mark.nvcc
def test_wgmma_kernel_needs_sm90a():
    with pytest.raises(RuntimeError, match=r"nvcc failed for tree_verify_wgmma\.cu \(sm_90\)"):
        kernels.nvcc_check("tree_verify_wgmma", arch="sm_90")


@pytest.mark.nvcc
def test_wgmma_layout_arithmetic_on_cpu(tmp_path):
    """tests/cuda/wgmma_layout_check.cu: the kernels' own load and descriptor helpers against
    the PTX canonical layouts, compiled as a host program and run here (no GPU needed)."""
    exe = tmp_path / "layout_check"
    build = subprocess.run(
        [
            "nvcc",
            *kernels.arch_flags("sm_90a"),
            "-std=c++17",
            "-O1",
            "-o",
            str(exe),
            str(ROOT / "tests" / "cuda" / "wgmma_layout_check.cu"),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "all checks passed" in run.stdout


def test_page_divider_matches_integer_division():
    """The kernels find a key's page by multiply and shift (tv::page_of) with the host's constants:
    every token index a kernel can see (0 <= n < 2^31) must land on n // page_size."""
    from specdiag.attention.native import page_divider

    g = torch.Generator().manual_seed(0)
    samples = torch.randint(0, 2**31 - 1, (2000,), generator=g).tolist()
    for d in [*range(1, 300), 1000, 4096, 65535, 2**20 + 7, 2**31 - 1]:
        magic, shift = page_divider(d)
        assert 0 < magic < 2**32 and 0 <= shift <= 31
        for n in [0, 1, d - 1, d, d + 1, 2 * d - 1, 2**31 - 1, *samples[d % 7 :: 97]]:
            if 0 <= n < 2**31:
                assert (((n * magic) >> 32) + n) >> shift == n // d, (d, n)
    for bad in (0, -1, 2**31):
        with pytest.raises(ValueError, match="page_size"):
            page_divider(bad)


def test_parse_ptxas_report():
    report = """ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem
ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage in the function 'k2'
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""
    f = kernels.parse_ptxas(report)
    assert f["k1"].spills and f["k1"].shared_bytes == 1024 and f["k1"].registers == 255
    assert not f["k2"].spills
    assert f["k2"].wgmma_serialized and not f["k1"].wgmma_serialized
    with pytest.raises(RuntimeError):
        kernels.parse_ptxas("nothing here")


@pytest.mark.parametrize("spec", KERNELS.values(), ids=lambda s: s.name)
@pytest.mark.parametrize(
    "rows, nodes, prefix, batch",
    [(72, 9, 185000, 1), (16448, 257, 185000, 1), (8, 1, 0, 1), (520, 65, 33, 3), (2048, 1024, 4096, 2)],
)
def test_plan_covers_every_tile_once(rows, nodes, prefix, batch, spec):
    plan = plan_launch(rows, nodes, prefix, batch, num_sms=132, rows_per_cta=spec.rows_per_cta, bn=spec.keys_per_tile)
    bn = spec.keys_per_tile
    assert plan.bn == bn and plan.rows_per_cta == spec.rows_per_cta
    prefix_tiles = math.ceil(prefix / bn)
    covered = sorted(
        t
        for s in range(plan.n_prefix_splits)
        for t in range(s * plan.prefix_tiles_per_split, min((s + 1) * plan.prefix_tiles_per_split, prefix_tiles))
    )
    assert covered == list(range(prefix_tiles))
    tree_tiles = math.ceil(nodes / bn)
    covered = sorted(
        t
        for s in range(plan.n_tree_splits)
        for t in range(s * plan.tree_tiles_per_split, min((s + 1) * plan.tree_tiles_per_split, tree_tiles))
    )
    assert covered == list(range(tree_tiles))
    assert plan.m_tiles * plan.rows_per_cta >= rows > (plan.m_tiles - 1) * plan.rows_per_cta
    tiles = plan.split_tiles(prefix, nodes)  # (what each CTA's split_work gives it)
    assert len(tiles) == plan.splits and sum(tiles) == prefix_tiles + tree_tiles
    assert sum(plan.split_tiles(prefix // 2, nodes)[: plan.n_prefix_splits]) == math.ceil(prefix // 2 / bn)


def test_makespan_model_reproduces_the_recorded_tuning_run():
    """plan_makespan's fitted CTA cost against data/native_tune_h200.json: for each shape, the
    measured time ratios between 1, 2 and 4 waves of splits match the model's within 5%."""
    tune = json.loads((ROOT / "data" / "native_tune_h200.json").read_text())
    groups = {}
    for r in tune["rows"]:
        spec = KERNELS[r["impl"]]
        m = math.ceil(r["heads"] * r["nodes"] / spec.rows_per_cta)
        p = plan_launch(
            r["heads"] * r["nodes"],
            r["nodes"],
            r["context"],
            1,
            132,
            max(1, math.ceil(r["waves"] * 132 / m)),
            rows_per_cta=spec.rows_per_cta,
            bn=spec.keys_per_tile,
        )
        assert p.splits == r["splits"]  # the plan the run timed
        est = plan_makespan(
            p.m_tiles,
            math.ceil(r["context"] / p.bn),
            p.prefix_tiles_per_split,
            p.m_tiles * p.n_tree_splits,
            p.tree_tiles_per_split,
            132,
        )
        groups.setdefault((r["context"], r["heads"], r["nodes"]), []).append((r["ms"], est))
    assert len(groups) == 3 and all(len(g) == 3 for g in groups.values())
    for rows in groups.values():
        ms0, est0 = rows[0]
        for ms, est in rows:
            assert abs(ms / ms0 - est / est0) < 0.05, (rows, ms, est)


def test_plan_picks_a_split_count_near_the_fastest_measured():
    """data/history/session30_h100.json (runs 9 and 10): impl="auto" timed with several prefix
    split counts per shape on an H100; the plan's count (its tree CTAs back to back on idle SMs, the
    partials past L2's share costed) is within 6% of the fastest at every shape. The plan before
    them missed most at 32k x 16 x 65: 15 splits in two waves, against 7 in one."""
    runs = json.loads((ROOT / "data" / "history" / "session30_h100.json").read_text())
    best = {}
    for r in runs["run9_splits"] + runs["run10_splits"]:  # (the kernel auto ran then, recorded per row)
        times = best.setdefault((r["context"], r["heads"], r["nodes"], r["impl"]), {})
        times[r["prefix_splits"]] = min(times.get(r["prefix_splits"], math.inf), r["ms"])
    assert len(best) == 16
    for (ctx, heads, nodes, impl), times in best.items():
        spec = KERNELS[impl]
        n = plan_launch(
            heads * nodes, nodes, ctx, 1, 132, rows_per_cta=spec.rows_per_cta, bn=spec.keys_per_tile
        ).n_prefix_splits
        assert n in times and times[n] <= 1.06 * min(times.values()), (ctx, heads, nodes, n, times)


def test_session32_recordings_hold_what_the_notes_say():
    """data/history/session32_h100.json and trace_seesaw_early_empty_h100.json (H100): the seesaw
    kernel's math alone (no loads) takes 0.85-0.92 of its period with them; FlashMLA's page-size-1
    sparse prefill is within 1.10x of its dense decode at 128 heads x 65 nodes, ours 1.15-1.30x,
    and with the same number of cp.async its tensor pipe is busier than ours, the dense decode's
    busier still; the pair schedule alone (no copies) is faster than ours alone and has almost
    none of our bank conflicts (docs/kernel_notes.md, thirty-second session)."""
    hist = ROOT / "data" / "history"
    trace = json.loads((hist / "trace_seesaw_early_empty_h100.json").read_text())["runs"]
    period = {(r["context"], tuple(sorted(r["defines"].items()))): r["median_cycles"]["period"] for r in trace}
    for ctx in (32768, 185000):
        full, math_only = period[(ctx, (("TV_TRACE", 1),))], period[(ctx, (("TV_SKIP", 8), ("TV_TRACE", 1)))]
        assert 0.85 <= math_only / full <= 0.92, (ctx, math_only, full)
    runs = json.loads((hist / "session32_h100.json").read_text())
    ms = {(r["context"], r["impl"]): r["ms"] for r in runs["run4_peers_sparse"]["rows"]}
    for ctx in (32768, 65536, 131072, 185000):
        dense = ms[(ctx, "flashmla")]
        assert 1.0 < ms[(ctx, "flashmla_sparse")] / dense < 1.10 and 1.15 < ms[(ctx, "native")] / dense < 1.30, ctx
    busy, copies = {}, {}
    for r in runs["run5_ncu"]:
        m, key = r["metrics"], (r["shape"], r["impl"].split()[0])
        busy[key] = float(m["sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active"][0])
        copies[key] = int(m["smsp__inst_executed_op_ldgsts.sum"][0].replace(",", ""))
    for shape in ("32768x128x65", "131072x128x65"):
        ours, sparse, dense = ((shape, k) for k in ("native:wgmma_seesaw", "flashmla_sparse", "flashmla"))
        assert copies[dense] == 0 and 0.99 < copies[ours] / copies[sparse] < 1.01, copies
        assert busy[ours] < busy[sparse] < busy[dense], busy
    # run 8: the pair schedule (TV_PAIR=1) without copies beats ours without copies, and leaves
    # out nearly all of our bank conflicts
    alone = {}
    for k in ("run8_skip8", "run8_pair_skip8"):
        for r in runs[k]:
            alone.setdefault(r["side"], {})[(r["context"], r["heads"], r["nodes"])] = r["ms"]
    assert len(alone["skip8"]) == 3 and all(alone["pair_skip8"][s] < 0.96 * alone["skip8"][s] for s in alone["skip8"])
    conflicts = {
        k: int(v["l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"].replace(",", ""))
        for k, v in runs["run8_ncu_pair"]["metrics"].items()
    }
    assert conflicts["TV_PAIR=1"] < 0.01 * conflicts["default"], conflicts


def _timings(runs: dict, *keys: str) -> dict:
    """time_shapes.py rows of a session's runs (``keys``) pooled per (context, heads, nodes): every
    timing of that shape."""
    return _tool("compare_revision", "ratios.py").pooled(r for k in keys for r in runs[k])


def test_ratios_tool_pools_each_sides_timings(tmp_path):
    """tools/compare_revision/ratios.py: each side's timings of a shape pooled over its files, B's
    median over A's per shape both sides time, and a one-line error when they share none."""
    tool = _tool("compare_revision", "ratios.py")

    def row(ctx, ms):
        return dict(context=ctx, heads=8, nodes=9, ms=min(ms), ms_runs=ms)

    a1, a2, b1 = [row(1, [1.0, 3.0]), row(2, [2.0, 2.0])], [row(1, [2.0, 9.0])], [row(1, [1.5, 2.5]), row(3, [1.0])]
    assert tool.pooled(a1 + a2) == {(1, 8, 9): [1.0, 3.0, 2.0, 9.0], (2, 8, 9): [2.0, 2.0]}
    (r,) = tool.ratio_rows(a1 + a2, b1)  # shapes 2 and 3 are on one side only
    assert r["shape"] == (1, 8, 9) and r["a_ms"] == 2.5 and r["b_ms"] == 2.0 and r["ratio"] == 0.8
    assert r["spread"] == 9.0
    files = {}
    for name, rows in (("a1", a1), ("a2", a2), ("b1", b1), ("c", [row(4, [1.0])])):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(rows))
    run = [sys.executable, str(ROOT / "tools" / "compare_revision" / "ratios.py")]
    res = subprocess.run([*run, f"{files['a1']},{files['a2']}", str(files["b1"])], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.splitlines()[-1] == "B/A: 0.800-0.800x, median 0.800x over 1 shapes"
    res = subprocess.run([*run, str(files["a1"]), str(files["c"])], capture_output=True, text=True)
    assert res.returncode == 1 and res.stderr.strip() == "ratios: the two sides share no shape"


def test_switch_tool_refuses_bad_switches_and_a_cpu_with_one_line(tmp_path):
    """tools/compare_revision/switch.py: one set of switches the kernel's source names, then a GPU;
    anything else is one line of error and writes nothing."""
    run = [sys.executable, str(ROOT / "tools" / "compare_revision" / "switch.py")]
    for switches, impl, why in (
        ("TV_NO_SUCH=1", [], "TV_NO_SUCH"),
        ("TV_MAX_FIRST=1;TV_PV_FIRST=1", [], "one set of switches"),
        ("TV_MAX_FIRST", [], "NAME=INT"),
        ("TV_MAX_FIRST=1", ["no_such_kernel"], "impl must be one of"),
    ):
        res = subprocess.run([*run, switches, str(tmp_path / "out"), *impl], capture_output=True, text=True)
        err = res.stderr.strip()
        assert res.returncode == 1 and err.startswith("switch.py: ") and why in err and "\n" not in err, err
    res = subprocess.run([*run, "TV_MAX_FIRST=1"], capture_output=True, text=True)
    assert res.returncode == 1 and res.stderr.strip().startswith("usage: ")
    if not torch.cuda.is_available():
        res = subprocess.run([*run, "TV_MAX_FIRST=1", str(tmp_path / "out")], capture_output=True, text=True)
        assert (
            res.returncode == 1
            and res.stderr.strip() == "switch.py: no CUDA GPU here: it times the kernel's builds on one"
        )
    assert not (tmp_path / "out").exists()


def test_switch_tool_runs_its_steps_in_order_and_stops_at_a_failed_one(tmp_path, monkeypatch):
    """tools/compare_revision/switch.py with a GPU (stood in for): identity, the float64 check, then
    the two builds alternating, twice, and the ratios; a step that exits non-zero ends the run with
    one line naming it."""
    import specdiag.bench.variants as variants
    import specdiag.machine as machine

    tool = _tool("compare_revision", "switch.py")
    monkeypatch.setattr(machine, "gpu_available", lambda: True)
    monkeypatch.setattr(variants, "identity", lambda impl, vs: [dict(bit_identical=True)] * 7)
    steps, fail = [], {"at": None}

    def fake_run(cmd, **kw):
        steps.append([Path(c).name if c.endswith(".py") else c for c in map(str, cmd[1:])])
        return SimpleNamespace(returncode=int(steps[-1][0] == fail["at"]), stdout="B/A: ...\n")

    monkeypatch.setattr(tool.subprocess, "run", fake_run)
    tool.main("TV_MAX_FIRST=1", str(tmp_path / "ab"))
    assert [st[0] if st[0] != "time_shapes.py" else st[1] for st in steps] == [
        "-m",
        "base_1",
        "switch_1",
        "base_2",
        "switch_2",
        "ratios.py",
    ]
    assert steps[0][2:] == [
        "check",
        "--impl",
        "wgmma_seesaw",
        "--defines",
        "TV_MAX_FIRST=1",
        "--out",
        str(tmp_path / "ab" / "check.json"),
    ]
    assert steps[1][-1] == "" and steps[2][-1] == "TV_MAX_FIRST=1"  # the default build, then the switch's
    assert (tmp_path / "ab" / "ratios.txt").read_text() == "B/A: ...\n"
    steps.clear()
    fail["at"] = "-m"
    with pytest.raises(SystemExit, match=r"^switch.py: -m specdiag.bench check \.\.\. exited 1 \(its output above\)$"):
        tool.main("TV_MAX_FIRST=1", str(tmp_path / "ab2"))
    assert len(steps) == 1


def test_timeline_tool_takes_shapes_and_refuses_malformed_ones():
    """tools/kernel_timeline/timeline.py: SHAPES as CTXxHEADSxNODES, a one-line error for any other form."""
    tool = _tool("kernel_timeline", "timeline.py")
    assert tool.parse_shapes("32768x8x257,185000X128x65") == [(32768, 8, 257), (185000, 128, 65)]
    for bad in ("32768x8", "1x2x3x4", "ax8x9", "32768x8x9,"):
        with pytest.raises(SystemExit, match="timeline: SHAPES is CTXxHEADSxNODES"):
            tool.parse_shapes(bad)


def test_hot_loop_tool_takes_shapes_and_refuses_malformed_ones():
    """tools/kernel_timeline/hot_loop.py: SHAPES as CTXxHEADSxNODES, a one-line error otherwise."""
    tool = _tool("kernel_timeline", "hot_loop.py")
    assert tool.parse_shapes("32768x8x65,32768x128x65") == [(32768, 8, 65), (32768, 128, 65)]
    with pytest.raises(SystemExit, match="hot_loop: SHAPES is CTXxHEADSxNODES"):
        tool.parse_shapes("32768x8")


def test_split_counts_tool_takes_counts_and_lengths_and_refuses_malformed_ones():
    """tools/split_counts/splits.py: N (a split count) or pT (T prefix tiles a split, the last split
    ragged), each shape's list after the plan's own (None); a one-line error for any other form;
    pT replaces the plan's split length and count only."""
    tool = _tool("split_counts", "splits.py")
    assert tool._parse("32768:8:257=p129/4,185000:8:9=p22") == [
        ((32768, 8, 257), [None, "p129", 4]),
        ((185000, 8, 9), [None, "p22"]),
    ]
    for bad in ("32768:8:257=px", "32768:8=4", "32768:8:257=p0", "32768:8:257=0", "x", "32768:8:257"):
        with pytest.raises(SystemExit, match="splits: SPEC is CTX:HEADS:NODES=N/pT"):
            tool._parse(bad)
    plan = tool._tiles_per_split(129)(2056, 257, 32768, 1, 132, None, rows_per_cta=64, bn=64)
    assert plan == LaunchPlan(33, 4, 129, 1, 5, bn=64, rows_per_cta=64)
    with pytest.raises(SystemExit, match="p513 asks 1..512"):
        tool._tiles_per_split(513)(2056, 257, 32768, 1, 132, None, rows_per_cta=64, bn=64)


def _median_times(runs: dict, *keys: str) -> dict:
    import statistics

    return {s: statistics.median(v) for s, v in _timings(runs, *keys).items()}


def _h100_session(n: int) -> dict:
    """data/history/session<n>_h100.json, checked to be an H100's recording."""
    runs = json.loads((ROOT / "data" / "history" / f"session{n}_h100.json").read_text())
    assert "H100" in runs["machine"]["gpu"]
    return runs


def _assert_checks_passed(runs: dict, *keys: str, cases: int = 12) -> None:
    """Each recorded ``bench check`` (float64, poisoned buffers) ran its ``cases`` cases (12 until
    the forty-fourth session) and passed them."""
    from specdiag.bench.checks import passed

    for k in keys:
        assert len(runs[k]["results"]) == cases and all(passed(r) for r in runs[k]["results"]), k


def _assert_sanitized(rows: list, racecheck_pairs: int) -> None:
    """A ``bench sanitize`` recording's rows: memcheck and synccheck clean, racecheck at so many code pairs."""
    tools = {r["tool"]: r for r in rows}
    assert tools["memcheck"]["findings"] == tools["synccheck"]["findings"] == 0
    assert len(tools["racecheck"]["hazard_pcs"]) == racecheck_pairs


def _assert_ratio_table(runs: dict, *rows: tuple) -> None:
    """Each row (side a, side b, then the count, least, most and median of b / a) as _ratio_summary gives it."""
    for a, b, *want in rows:
        assert _ratio_summary(runs, a, b) == tuple(want), b


def _ratio_summary(runs: dict, a: str, b: str) -> tuple:
    """Side b over side a (each the median of its ``_1`` and ``_2`` timings) shape by shape: the
    count, least, most and median, to three places, as ratios.py prints them."""
    import statistics

    ta, tb = (_median_times(runs, f"{k}_1", f"{k}_2") for k in (a, b))
    q = [tb[s] / ta[s] for s in ta]
    return (len(q), *(round(x, 3) for x in (min(q), max(q), statistics.median(q))))


def test_session33_recordings_hold_what_the_notes_say():
    """data/history/session33_h100.json (H100): the seesaw kernel's math warps spent close to two
    R2UR per wgmma before the descriptors were stepped by an add and none after, on a third fewer
    instructions; that build took 0.98-0.99x the time at nine shapes; the pair schedule takes at
    most 1.00x the turn-taking one's time from 2,048 query rows (to two places; medians of four
    timings a side) and under 1.035x below; every
    build checked passed float64; and the notes print run 5's targets as analysis.peer_targets
    gives them (docs/kernel_notes.md, thirty-third session)."""
    from specdiag import analysis

    runs = json.loads((ROOT / "data" / "history" / "session33_h100.json").read_text())
    math = {}
    for run in ("run2_opmix", "run4_opmix"):
        row = next(r for r in runs[run]["rows"] if r["impl"] == "native:wgmma_seesaw")["roles"]["math"]
        math[run] = (row["executed_per_tile"], row["opcodes_per_tile"].get("R2UR", 0), row["opcodes_per_tile"]["HGMMA"])
    (before, r2ur, hgmma), (after, r2ur_after, _) = math["run2_opmix"], math["run4_opmix"]
    assert r2ur > 1.0 * hgmma and r2ur_after == 0 and after < 0.7 * before, math

    old, new = (
        _median_times(runs, "run3_default_1", "run3_default_2"),
        _median_times(runs, "run3_desc_1", "run3_desc_2"),
    )
    assert len(old) == 9 and all(0.975 <= new[s] / old[s] <= 0.995 for s in old), {s: new[s] / old[s] for s in old}
    turns, pair = _median_times(runs, "run4_turns_1", "run4_turns_2"), _median_times(runs, "run4_pair_1", "run4_pair_2")
    assert len(turns) == 35
    for s in turns:
        assert pair[s] / turns[s] < (1.005 if s[1] * s[2] >= 2048 else 1.035), (s, pair[s] / turns[s])
    _assert_checks_passed(
        runs, "run1_check_seesaw_pair2", "run3_check_seesaw_desc", "run3_check_wide_desc", "run3_check_pair_desc"
    )
    notes = (ROOT / "docs" / "kernel_notes.md").read_text()
    table = analysis.peer_table(analysis.peers_frame(runs["run5_peers"]))
    for t in analysis.peer_targets(table):
        line = f"target {'met' if t['met'] else 'NOT met'}: {t['target']}: {t['measured']}"
        assert notes.count(line) == 1, line  # the session's section


def test_session34_recordings_hold_what_the_notes_say():
    """data/history/session34_h100.json (H100): with the loaders' leaner rows the seesaw kernel
    took 0.955-0.999x a764b0e's time at nine shapes and the wide kernel 0.979-1.000x at six
    (medians of four timings a side, to three places), every build checked passed float64, the
    pair schedule's memcheck and synccheck were clean and racecheck reported four code pairs; and
    the thirty-third session's timings spread in both schedules (the notes' Next, item 4;
    docs/kernel_notes.md, thirty-fourth session). Its peers run was data/peers_h100.json until
    the thirty-ninth session's replaced it."""

    runs = json.loads((ROOT / "data" / "history" / "session34_h100.json").read_text())

    for old, new, n, lo, hi in (("old", "new", 9, 0.955, 0.999), ("wide_old", "wide_new", 6, 0.979, 1.0)):
        a, b = (
            _median_times(runs, f"run1_{old}_1", f"run1_{old}_2"),
            _median_times(runs, f"run1_{new}_1", f"run1_{new}_2"),
        )
        ratios = {s: round(b[s] / a[s], 3) for s in a}
        assert len(ratios) == n and min(ratios.values()) == lo and max(ratios.values()) == hi, ratios
    _assert_checks_passed(runs, "run1_check_pair", "run1_check_turns", "run1_check_wide", "run2_check_wide")
    spread = {}  # the thirty-third session's run 4: both schedules' timings spread at large shapes
    prev = json.loads((ROOT / "data" / "history" / "session33_h100.json").read_text())
    for side in ("turns", "pair"):
        t = _timings(prev, f"run4_{side}_1", f"run4_{side}_2")
        spread[side] = {s: max(v) / min(v) for s, v in t.items()}
    assert (
        sum(x > 1.03 for x in spread["turns"].values()) == 18 and sum(x > 1.03 for x in spread["pair"].values()) == 22
    )
    assert round(max(spread["turns"].values()), 3) == 1.113 and round(max(spread["pair"].values()), 3) == 1.184
    _assert_sanitized(runs["run2_sanitizer"]["rows"], 4)
    probe = {r["impl"]: r for r in runs["run2_sanitizer"]["probe"] if r["tool"] == "racecheck"}
    assert probe["probe:bare_swapped"]["findings"] == probe["probe:bare_plain"]["findings"] == 1


def test_session35_recordings_hold_what_the_notes_say():
    """data/history/session35_h200.json (H200): both switches together took 0.989-1.002x the
    default's time at nine shapes (median 0.995x; medians of eight timings a side, to three places),
    below it at 8 of 9 in each run alone; every build checked passed float64; the slower half of
    the thirty-two timings at 131k x 128 x 65 ran at a higher SM clock than the faster half; and the
    notes print data/peers_h200.json's targets as analysis.peer_targets gives them
    (docs/kernel_notes.md, thirty-fifth session)."""
    import statistics

    from specdiag import analysis, data
    from specdiag.bench.checks import passed

    runs = json.loads((ROOT / "data" / "history" / "session35_h200.json").read_text())
    assert runs["machine"]["gpu"] == "NVIDIA H200"
    keys = [f"{r}_{{}}_{i}" for r in ("run2", "run4") for i in (1, 2)]
    base = _median_times(runs, *(k.format("base") for k in keys))
    both = _median_times(runs, *(k.format("both") for k in keys))
    ratios = [round(both[s] / base[s], 3) for s in base]
    assert len(ratios) == 9 and (min(ratios), max(ratios), statistics.median(ratios)) == (0.989, 1.002, 0.995)
    for r in ("run2", "run4"):
        a, b = _median_times(runs, f"{r}_base_1", f"{r}_base_2"), _median_times(runs, f"{r}_both_1", f"{r}_both_2")
        assert sum(b[s] < a[s] for s in a) == 8, r
    for r in ("run2", "run4"):
        for side in ("pv", "sf", "both"):
            res = runs[f"{r}_check_{side}"]["results"]
            assert len(res) == 12 and all(passed(x) for x in res), (r, side)
    timed = sorted(
        (ms, c["sm_clock_mhz"])
        for side in ("base", "pv", "sf", "both")
        for k in keys
        for row in runs[k.format(side)]
        if (row["context"], row["heads"], row["nodes"]) == (131072, 128, 65)
        for ms, c in zip(row["ms_runs"], row["clocks"])
    )
    fast, slow = timed[:16], timed[16:]
    assert len(timed) == 32 and statistics.median(c for _, c in slow) > statistics.median(c for _, c in fast)
    notes = (ROOT / "docs" / "kernel_notes.md").read_text()
    table = analysis.peer_table(analysis.peers_frame(data.load_json("peers_h200.json")))
    for t in analysis.peer_targets(table):
        line = f"target {'met' if t['met'] else 'NOT met'}: {t['target']}: {t['measured']}"
        assert notes.count(line) == 1, line  # the head of the notes


def test_session39_recordings_hold_what_the_notes_say():
    """data/history/session39_h100.json (H100): against the per-key mask bytes the packed bits
    took 0.944-1.015x the time at seven shapes in run 1 and 0.937-1.014x at eight in run 2
    (medians of four timings a side, to three places), and the masking-free ablation 0.931-1.000x;
    the wide kernel's run-time page size 0.998-1.012x its one-token build's; every build checked
    passed float64; and the new default's memcheck and synccheck were clean and racecheck reported
    four code pairs (docs/kernel_notes.md, thirty-ninth session; its peers run, then
    data/peers_h100.json, is that file's version in git)."""

    runs = _h100_session(39)
    _assert_ratio_table(
        runs,
        ("run1_base", "run1_mb", 7, 0.944, 1.015, 1.006),
        ("run1_base", "run1_skip", 7, 0.931, 1.0, 0.996),
        ("run2_loads", "run2_bits", 8, 0.937, 1.014, 1.005),
        ("run1_wbase", "run1_wps0", 4, 0.998, 1.012, 1.006),
    )
    _assert_checks_passed(runs, "run1_check_mask_bits", "run2_check_seesaw", "run2_check_turns")
    _assert_sanitized(runs["run2_sanitizer_seesaw"]["rows"], 4)


def test_session40_recordings_hold_what_the_notes_say():
    """data/history/session40_h100.json (H100): the ratios of the fortieth session's table (medians
    of four timings a side, to three places); the cycles a tile of ours and FlashMLA's split kernel
    from Nsight Compute before (run 2) and after (run 9), and at many rows (run 10); the pair
    trace's periods and warpgroup 1's softmax; the stall samples; every build checked passed
    float64; the sanitizers; and the notes print the targets of its peers run (run 8: then
    data/peers_h100.json, now data/history/peers_h100_session40.json) as analysis.peer_targets gives
    them (docs/kernel_notes.md, fortieth session)."""
    from specdiag import analysis, data

    runs = _h100_session(40)
    _assert_ratio_table(
        runs,
        ("run3_base", "run3_mf", 8, 0.981, 1.010, 0.992),
        ("run5_base", "run5_sb", 8, 0.984, 1.014, 0.994),
        ("run5_base", "run5_fl", 8, 0.973, 0.999, 0.981),
        ("run5_base", "run5_both", 8, 0.959, 0.988, 0.964),
        ("run7_base", "run7_lazy", 9, 0.962, 0.972, 0.967),
        ("run8_new", "run8_early", 9, 0.991, 1.018, 1.009),
        ("run8_old", "run8_new", 9, 0.923, 0.946, 0.937),
    )

    def per_tile(run: str, impl: str) -> tuple[float, float, int]:
        cyc = {r["shape"]: r["metrics"]["gpc__cycles_elapsed.max"] for r in runs[run]["rows"] if r["impl"] == impl}
        return cyc["32768x8x65"], cyc["65536x8x65"], round((cyc["65536x8x65"] - cyc["32768x8x65"]) / 37)

    assert per_tile("run2_counters", "native") == (138442, 248420, 2972)
    assert per_tile("run2_counters", "flashmla") == (127195, 220199, 2514)
    assert per_tile("run9_counters", "native") == (128063, 229141, 2732)
    assert per_tile("run9_counters", "flashmla") == (127474, 220617, 2517)
    many = {(r["shape"], r["impl"]): r["metrics"]["gpc__cycles_elapsed.max"] for r in runs["run10_counters"]["rows"]}
    assert [many[s, i] for s in ("32768x128x65", "65536x64x65") for i in ("native", "flashmla")] == [
        1444651,
        1372461,
        1444919,
        1381220,
    ]

    def trace(run: str, defines: dict) -> dict:
        (r,) = [r for r in runs[run]["runs"] if r["defines"] == {**defines, "TV_TRACE": 1} and r["heads"] == 8]
        return {k: round(v) for k, v in r["median_cycles"].items()}

    pair = {"TV_PAIR": 1}
    t4, t4s = trace("run4_trace_pairs", pair), trace("run4_trace_pairs", {**pair, "TV_SKIP": 8})
    assert (t4["period"], t4s["period"]) == (3164, 2906)
    assert (t4["w1.pv_issued"] - t4["w1.qk_done"], t4["w1.max_out"] - t4["w0.max_out"]) == (1991, 1023)
    t5 = [trace("run5_trace_pairs", {**pair, **d}) for d in ({}, {"TV_SOFTMAX_BLOCK": 1})]
    t5.append(trace("run5_trace_pairs", {**pair, "TV_SOFTMAX_BLOCK": 1, "TV_FENCE_LATE": 1}))
    assert [t["period"] for t in t5] == [3274, 2986, 2975]
    assert [t["w1.max_out"] - t["w0.max_out"] for t in t5[:2]] == [1005, 697]
    assert [t["w1.pv_issued"] - t["w1.qk_done"] for t in t5] == [2092, 1663, 1504]
    t7 = [trace("run7_trace_pairs", {**pair, **d})["period"] for d in ({}, {"TV_PAIR_LAZY": 1})]
    assert t7 == [2969, 2792]
    t8 = trace("run8_trace_pairs", pair)
    assert (t8["ld.issued"], t8["w0.qk_done"]) == (1314, 2957)
    math = runs["run9_stalls"]["runs"][0]["roles"]["math"]
    waits = sum(t["samples"] for t in math["top"] if t["reason"] == "long_sb" and "BRA" in t["sass"])
    assert (math["samples"], math["stalls"]["long_sb"], waits, math["stalls"]["barrier"]) == (5293, 1664, 1324, 1261)
    checks = ("run3_check_maxfirst", "run5_check_sb", "run5_check_fl", "run5_check_both", "run6_check_seesaw")
    checks += ("run6_check_turns", "run7_check_lazy", "run8_check_seesaw", "run8_check_turns", "run8_check_pearly")
    _assert_checks_passed(runs, *checks)
    _assert_sanitized(runs["run8_sanitizer_seesaw"]["rows"], 4)
    notes = (ROOT / "docs" / "kernel_notes.md").read_text()
    table = analysis.peer_table(analysis.peers_frame(data.load_json("history/peers_h100_session40.json")))
    for t in analysis.peer_targets(table):
        line = f"target {'met' if t['met'] else 'NOT met'}: {t['target']}: {t['measured']}"
        assert notes.count(line) == 1, line  # the session's section (the head has the forty-fourth's run)
    many = table[(table.context >= 32768) & (table.rows >= 2000)]
    over = many[many["native / floor"] > 1.1]
    assert len(many) == 12 and sorted(zip(over.context, over.heads, over.nodes)) == [(32768, 8, 257), (185000, 128, 65)]


def test_session41_recordings_hold_what_the_notes_say():
    """data/history/session41_h100.json (H100): the ratios of the forty-first session's table (medians
    of four timings a side, to three places) and the traced periods; the default build's group
    copies freed, issued and landed, the loader's idle window and the math's waits; what the two
    switches moved in the trace; every build checked passed float64 (docs/kernel_notes.md,
    forty-first session)."""
    from specdiag import analysis

    runs = _h100_session(41)
    _assert_ratio_table(
        runs,
        ("run2_base", "run2_gp1", 9, 1.022, 1.056, 1.030),
        ("run2_base", "run2_gp2", 9, 1.012, 1.043, 1.034),
        ("run2_base", "run2_rope", 9, 0.997, 1.023, 1.012),
    )
    _assert_checks_passed(runs, "run2_check_gp1", "run2_check_gp2", "run2_check_rope")

    def pair_trace(side: str) -> dict:
        (r,) = [r for r in runs[f"run2_trace_{side}"]["runs"] if r["defines"].get("TV_PAIR") == 1]
        assert (r["context"], r["heads"], r["nodes"]) == (32768, 8, 65)
        return r

    traces = {side: pair_trace(side) for side in ("base", "gp1", "gp2", "rope")}
    t = {side: {k: round(v) for k, v in r["median_cycles"].items()} for side, r in traces.items()}
    assert [x["period"] for x in t.values()] == [2820, 2922, 3078, 2970]
    b = t["base"]
    copies, idle, pair = analysis.pair_copies(traces["base"])
    assert (pair, idle) == (5640, 1553)  # idle: no copy in flight
    assert copies.freed.tolist() == [-1218, -294, 458, 1064] and copies.issued.tolist() == [-1019, -10, 902, 1304]
    assert copies.landed.tolist() == [167, 1244, 1763, 2869]
    assert copies.issued_to_landed.tolist() == [1186, 1254, 861, 1565]
    # a pair's copies in flight from the first issued to the last landed: bytes a cycle
    assert copies.landed.max() - copies.issued.min() == 3888 and round(2 * 73728 / 3888) == 38
    assert (b["w1.early_in"] - b["w1.top"], b["w0.late_in"] - b["w0.prev_pv_done"]) == (680, 699)
    g, r = t["gp1"], t["rope"]
    assert (g["ld.issued_l1"], g["w0.early_all"], b["w0.early_all"]) == (2114, 1256, 198)
    assert [x[k] for k in ("w0.qk_done", "w1.qk_done") for x in (b, r)] == [2958, 2833, 3592, 3537]
    assert [x["w1.max_out"] - x["w1.max_in"] for x in (b, r)] == [858, 1039]
    assert [x["w0.p_out"] - x["w1.max_out"] for x in (b, r)] == [563, 842]


def test_session42_recordings_hold_what_the_notes_say():
    """data/history/session42_h100.json (H100): a ragged last prefix split against the plan's even
    ones (each the faster of two timings, to three places), TV_ROPE_EARLY's table and float64 check,
    and the pair traces with the copies alone (TV_SKIP=7) and the math alone (TV_SKIP=8)
    (docs/kernel_notes.md, forty-second session)."""
    runs = _h100_session(42)

    def k3(r: dict) -> tuple:
        return (r["context"], r["heads"], r["nodes"])

    plan, asked = {}, {}
    for r in runs["run1_ragged"]:
        shape = k3(r)
        if r["asked"] is None:
            plan[shape] = r
        else:
            asked[shape + (r["prefix_splits"], r["per"])] = r
    assert len(plan) == 11 and len(asked) == 15
    ratio = {k: round(r["ms"] / plan[k[:3]]["ms"], 3) for k, r in asked.items()}
    assert [plan[(32768, 8, 257)]["prefix_splits"], plan[(32768, 8, 257)]["per"]] == [4, 128]
    assert [ratio[(32768, 8, 257, 4, p)] for p in (129, 130, 131, 132)] == [0.966, 0.977, 0.977, 0.976]
    assert ratio[(32768, 16, 65, 8, 69)] == 0.966 and ratio[(32768, 16, 65, 8, 71)] == 0.991
    assert [ratio[k] for k in ((32768, 128, 9, 8, 71), (65536, 128, 9, 8, 141), (185000, 8, 9, 132, 22))] == [
        0.989,
        0.989,
        0.989,
    ]
    assert ratio[(32768, 64, 9, 15, 36)] == 1.02 and ratio[(32768, 8, 65, 15, 36)] == 1.006
    # at 185k the two timings of one side differ more than the sides do
    noisy = {(185000, 8, 65), (185000, 128, 9)}
    spread = [max(r["ms_runs"]) / min(r["ms_runs"]) for r in runs["run1_ragged"] if k3(r) in noisy]
    assert (round(min(spread) - 1, 3), round(max(spread) - 1, 3)) == (0.013, 0.056)
    assert max(abs(ratio[k] - 1) for k in ((185000, 8, 65, 15, 200), (185000, 128, 9, 8, 396))) < min(spread) - 1
    _assert_ratio_table(runs, ("run1_base", "run1_re", 9, 0.99, 1.007, 0.999))
    _assert_checks_passed(runs, "run1_check_rope_early")

    def period(side: str) -> dict:
        return {r["heads"]: round(r["median_cycles"]["period"]) for r in runs[f"run1_trace_{side}"]["runs"]}

    full, loads, math_only = period("base"), period("skip7"), period("skip8")
    assert (full, loads, math_only) == ({8: 2800, 128: 2744}, {8: 1818, 128: 1506}, {8: 2813, 128: 2811})
    assert [round(loads[h] / full[h], 2) for h in (8, 128)] == [0.65, 0.55]
    early = {s: round(runs[f"run1_trace_{s}"]["runs"][0]["median_cycles"]["w1.early_in"]) for s in ("base", "re")}
    assert early == {"base": 1169, "re": 1246}


def test_session45_recordings_hold_what_the_notes_say():
    """data/history/session45_h100.json (H100): TV_P1_LATE's identity, float64 check and table; the
    pair trace and every CTA's start and end at 32k and 64k x 8 x 257; and data/peers_h100.json,
    timed in two rounds, beside the forty-fourth session's single-round run (docs/kernel_notes.md,
    forty-fifth session and the head of the notes)."""
    import statistics

    from specdiag import analysis, data

    runs = _h100_session(45)
    assert len(runs["run1_identity"]) == 7 and all(r["bit_identical"] for r in runs["run1_identity"])
    _assert_checks_passed(runs, "run1_check_p1late", cases=13)
    _assert_ratio_table(runs, ("run1_base", "run1_late", 9, 0.972, 1.002, 0.998))
    at = [
        t
        for k in ("base", "late")
        for i in (1, 2)
        for r in runs[f"run1_{k}_{i}"]
        for t in r["ms_runs"]
        if (r["context"], r["heads"], r["nodes"]) == (131072, 128, 65)
    ]
    assert len(at) == 8 and round(max(at) / min(at), 3) == 1.118  # 131k x 128 x 65, the 0.972x

    # the pair schedule's CTAs at 257 nodes: span, prefix CTAs' ends, tree CTAs' first start and last end
    pair = [r for r in runs["run1_trace_257"]["runs"] if r["defines"].get("TV_PAIR") == 1]
    table = {}
    for r in pair:
        c = r["ctas"]["summary"]
        pre, tree = c["prefix"], c["tree"]
        table[r["context"]] = [
            round(x, 1)
            for x in (
                c["span_us"],
                pre["end_first"],
                pre["end_median"],
                pre["end_last"],
                tree["start_first"],
                tree["end_last"],
            )
        ]
        assert tree["ctas"] == 33 and tree["end_last"] < pre["end_median"]
    assert table == {
        32768: [219.6, 196.5, 217.5, 219.6, 196.9, 215.9],
        65536: [419.0, 392.1, 416.1, 419.0, 392.4, 411.4],
    }
    cyc = next(r for r in pair if r["context"] == 32768)["median_cycles"]
    assert round(2 * cyc["period"]) == 5440
    assert [round(cyc[k]) for k in ("w1.qk_done", "w0.max_out", "w0.pv_done", "w1.pv_issued")] == [
        3282,
        3601,
        4241,
        4706,
    ]
    assert round(cyc["w1.max_out"] - cyc["w1.max_in"]) == 955 and round(cyc["w0.max_out"] - cyc["w0.qk_done"]) == 779

    # the peers in two rounds, beside the forty-fourth session's run (one round)
    notes = (ROOT / "docs" / "kernel_notes.md").read_text()
    now, then = data.load_json("peers_h100.json"), data.load_json("history/peers_h100_session44.json")
    assert "H100" in now["machine"]["gpu"] and now["machine"]["recorded_utc"].startswith("2026-12-07T21")
    gemm = [d["ceilings"]["gemm_tflop_s"] for d in (now, then)]
    assert [round(g) for g in gemm] == [784, 767] and round(100 * (1 - gemm[1] / gemm[0]), 1) == 2.2
    tables = [analysis.peer_table(analysis.peers_frame(d)) for d in (now, then)]
    for t in analysis.peer_targets(tables[0]):
        line = f"target {'met' if t['met'] else 'NOT met'}: {t['target']}: {t['measured']}"
        assert notes.count(line) == 2, line  # the head of the notes and the session's section
    assert [t["measured"].split(";")[0] for t in analysis.peer_targets(tables[1])] == [
        "14 of 36 shapes",
        "103.6 us (floor 70.1 us, FlashMLA's prefix call 109.7 us)",
        "1.04x to 1.20x over 12 shapes",
    ]
    spread = {}
    for r in now["rows"]:
        if r["context"] >= 32768 and r["impl"] in ("native", "flashmla"):
            spread.setdefault(r["impl"], []).append(max(r["ms_runs"]) / min(r["ms_runs"]))
    assert [round(100 * (statistics.median(spread[k]) - 1), 1) for k in ("native", "flashmla")] == [1.4, 0.9]
    assert [round(100 * (max(spread[k]) - 1), 1) for k in ("native", "flashmla")] == [8.8, 7.7]
    rows = {(r["impl"], r["context"], r["heads"], r["nodes"]): r for r in now["rows"]}
    same = [
        r["ms"] / rows[("native:wgmma_seesaw", *k[1:])]["ms"]
        for k, r in rows.items()
        if k[0] == "native" and k[1] >= 32768 and r["kernel"] == "wgmma_seesaw"
    ]
    assert len(same) == 28 and (round(min(same), 3), round(max(same), 3)) == (0.944, 1.05)
    merged = tables[0].merge(tables[1], on=["context", "heads", "nodes"], suffixes=("", "_then"))
    fm = {
        (r["context"], r["heads"], r["nodes"]): r["flashmla"] / r["flashmla_then"]
        for _, r in merged[merged.context >= 32768].iterrows()
    }
    odd = [(32768, 8, 9), (32768, 16, 9)]
    rest = [v for k, v in fm.items() if k not in odd]
    assert len(rest) == 34 and (round(min(rest), 3), round(max(rest), 3)) == (0.938, 1.043)
    assert [round(fm[k], 3) for k in odd] == [0.727, 0.762]


def test_session44_recordings_hold_what_the_notes_say():
    """data/history/session44_h100.json (H100): the plan's short last split against even splits at
    five 257-node shapes, TV_P_STSM's table and float64 check, the thirteen-case check, and the
    hot loop beside FlashMLA (docs/kernel_notes.md, forty-fourth session)."""

    runs = _h100_session(44)
    _assert_checks_passed(runs, "run1_check_stsm")
    _assert_checks_passed(runs, "run2_check_seesaw", cases=13)
    _assert_ratio_table(runs, ("run1_base", "run1_stsm", 9, 0.994, 1.01, 1.0))

    from specdiag.analysis import split_length_table

    spec = KERNELS["wgmma_seesaw"]
    table = split_length_table(runs["run2_ragged"])
    want = {
        (32768, 8, 257): 0.971,
        (65536, 8, 257): 0.986,
        (131072, 8, 257): 0.988,
        (185000, 8, 257): 0.985,
        (32768, 16, 257): 0.975,
    }
    assert set(table.index) == set(want) and (table["timings"] == 3).all()
    for (ctx, heads, nodes), r in table.iterrows():
        plan = plan_launch(heads * nodes, nodes, ctx, 1, 132, rows_per_cta=spec.rows_per_cta, bn=spec.keys_per_tile)
        assert (r["splits"], r["plan_per"]) == (plan.n_prefix_splits, plan.prefix_tiles_per_split)
        assert r["even_per"] == math.ceil(math.ceil(ctx / plan.bn) / r["splits"]) < r["plan_per"]
        assert round(r["plan_over_even"], 3) == want[(ctx, heads, nodes)]
    with pytest.raises(ValueError, match="lacks"):
        split_length_table([r for r in runs["run2_ragged"] if isinstance(r["asked"], int)])

    loop = {}
    for r in runs["run1_hot_loop"]:
        loop.setdefault((r["shape"], r["impl"]), []).append(r["us_per_call"])
    for shape, lo, hi in (("32768x8x65", 1.036, 1.075), ("32768x128x65", 1.035, 1.046)):
        q = [a / b for a, b in zip(loop[(shape, "native")], loop[(shape, "flashmla")])]
        assert len(q) == 2 and (round(min(q), 3), round(max(q), 3)) == (lo, hi), shape
    traced = [r for r in runs["run1_hot_loop"] if r["impl"] == "traced"]
    assert [(round(r["effective_ghz"], 2), r["mhz_median"]) for r in traced] == [(1.71, 1920), (1.53, 1680)]

    # the instruction mix a 64-key tile and the stall shares (%)
    mix = {r["impl"]: r["roles"] for r in runs["run1_opmix"]["rows"]}
    ours, fm = mix["native:wgmma_seesaw"], mix["flashmla"]["kernel"]
    assert [round(ours[k]["executed_per_tile"]) for k in ("math", "loader")] == [2072, 1022]
    assert round(fm["executed_per_tile"]) == 3098
    assert [round(x["opcodes_per_tile"]["HGMMA"]) for x in (ours["math"], fm)] == [177, 176]
    assert [round(x["opcodes_per_tile"]["FMUL"]) for x in (ours["math"], fm)] == [44, 850]
    assert ours["loader"]["opcodes_per_tile"]["SYNCS"] == 248.5  # the math's mbarrier retries, placed after the code

    def share(x: dict, reason: str) -> int:
        return round(100 * x["stalls"][reason] / x["samples"])

    assert [share(fm, "long_sb"), share(fm, "barrier")] == [30, 24]
    assert [share(ours["math"], "barrier"), share(ours["math"], "long_sb")] == [27, 23]

    # run 3: data/peers_h100.json then (now data/history/peers_h100_session44.json), beside the
    # fortieth session's run it replaced
    from specdiag import analysis, data

    notes = (ROOT / "docs" / "kernel_notes.md").read_text()
    now, then = (data.load_json(f"history/peers_h100_session{n}.json") for n in (44, 40))
    assert "H100" in now["machine"]["gpu"] and now["machine"]["recorded_utc"].startswith("2026-12-07T19")
    assert [round(d["ceilings"]["gemm_tflop_s"]) for d in (now, then)] == [767, 739]
    tables = [analysis.peer_table(analysis.peers_frame(d)) for d in (now, then)]
    for t in analysis.peer_targets(tables[0]):
        line = f"target {'met' if t['met'] else 'NOT met'}: {t['target']}: {t['measured']}"
        assert line in notes.split("### The forty-fourth session")[1].split("### The forty-third")[0], line
    ratio, seesaw, fm = ({}, {}, {})
    for i, t in enumerate(tables):
        for _, r in t[t.context >= 32768].iterrows():
            k = (r["context"], r["heads"], r["nodes"])
            ratio[i, k] = round(r["native"] / r["flashmla"], 3)
            seesaw[i, k] = round(r["native"] / r["native:wgmma_seesaw"], 3)
            fm[i, k] = r["flashmla"]
    assert (ratio[1, (32768, 8, 257)], ratio[0, (32768, 8, 257)]) == (1.106, 1.06)
    worst = sorted((v, k) for (i, k), v in ratio.items() if i == 0)[-2:]
    assert worst == [(1.088, (32768, 16, 65)), (1.088, (65536, 64, 9))]
    long257 = [(c, 8, 257) for c in (65536, 131072, 185000)]
    assert [ratio[0, k] for k in long257] == [1.004, 1.008, 0.99]
    assert [ratio[1, k] for k in long257] == [0.992, 0.941, 0.943]
    assert [seesaw[1, k] for k in long257] == [0.956, 0.941, 0.966]
    assert [seesaw[0, k] for k in long257] == [1.028, 1.063, 1.027]
    odd = [(32768, 8, 9), (32768, 16, 9)]
    moved = {k: fm[0, k] / fm[1, k] for (i, k) in fm if i == 0}
    rest = [v for k, v in moved.items() if k not in odd]
    assert len(rest) == 34 and (round(min(rest), 3), round(max(rest), 3)) == (0.946, 1.025)
    assert [round(moved[k], 3) for k in odd] == [1.359, 1.301]


def test_session43_recordings_hold_what_the_notes_say():
    """data/history/session43_h100.json (H100): the split counts at the 36 peer shapes, the pair's
    periods with no copies and with no softmax against a tile's tensor work, TV_QK_STAGGER's tables
    and float64 checks, ours beside FlashMLA's split kernel (CUPTI and ncu), and every CTA's start
    and end (docs/kernel_notes.md, forty-third session)."""
    import statistics

    runs = _h100_session(43)

    def k3(r: dict) -> tuple:
        return (r["context"], r["heads"], r["nodes"])

    # the question: the peers run of then (data/history/peers_h100_session40.json) at 520 to 1,152
    # query rows from 32k and 64k prefixes
    peers = {
        (k3(r), r["impl"]): r["ms"]
        for r in json.loads((ROOT / "data" / "history" / "peers_h100_session40.json").read_text())["rows"]
    }
    q = [
        peers[(k, "native")] / peers[(k, "flashmla")]
        for k, impl in peers
        if impl == "native" and k[0] in (32768, 65536) and 520 <= k[1] * k[2] <= 1152
    ]
    assert len(q) == 8 and (round(min(q), 3), round(max(q), 3)) == (1.035, 1.064)

    # the plan against every other split it was asked for (a request that ran the plan's own split,
    # as the wide kernel's N + 1 capped at 128, counts as the plan's): the faster of the plan's timings
    plan, others = {}, []
    for r in runs["run1_splits"]:
        if r["asked"] is None or k3(r) in plan and (r["prefix_splits"], r["per"]) == plan[k3(r)][0]:
            best = min(r["ms"], plan[k3(r)][1]) if k3(r) in plan else r["ms"]
            plan[k3(r)] = ((r["prefix_splits"], r["per"]), best)
        else:
            others.append(r)
    ratio = {(k3(r), r["prefix_splits"], r["per"]): round(r["ms"] / plan[k3(r)][1], 3) for r in others}
    assert len(plan) == 36 and len(ratio) == 114
    assert sorted(q for q in ratio.values() if q < 1) == [0.971, 0.988, 0.995, 0.997, 0.999]
    assert ratio[((131072, 128, 9), 7, 307)] == 0.971 and ratio[((185000, 16, 9), 66, 44)] == 0.988

    def period(key: str) -> dict:
        return {r["heads"]: round(r["median_cycles"]["period"]) for r in runs[key]["runs"]}

    assert period("run1_trace_base") == {8: 2804, 128: 2744}
    assert period("run1_trace_skip8") == {8: 2813, 128: 2811}
    assert period("run1_trace_skip12") == {8: 2214, 128: 2214}
    # a tile's wgmma at 2,048 multiply-adds a cycle: Q K^T (64 rows x 64 keys x 576) and P V (64 x 512 x 64)
    tensor = (64 * 64 * 576 + 64 * 512 * 64) / 2048
    assert tensor == 2176 and round(tensor / 2214, 2) == 0.98
    pct = {
        (r["shape"], r["impl"].partition("+")[2]): (
            r["metrics"]["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"],
            r["metrics"]["sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active"],
        )
        for r in runs["run1_ncu"]["rows"]
    }
    assert [pct[("32768x128x65", v)] for v in ("", "TV_SKIP=8", "TV_SKIP=12")] == [
        (77.0, 77.92),
        (81.95, 78.66),
        (96.3, 97.51),
    ]
    # warpgroup 1's Q K^T after warpgroup 0's is issued (s1) or done (s2): slower; both pass float64
    _assert_ratio_table(
        runs, ("run2_base", "run2_s1", 9, 0.995, 1.041, 1.02), ("run2_base", "run2_s2", 9, 1.035, 1.083, 1.07)
    )
    _assert_checks_passed(runs, "run2_check_s1", "run2_check_s2")
    assert [period(f"run2_trace_{s}") for s in ("base", "s1", "s2")] == [
        {8: 2834, 128: 2732},
        {8: 2988, 128: 2819},
        {8: 3030, 128: 2967},
    ]

    # CUPTI: our partial kernel over FlashMLA's split kernel, medians of 12 calls (L2 flushed)
    def kernel_us(calls: list, i: int) -> float:
        return statistics.median(c[i][2] for c in calls)

    tl = runs["run2_timeline"]
    split = {s: kernel_us(v["native"], 0) / kernel_us(v["flashmla"], 0) for s, v in tl.items()}
    assert len(split) == 7 and (round(min(split.values()), 3), round(max(split.values()), 3)) == (1.062, 1.099)
    assert [round(kernel_us(tl["32768x8x65"][i], 0), 1) for i in ("native", "flashmla")] == [72.0, 65.5]
    merge = [round(kernel_us(v[i], 1), 1) for v in tl.values() for i in ("native", "flashmla")]
    assert (min(merge[0::2]), max(merge[0::2]), min(merge[1::2]), max(merge[1::2])) == (5.7, 7.7, 9.1, 16.3)
    early = [statistics.median(c[0][2] - c[1][1] for c in v["flashmla"]) for v in tl.values()]  # combine starts
    assert (round(min(early), 1), round(max(early), 1)) == (3.6, 5.0)
    assert [c["sm_clock_mhz"] for r in runs["run2_base_1"] if k3(r) == (32768, 8, 65) for c in r["clocks"]] == [
        1980.0
    ] * 2
    # ncu, one launch each: cycles and tensor-pipe share of ours and FlashMLA's
    m = {(r["shape"], r["impl"]): r["metrics"] for r in runs["run3_ncu_fm"]["rows"]}
    shapes = ("32768x8x65", "32768x16x65", "32768x128x9", "32768x128x65")
    cyc = [
        round(m[(s, "native")]["gpc__cycles_elapsed.max"] / m[(s, "flashmla")]["gpc__cycles_elapsed.max"], 3)
        for s in shapes
    ]
    assert cyc == [1.006, 1.061, 1.044, 1.049]
    t = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"
    assert [(m[(s, "native")][t], m[(s, "flashmla")][t]) for s in shapes] == [
        (59.72, 59.92),
        (63.2, 66.2),
        (66.63, 69.21),
        (76.91, 80.84),
    ]
    us = [m[("32768x8x65", i)]["gpu__time_duration.sum"] / 1e3 for i in ("native", "flashmla")]
    assert [round(x, 1) for x in us] == [72.0, 71.3]
    # every CTA: at 32k x 8 x 257 the 33 tree CTAs start once the prefix CTAs end (a wave of their own)
    cta = {k3(r): r["ctas"]["summary"] for r in runs["run3_trace_ctas"]["runs"]}
    assert len(cta) == 9
    s = cta[(32768, 8, 257)]
    assert s["later_wave"] == 33 and s["tree"]["start_first"] > s["prefix"]["end_first"]
    assert round(s["span_us"] - s["prefix"]["end_last"], 1) == 12.7 and round(s["tree"]["life_median"], 1) == 14.7
    assert round(100 * (s["span_us"] - s["prefix"]["end_last"]) / s["span_us"], 1) == 5.6
    assert max(v["prefix"]["start_last"] for v in cta.values()) < 0.6
    # where the last prefix split is shorter, its CTAs end before any other prefix CTA; the traced
    # CTA's clock64 cycles over its global-timer ns
    shorter, ghz = [], []
    for r in runs["run3_trace_ctas"]["runs"]:
        rows, n = r["ctas"]["rows"], r["prefix_splits"]
        tiles = -(-r["context"] // 64)
        if tiles - (n - 1) * -(-tiles // n) < -(-tiles // n):  # the last split has fewer tiles
            shorter.append(max(x[4] for x in rows if x[0] == n - 1) < min(x[4] for x in rows if x[0] < n - 1))
        cycles = max(e[2] for e in r["kernel_events"][:2]) - min(e[0] for e in r["kernel_events"][:2])
        ghz.append(cycles / (rows[0][4] - rows[0][2]))
    assert shorter == [True] * 7 and (round(min(ghz), 2), round(max(ghz), 2)) == (1.71, 1.78)
    others = [v for k, v in cta.items() if k != (32768, 8, 257)]
    assert all(v["tree"]["end_last"] < v["prefix"]["end_first"] for v in others)
    assert [round(v["tree"]["life_median"], 1) for v in others] == [10.0, 10.0, 8.5, 7.4, 10.3, 8.6, 7.4, 8.6]
    # a hot loop each (run 4): ours over FlashMLA's by pair, all at the software power cap; the
    # traced loop's effective clock against NVML's reading
    loop: dict = {}
    for r in runs["run4_clock_loop"]:
        loop.setdefault((r["shape"], r["impl"]), []).append(r)
    by_pair = [
        round(a["us_per_call"] / b["us_per_call"], 3)
        for s in ("32768x8x65", "32768x16x65", "32768x128x65")
        for a, b in zip(loop[(s, "native")], loop[(s, "flashmla")])
    ]
    assert by_pair == [1.066, 1.04, 1.027, 1.035, 1.056, 1.048]
    assert {r["reasons_or"] & 4 for r in runs["run4_clock_loop"]} == {4}
    assert [round(r["effective_ghz"], 2) for r in runs["run4_clock_loop"] if r["impl"] == "traced"] == [1.72, 1.7, 1.52]
    assert [
        round(1e3 * r["effective_ghz"] / r["mhz_median"], 2) for r in runs["run4_clock_loop"] if r["impl"] == "traced"
    ] == [0.91, 0.93, 0.89]
    assert [r["mhz_median"] for r in runs["run4_clock_loop"] if r["impl"] == "traced"] == [1890, 1830, 1710]
    watts: dict = {}
    for r in runs["run4_clock_loop"]:
        watts.setdefault(r["shape"], []).append(r["w_median"])
    assert [(round(min(w)), round(max(w))) for w in watts.values()] == [(189, 691), (688, 692), (679, 689)]
    # a last split a few tiles short at 257 nodes (run 4, once): against the plan's fastest of four timings
    ragged: dict = {}
    for r in runs["run4_ragged257"]:
        ragged.setdefault(k3(r), []).append(r)
    for shape, rows in ragged.items():
        plan = [x for r in rows if r["asked"] in (None, 4) for x in r["ms_runs"]]
        got = {r["asked"]: round(r["ms"] / min(plan), 3) for r in rows if r["asked"] not in (None, 4)}
        if shape == (32768, 8, 257):
            assert got == {"p129": 0.986, "p130": 0.975, "p131": 0.992}
        else:  # the plan's own timings spread more than the sides differ
            assert max(plan) / min(plan) - 1 > max(abs(q - 1) for q in got.values())
    spread = [
        max(p) / min(p)
        for p in (
            [x for r in v if r["asked"] in (None, 4) for x in r["ms_runs"]] for k, v in ragged.items() if k[0] > 32768
        )
    ]
    assert (round(min(spread) - 1, 3), round(max(spread) - 1, 3)) == (0.061, 0.141)


def test_plan_leaves_a_short_last_split_where_the_tree_ctas_would_wait():
    """At 32k x 8 x 257 (seesaw kernel: 33 query tiles, 512 key tiles, 5 tree tiles) 4 even splits
    fill one wave and the 33 tree CTAs run as a second; the plan keeps 4 splits and lengthens them
    until the last one ends a tree CTA's cost early. Two H100 runs timed 129-132 tiles a split
    faster than 128 (data/history/session42_h100.json, session43_h100.json). Where the tree CTAs
    already fit beside the prefix CTAs, the split count is asked, or there are several requests
    (whose CTAs interleave), the splits stay even."""
    spec = KERNELS["wgmma_seesaw"]
    kw = dict(rows_per_cta=spec.rows_per_cta, bn=spec.keys_per_tile)
    p = plan_launch(8 * 257, 257, 32768, 1, 132, **kw)
    even = plan_launch(8 * 257, 257, 32768, 1, 132, prefix_splits=4, **kw)
    assert (even.n_prefix_splits, even.prefix_tiles_per_split) == (4, 128)
    assert p.n_prefix_splits == 4 and p.prefix_tiles_per_split > 128 and p.split_tiles(32768, 257)[3] < 128
    overhead = CTA_OVERHEAD_TILES * TILE_UNIT / p.bn
    assert 4 * p.prefix_tiles_per_split - 512 >= p.tree_tiles_per_split + overhead
    args = (p.m_tiles, 512, p.prefix_tiles_per_split, p.m_tiles, p.tree_tiles_per_split, 132)
    assert plan_makespan(*args, overhead=overhead, ragged=True) < plan_makespan(*args, overhead=overhead)
    hist = ROOT / "data" / "history"
    for name, run in (("session42_h100.json", "run1_ragged"), ("session43_h100.json", "run4_ragged257")):
        rows = [r for r in json.loads((hist / name).read_text())[run] if (r["context"], r["nodes"]) == (32768, 257)]
        plan_ms = [r["ms"] for r in rows if r["per"] == 128]
        ragged = {r["per"]: r["ms"] for r in rows if r["per"] != 128}
        assert plan_ms and p.prefix_tiles_per_split in ragged and max(ragged.values()) < min(plan_ms), (name, rows)
    for ctx, heads, nodes, batch in ((32768, 8, 65, 1), (32768, 128, 9, 1), (65536, 16, 65, 1), (32768, 8, 257, 2)):
        q = plan_launch(heads * nodes, nodes, ctx, batch, 132, **kw)
        assert q.prefix_tiles_per_split == math.ceil(math.ceil(ctx / q.bn) / q.n_prefix_splits), (ctx, heads, nodes)


def test_merge_cost_counts_the_partials_past_the_free_bytes():
    rows = 1000  # 2 MB of partials a split
    under = int(MERGE_FREE_BYTES // (rows * 512 * 4))
    assert merge_cost(under, rows) == 0 and merge_cost(under + 2, rows) > 0
    step = rows * 512 * 4 / MERGE_BYTES_PER_TILE  # a split more past the free bytes, in 32-key tiles
    assert merge_cost(under + 3, rows) - merge_cost(under + 2, rows) == pytest.approx(step)
    assert merge_cost(under + 3, rows, 64) == pytest.approx(merge_cost(under + 3, rows) / 2)


@pytest.mark.parametrize(
    "ctx, heads, nodes",
    [
        (185000, 8, 9),
        (185000, 8, 65),
        (185000, 64, 9),
        (185000, 64, 65),
        (185000, 64, 257),
        (32768, 8, 257),
        (4096, 8, 65),
    ],
)
def test_plan_fills_whole_waves(ctx, heads, nodes):
    """The chosen split count keeps the estimated time within 10% of the work spread evenly over
    the SMs plus one CTA's fixed cost (ceil(132 / 9) = 15 splits of 9 query tiles used to spill
    3 CTAs into a second wave and take 1.96x that)."""
    p = plan_launch(heads * nodes, nodes, ctx, 1, 132)
    tiles = math.ceil(ctx / TILE_UNIT)
    est = plan_makespan(
        p.m_tiles, tiles, p.prefix_tiles_per_split, p.m_tiles * p.n_tree_splits, p.tree_tiles_per_split, 132
    )
    ideal = p.m_tiles * tiles / 132 + CTA_OVERHEAD_TILES
    assert est <= 1.1 * ideal, (p, est, ideal)


def test_merge_groups_rule():
    from specdiag.attention.plan import MERGE_GROUPS_MIN_SPLITS

    assert [merge_groups(n) for n in (1, 3, MERGE_GROUPS_MIN_SPLITS - 1, MERGE_GROUPS_MIN_SPLITS, 65, 2000)] == [
        1,
        1,
        1,
        4,
        4,
        4,
    ]
    with pytest.raises(ValueError, match=">= 1"):
        merge_groups(0)


def test_plan_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rows_per_cta"):
        plan_launch(10, 1, 100, 1, 132, rows_per_cta=0)
    with pytest.raises(ValueError):
        plan_launch(0, 1, 100, 1, 132)
    with pytest.raises(ValueError, match="prefix_splits"):
        plan_launch(10, 1, 100, 1, 132, prefix_splits=0)


def test_native_rejects_bad_impls_and_names_the_wrong_tensor():
    x, _ = make_verify_inputs([10], nodes=3, heads=2, page_size=4)
    with pytest.raises(ValueError, match="impl must be 'auto' or one of"):
        NativeTreeVerify(**x, scale=SCALE, impl="tcgen05")
    with pytest.raises(ValueError, match="head dim 576; q has 512"):
        NativeTreeVerify(**{**x, "q": x["q"][..., :512]}, scale=SCALE)


def test_auto_picks_by_capability_rows_and_prefix(monkeypatch):
    # off sm_90: the mma.sync variant with the largest tiles that fits the GPU's shared memory
    for cap, want in (((8, 0), "mma_k16"), ((8, 9), "mma_small"), ((10, 0), "mma"), ((12, 0), "mma_small")):
        assert auto_kernel(cap, 72, 185000) == want, cap
    assert auto_kernel((7, 5), 72, 185000) == "mma_small"  # unknown: assumed 99 KB
    assert auto_kernel((8, 0), smem_per_block=KERNELS["mma"].smem_bytes) == "mma"
    with pytest.raises(ValueError, match="no native kernel fits 65536 bytes"):
        auto_kernel((7, 5), smem_per_block=65536)
    # on sm_90, by query rows: wgmma_seesaw for up to 64 from a 64k prefix, for 65-80 from 16k, for
    # more rows from 4k (from 2048 rows at any prefix); the wgmma kernel below; wgmma_wide for 65-72
    # and 129-144 rows from 32k
    for rows, prefix, want in [
        (72, 16383, "wgmma"),
        (72, 16384, "wgmma_seesaw"),
        (80, 16383, "wgmma"),
        (80, 16384, "wgmma_seesaw"),
        (72, 32767, "wgmma_seesaw"),
        (72, 32768, "wgmma_wide"),
        (65, 185000, "wgmma_wide"),
        (64, 185000, "wgmma_seesaw"),
        (73, 185000, "wgmma_seesaw"),
        (80, 185000, "wgmma_seesaw"),
        (128, 185000, "wgmma_seesaw"),
        (129, 32768, "wgmma_wide"),
        (144, 185000, "wgmma_wide"),
        (144, 32767, "wgmma_seesaw"),
        (145, 185000, "wgmma_seesaw"),
        (40, 65535, "wgmma"),
        (40, 65536, "wgmma_seesaw"),
        (64, 65535, "wgmma"),
        (64, 65536, "wgmma_seesaw"),
        (1, 185000, "wgmma_seesaw"),
        (1, 32768, "wgmma"),
        (81, 185000, "wgmma_seesaw"),
        (520, 4096, "wgmma_seesaw"),
        (520, 4095, "wgmma"),
        (2047, 1024, "wgmma"),
        (2048, 1024, "wgmma_seesaw"),
        (16448, 0, "wgmma_seesaw"),
        (None, None, "wgmma_seesaw"),
    ]:
        assert auto_kernel((9, 0), rows, prefix) == want, (rows, prefix)
    assert auto_kernel((9, 0), 72) == "wgmma"  # prefix unknown: the short-prefix choice

    def props(major, minor, smem):
        return lambda device=None: SimpleNamespace(major=major, minor=minor, shared_memory_per_block_optin=smem)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props(9, 0, 232448))
    assert resolve_impl("auto", None, max_prefix=185000, rows=72) == "wgmma_wide"
    monkeypatch.setattr(torch.cuda, "get_device_properties", props(12, 0, 101376))
    assert resolve_impl("auto", None, max_prefix=185000, rows=72) == "mma_small"
    assert resolve_impl("mma") == "mma" and resolve_impl("wgmma") == "wgmma"
    with pytest.raises(ValueError, match="impl must be"):
        resolve_impl("fastest")


def test_native_rejects_non_bf16_and_cpu_tensors():
    x, _ = make_verify_inputs([10], nodes=3, heads=2, page_size=4, dtype=torch.float32)
    with pytest.raises(ValueError, match="bf16"):
        NativeTreeVerify(**x, scale=SCALE)
    x, _ = make_verify_inputs([10], nodes=3, heads=2, page_size=4)
    with pytest.raises(ValueError, match="CUDA device"):
        NativeTreeVerify(**x, scale=SCALE)


def test_wheel_ships_the_cuda_sources(tmp_path):
    # build offline where setuptools is already installed (GPU machines have no network), from a
    # copy of the sources: setuptools' build/ in the checkout would keep files deleted since
    offline = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    src = tmp_path / "src"
    for d in ("lib", "kernels"):
        shutil.copytree(ROOT / d, src / d, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *offline, "-q", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("specdiag-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith("specdiag/_cu/") and n.endswith((".cu", ".cuh"))}
    assert shipped == {p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".cu", ".cuh")}
    assert "specdiag/attention/registry.py" in names and "specdiag/bench/__main__.py" in names


def test_poisoning_unused_pool_slots_leaves_the_reference_unchanged():
    """check_native fills every pool slot no prefix uses with NaN: the reference (which reads
    only used slots) must not change, and the partial last pages and spare pages are hit."""
    from specdiag.bench.checks import poison_unused_slots

    x, _ = make_verify_inputs([1000, 33, 0], nodes=5, heads=2, page_size=64, seed=3)
    ref_o, ref_l = tree_verify_attention_ref(**x, scale=SCALE)
    n = poison_unused_slots(x["kv_pool"], x["page_table"], x["prefix_lens"])
    used = 1000 + 33
    assert n == x["kv_pool"].shape[0] * 64 - used
    assert int(torch.isnan(x["kv_pool"]).any(-1).sum()) == n
    o, l = tree_verify_attention_ref(**x, scale=SCALE)
    assert torch.equal(o, ref_o) and torch.equal(l, ref_l)


@pytest.mark.sass
@pytest.mark.parametrize("impl", ["wgmma_seesaw", "wgmma_wide"])
def test_ablation_switches_compile_and_drop_their_stage(impl):
    """bench.ablation's variants are TV_SKIP builds of the Hopper kernels: none serialises its
    wgmma pipeline (it would time ptxas, not the stage), the builds without matrix multiplies
    lose them, and the loads and page lookups go where they say. Spill-free: every build but the
    wide kernel's no_qk, no_pv, no_mma and no_mask, which spill 4-40 bytes a thread (ptxas places the
    emptied accumulators differently; no_mma keeps four values in local memory across its loop),
    and each kernel's no_loads (up to 16 bytes, outside its loop: the wide kernel's since the
    loader's rows went to page + in-page row, thirty-fourth session, one value around its math
    warpgroups' setmaxnreg). Without the mask (no_mask) a build is a tenth shorter or more."""
    from specdiag.bench.ablation import VARIANTS

    spec = KERNELS[impl]
    assert [k.name for k in KERNELS.values() if k.ablations] == ["wgmma_seesaw", "wgmma_wide"]
    assert set(VARIANTS) == {
        "full",
        "no_qk",
        "no_pv",
        "no_softmax",
        "no_loads",
        "no_mma",
        "loads_only",
        "no_page_lookup",
        "no_mask",
    }
    for name, skip in VARIANTS.items():
        f = kernels.nvcc_check(spec.source, defines={"TV_SKIP": skip})[spec.entry]
        assert not f.wgmma_serialized, name
        if name == "no_loads":
            assert f.stack_frame <= 16 and f.spill_stores <= 16, f
        elif impl == "wgmma_seesaw" or name not in ("no_qk", "no_pv", "no_mma", "no_mask"):
            assert not f.spills and f.stack_frame == 0, name
    full = kernels.sass(spec.source)
    no_mma = kernels.sass(spec.source, defines={"TV_SKIP": VARIANTS["no_mma"]})
    no_loads = kernels.sass(spec.source, defines={"TV_SKIP": VARIANTS["no_loads"]})
    shapes = {"wgmma_seesaw": {"64x64x16", "64x256x16"}, "wgmma_wide": {"64x72x16"}}[impl]
    assert shapes <= set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", full))
    # (ptxas keeps empty commit groups as null HGMMA.64x8x16 on RZ; the real shapes must be gone)
    assert set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", no_mma)) <= {"64x8x16"} and "LDGSTS" in no_mma
    assert no_loads.count("LDGSTS") < full.count("LDGSTS")  # the tiles' cp.async gone, Q's stays
    no_pages = kernels.sass(spec.source, defines={"TV_SKIP": VARIANTS["no_page_lookup"]})
    ldg = lambda sass: len(re.findall(r"\bLDG\.", sass))  # noqa: E731
    assert ldg(no_pages) < ldg(full) and no_pages.count("LDGSTS") == full.count("LDGSTS")
    no_mask = kernels.sass(spec.source, defines={"TV_SKIP": VARIANTS["no_mask"]})  # the masking branch gone
    assert len(kernels.sass_instructions(no_mask)) < 0.9 * len(kernels.sass_instructions(full))


def _sass_ins(source: str, defines: dict | None = None) -> list[tuple[int, str]]:
    """A build's SASS as (address, instruction) pairs."""
    return kernels.sass_instructions(kernels.sass(source, defines=defines or {}))


def _chain_steps(ins: list[str], op: str) -> list[tuple[int, int]]:
    """Indices of successive ``op`` instructions less than 30 apart: the steps within one chain."""
    at = [i for i, x in enumerate(ins) if op in x]
    return [(a, b) for a, b in zip(at, at[1:]) if b - a < 30]


@pytest.mark.sass
def test_wgmma_descriptors_are_a_base_plus_a_step():
    """The seesaw and wide kernels build each wgmma operand's descriptor once and add a k-step's
    bytes to its low word (tvg::desc_add; tests/cuda/wgmma_layout_check.cu checks the values). In
    the SASS nearly every Q K^T (S^T) wgmma then follows the one before it after at most 4
    instructions, with no R2UR: the thirty-second session's seesaw build spent 10-12 (two R2UR)
    on each one's descriptors (docs/kernel_notes.md, thirty-third session). The pair schedule's 16
    P V wgmmas are four P V of four k-steps; within each, at most 5 instructions other than the
    softmax's float arithmetic (which ptxas may schedule there: the row sums, fortieth session)
    stand between two wgmmas (2-13 before they were stepped, thirty-fifth session)."""
    for name, dims, builds in (
        ("wgmma_seesaw", "64x64x16", ({}, {"TV_PAIR": 0})),
        ("wgmma_wide", "64x72x16", ({},)),
    ):
        spec = KERNELS[name]
        for d in builds:
            ins = [x for _, x in _sass_ins(spec.source, d)]
            steps = _chain_steps(ins, f"HGMMA.{dims}")
            assert len(steps) >= 60, (name, d, len(steps))
            assert not any("R2UR" in ins[j] for a, b in steps for j in range(a + 1, b)), (name, d)
            assert sum(b - a - 1 <= 4 for a, b in steps) >= 0.85 * len(steps), (name, d)
    ins = [x for _, x in _sass_ins(KERNELS["wgmma_seesaw"].source)]
    pv = [i for i, x in enumerate(ins) if "HGMMA.64x256x16" in x]
    arith = ("FADD", "FMUL", "FFMA", "MUFU", "F2FP")
    gaps = [
        sum(kernels.opcode(ins[j]).split(".")[0] not in arith for j in range(a + 1, b))
        for k in range(0, len(pv), 4)
        for a, b in zip(pv[k : k + 4], pv[k + 1 : k + 4])
    ]
    assert len(pv) == 16 and len(gaps) == 12 and max(gaps) <= 5, (pv, gaps)


def _tool(folder: str, file: str):
    """tools/<folder>/<file> as a module."""
    spec = importlib.util.spec_from_file_location(folder, ROOT / "tools" / folder / file)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _sass_loops_tool():
    return _tool("sass_loops", "loops.py")


def _exp_inputs(source: str, defines: dict | None = None) -> dict[str, int]:
    """Per opcode, how many of a build's MUFU.EX2 take a register that opcode wrote last."""
    ins = [x for _, x in _sass_ins(source, defines)]
    by = {}
    for i, x in enumerate(ins):
        if m := re.search(r"MUFU\.EX2 R\d+, (R\d+)", x):
            writer = next((w for w in reversed(ins[:i]) if re.match(rf"(?:@!?U?P\w+ )?\S+ {m.group(1)}\b", w)), "?")
            by[kernels.opcode(writer)] = by.get(kernels.opcode(writer), 0) + 1
    return by


@pytest.mark.sass
def test_seesaw_pair_schedule_folds_the_scale_into_the_exponent():
    """The pair schedule keeps the scores unscaled and gives each exponent the softmax scale in its
    FFMA, exp2(s * scale - m) (the seventeenth session's builds of this spilled at 200 math
    registers; this one builds at 224 without spills or a serialised wgmma pipeline). So its
    exponents read what an FFMA wrote, and the turn-taking schedule's (scores scaled by an FMUL
    first) what an FADD wrote (docs/kernel_notes.md, thirty-fifth session)."""
    spec = KERNELS["wgmma_seesaw"]
    f = kernels.nvcc_check(spec.source)[spec.entry]
    assert not f.spills and f.stack_frame == 0 and not f.wgmma_serialized, f
    pair, turns = _exp_inputs(spec.source), _exp_inputs(spec.source, {"TV_PAIR": 0})
    assert pair.get("FFMA", 0) >= 64 and not pair.get("FADD"), pair
    assert turns.get("FADD", 0) >= 64 and not turns.get("FFMA"), turns


@pytest.mark.sass
def test_seesaw_steady_loops_stay_lean():
    """tools/sass_loops/loops.py on the seesaw kernel without its masking branch (the no_mask
    ablation, TV_SKIP=32): the pair schedule's two math loops run 646 (warpgroup 1's, which holds
    its softmax twice: both rows in one block for a pair, apart for a last lone tile) and 874
    instructions a pair of tiles with 44 wgmmas each, and its loader's 307. FlashMLA's SM90 dense
    decode (the sgl-flash-mla 1.0.0 wheel; its math warpgroups issue its TMA loads too) runs 756
    and 940 (docs/kernel_notes.md, thirty-fifth and fortieth sessions). The bounds sit just above
    ours; the default build's loops hold the masking branch and are longer."""
    tool = _sass_loops_tool()
    source = KERNELS["wgmma_seesaw"].source
    lean = tool.loops(kernels.sass(source, defines={"TV_SKIP": 32}))
    mma = [sum("HGMMA" in x for x in lp["body"]) for lp in lean]
    sizes = [len(lp["body"]) for lp in lean]
    assert mma == [44, 44, 0] and sizes[0] <= 660 and sizes[1] <= 890 and sizes[2] <= 310, sizes
    assert sum(kernels.opcode(x) == "LDGSTS" for x in lean[2]["body"]) == 72
    full = [len(lp["body"]) for lp in tool.loops(kernels.sass(source))]
    assert full[0] > sizes[0] and full[1] > sizes[1] and full[2] == sizes[2], (full, sizes)
    lines = tool.table({"a": lean[0]["body"]}).splitlines()
    assert lines[0].split() == ["opcode", "a"] and lines[-1].split() == ["total", str(sizes[0])]


@pytest.mark.sass
def test_seesaw_loaders_copy_without_per_row_address_work():
    """The seesaw kernel's loaders take each row's page and in-page row a load ahead and form its
    address at the copy; each copy's zero-fill is an ignore-src predicate (tvg::cp_async16_in); the
    page-table reads are written without a predicate (ptxas still puts the split's kind on them,
    thirty-fifth session). The steady loop (tools/sass_loops) then runs 307 instructions a pair of tiles
    (turns: 140 a tile) where a764b0e ran 597 (325): that build predicated each row's work on the
    split's kind, recomputed its page index and, for a src-size register, added (16 - size) & 15
    to every row's address before each group of copies (docs/kernel_notes.md, thirty-fourth
    session)."""
    spec = KERNELS["wgmma_seesaw"]
    loops = _sass_loops_tool().loops
    for d, tiles, most in (({}, 2, 330), ({"TV_PAIR": 0}, 1, 155)):
        (body,) = [lp["body"] for lp in loops(kernels.sass(spec.source, defines=d), marks=("LDGSTS",))]
        assert sum("LDGSTS" in x for x in body) >= 36 * tiles, d  # the loop holds the tiles' copies
        assert len(body) <= most, (d, len(body))
        assert not any(re.search(r"IADD3 R\d+, -R\d+, 0x10,", x) for x in body), d


@pytest.mark.sass
@pytest.mark.parametrize("spec", KERNELS.values(), ids=lambda s: s.name)
def test_one_token_page_build_drops_the_page_arithmetic(spec):
    """TV_PAGE_SIZE=1, the build for one-token pages (DDTree's; native.build_defines), compiles
    without spills or a serialised wgmma pipeline, and its steady copy loop is shorter than the
    run-time page size's. The Hopper loaders lose the page division (IMAD.HI of tv::page_of's
    multiplier) altogether; the seesaw's loader, without its masking branch (TV_SKIP=32), runs 255
    instructions a pair of tiles where the run-time build runs 307 (FlashMLA's sparse prefill's
    loader, which gathers single tokens, runs 242: docs/kernel_notes.md, thirty-fifth session)."""
    loops = _sass_loops_tool().loops
    base = dict(spec.defines)
    f = kernels.nvcc_check(spec.source, defines={**base, "TV_PAGE_SIZE": 1})[spec.entry]
    assert not f.spills and f.stack_frame == 0 and not f.wgmma_serialized, f
    one, any_size = (
        loops(kernels.sass(spec.source, defines={**base, **d}), marks=("LDGSTS",))[-1]["body"]
        for d in ({"TV_PAGE_SIZE": 1}, {})
    )
    assert sum("LDGSTS" in x for x in one) == sum("LDGSTS" in x for x in any_size) > 0
    assert len(one) < len(any_size), (len(one), len(any_size))
    if spec.name in ("wgmma_seesaw", "wgmma_wide"):
        assert not any("IMAD.HI" in x for x in one) and any("IMAD.HI" in x for x in any_size)
    if spec.name == "wgmma_seesaw":
        lean = loops(kernels.sass(spec.source, defines={"TV_SKIP": 32, "TV_PAGE_SIZE": 1}), marks=("LDGSTS",))
        assert len(lean[-1]["body"]) <= 260, len(lean[-1]["body"])


@pytest.mark.parametrize("nodes", [1, 9, 64, 65, 257])
def test_tree_mask_bits_pack_each_row_in_64_key_words(nodes):
    """native.tree_mask_bits (the seesaw kernel's tree_bits): bit k of word j of row
    [b][i] is tree_mask[b][i][64 j + k], keys past the tree clear, bit 63 included."""
    from specdiag.attention.native import tree_mask_bits

    g = torch.Generator().manual_seed(nodes)
    mask = torch.rand(2, nodes, nodes, generator=g) < 0.5
    mask[:, :, -1] = True  # (at 64 and 65 nodes: a row's bit 63 set)
    bits = tree_mask_bits(mask.to(torch.uint8))
    words = -(-nodes // 64)
    assert bits.shape == (2, nodes, words) and bits.dtype == torch.int64
    for b in range(2):
        for i in range(nodes):
            for j in range(words):
                word = int(bits[b, i, j]) & (2**64 - 1)
                want = sum(1 << k for k in range(64) if 64 * j + k < nodes and mask[b, i, 64 * j + k])
                assert word == want, (b, i, j)


@pytest.mark.parametrize("default_on", [False, True])
def test_one_token_page_build_is_checked_against_the_pool(default_on, monkeypatch):
    """With ONE_TOKEN_PAGE_BUILD a pool of one-token pages gets the TV_PAGE_SIZE=1 build, else the
    page size read at run time, as every other pool; a build for pages other than the pool's is
    refused (it would read the wrong rows)."""
    from specdiag.attention import native
    from specdiag.attention.native import build_defines

    monkeypatch.setattr(native, "ONE_TOKEN_PAGE_BUILD", default_on)
    assert build_defines(1) == ({"TV_PAGE_SIZE": 1} if default_on else {})
    assert build_defines(1, {"TV_PAGE_SIZE": 1}) == {"TV_PAGE_SIZE": 1}
    assert build_defines(64) == {} and build_defines(7, {"TV_SKIP": 3}) == {"TV_SKIP": 3}
    assert build_defines(1, {"TV_PAGE_SIZE": 0}) == {"TV_PAGE_SIZE": 0}  # the run-time build, for an A/B
    assert build_defines(64, {"TV_PAGE_SIZE": 64, "TV_SKIP": 3}) == {"TV_PAGE_SIZE": 64, "TV_SKIP": 3}
    for pages, fixed in ((64, 1), (1, 64), (16, 32)):
        with pytest.raises(ValueError, match=f"TV_PAGE_SIZE={fixed}, but kv_pool's pages hold {pages} tokens"):
            build_defines(pages, {"TV_PAGE_SIZE": fixed})


@pytest.mark.sass
def test_seesaw_schedules_pair_by_default_turns_apart():
    """The seesaw kernel's default build is the pair schedule (FlashMLA's order; docs/kernel_notes.md,
    thirty-third session): registers 224 / 56, all of sm_90's 227 KB (P of a pair's odd tile in a
    buffer of its own), no serialised wgmma pipeline, its no-loads build too. TV_PAIR=0 builds the
    turn-taking schedule (200 / 104 registers, 8 KB less); TV_TRACE asks for it by name."""
    spec = KERNELS["wgmma_seesaw"]
    for d in ({}, {"TV_SKIP": 8}, {"TV_PAIR": 0}):
        f = kernels.nvcc_check(spec.source, defines=d)[spec.entry]
        assert not f.wgmma_serialized and f.stack_frame <= 16, (d, f)
    pair, turns = kernels.sass(spec.source), kernels.sass(spec.source, defines={"TV_PAIR": 0})
    split = r"USETMAXREG\.(?:TRY_ALLOC|DEALLOC)\.CTAPOOL (?:UP\d, )?0x(\w+)"
    assert sorted(set(re.findall(split, pair))) == ["38", "e0"] and sorted(set(re.findall(split, turns))) == [
        "68",
        "c8",
    ]
    assert kernels.ptx_config(spec.source).smem_bytes == spec.smem_bytes == 227 * 1024
    assert kernels.ptx_config(spec.source, defines={"TV_PAIR": 0}).smem_bytes == 227 * 1024 - 8192


def test_ncu_counters_tool_reads_its_arguments_or_says_why_not():
    """tools/ncu_counters/counters.py (Nsight Compute counters of one launch per verify, on a GPU):
    its shape and IMPL[+NAME=INT...] arguments, and one-line refusals of anything else."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("counters", ROOT / "tools" / "ncu_counters" / "counters.py")
    counters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counters)
    assert counters.parse_impl("native:wgmma_seesaw+TV_PAIR=1+TV_SKIP=8") == (
        "native:wgmma_seesaw",
        {"TV_PAIR": 1, "TV_SKIP": 8},
    )
    assert counters.parse_impl("flashmla_sparse") == ("flashmla_sparse", {})
    assert counters.parse_shape("32768x128x65") == (32768, 128, 65)
    for bad, why in [
        ("native:wgmma_seesaw+TV_PAIR", "NAME=INT"),
        ("native:wgmma_seesaw+TV_PIAR=1", "not a switch of kernels/tree_verify_seesaw"),
        ("native+TV_PAIR=1", "ours only"),
        ("flashmla+TV_PAIR=1", "ours only"),
        ("sglang", "IMPL is"),
    ]:
        with pytest.raises(SystemExit, match=why):
            counters.parse_impl(bad)
    with pytest.raises(SystemExit, match="CTXxHEADSxNODES"):
        counters.parse_shape("32768x128")


def test_ncu_opmix_tool_splits_roles_and_counts_per_tile():
    """tools/ncu_counters/opmix.py: a kernel's instructions split into warp roles at each
    USETMAXREG and the out-of-line blocks after its last EXIT, executed counts summed per opcode
    and divided by the prefix tiles."""
    import importlib.util
    import subprocess
    import sys

    path = ROOT / "tools" / "ncu_counters" / "opmix.py"
    spec = importlib.util.spec_from_file_location("opmix", path)
    opmix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(opmix)
    assert (
        opmix.opcode("@!P0 BRA 0x10") == "BRA" and opmix.opcode("HGMMA.64x64x16.F32.BF16 R1, gdesc[UR4], RZ") == "HGMMA"
    )

    def ins(sass, executed, **stalls):
        return dict(sass=sass, executed=executed, samples=sum(stalls.values()), stalls=stalls)

    kernel = [
        ins("S2R R0, SR_TID.X", 4),
        ins("USETMAXREG.TRY_ALLOC.CTAPOOL UP1, 0xc8", 2),
        ins("HGMMA.64x64x16.F32.BF16 R1, gdesc[UR4], RZ", 40, wait=3),
        ins("@P0 BRA 0x20", 6, barrier=5),
        ins("USETMAXREG.DEALLOC.CTAPOOL 0x68", 2),
        ins("LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]", 80, long_sb=1),
        ins("@!P0 EXIT", 2),
        ins("EXIT", 2),
        ins("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR27+0x18], R14", 30, long_sb=7),
        ins("@!P0 BRA 0x1700", 30),
    ]
    assert opmix.roles(kernel) == [("prologue", 0, 1), ("math", 1, 4), ("loader", 4, 8), ("out_of_line", 8, 10)]
    assert opmix.roles(kernel[2:4]) == [("kernel", 0, 2)]
    assert opmix.roles(kernel[2:4] + kernel[7:]) == [("kernel", 0, 3), ("out_of_line", 3, 5)]
    out = opmix.summarize(kernel, tiles=2)
    assert out["math"]["executed_per_tile"] == 24.0 and out["math"]["opcodes_per_tile"] == {
        "HGMMA": 20.0,
        "BRA": 3.0,
        "USETMAXREG": 1.0,
    }
    assert out["math"]["stalls"] == {"barrier": 5, "wait": 3} and out["loader"]["opcodes_per_tile"]["LDGSTS"] == 40.0
    assert out["loader"]["executed_per_tile"] == 43.0 and out["out_of_line"]["opcodes_per_tile"] == {
        "SYNCS": 15.0,
        "BRA": 15.0,
    }
    res = subprocess.run([sys.executable, str(path), "out.json", "32768x128"], capture_output=True, text=True)
    assert res.returncode != 0 and "Usage" in res.stderr


def test_ablation_refuses_kernels_without_switches():
    from specdiag.bench.ablation import ablate

    with pytest.raises(ValueError, match="no stage switches in 'mma'"):
        ablate(impl="mma")


# ---------------------------------------------------------------- GPU only


def _needs_sm90(impl):
    if impl in KERNELS and KERNELS[impl].hopper_only and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"the {impl} kernel is built for sm_90a only")


@pytest.mark.gpu
@pytest.mark.parametrize("impl", KERNELS)
def test_native_matches_float64_reference_on_gpu(impl):
    from specdiag.bench.checks import CHECK_CASES, check_native, passed

    _needs_sm90(impl)
    results = check_native(seed=int(torch.randint(0, 10_000, (1,))), impl=impl)
    assert len(results) == len(CHECK_CASES)
    for r in results:
        assert r["impl"] == impl and passed(r), r
        assert r["poisoned_slots"] > 0, r  # every case has spare pages


@pytest.mark.gpu
@pytest.mark.parametrize("impl", KERNELS)
def test_one_token_page_build_returns_the_run_time_builds_bits(impl):
    """The TV_PAGE_SIZE=1 build reads the same rows as the build that reads the page size at run
    time (TV_PAGE_SIZE=0), so both return the same bits."""
    _needs_sm90(impl)
    x, _ = make_verify_inputs([5000, 0, 777], nodes=17, heads=8, page_size=1, seed=3, device="cuda")
    one = NativeTreeVerify(**x, scale=SCALE, impl=impl, defines={"TV_PAGE_SIZE": 1})
    run_time = NativeTreeVerify(**x, scale=SCALE, impl=impl, defines={"TV_PAGE_SIZE": 0})
    assert one.defines == {"TV_PAGE_SIZE": 1} and run_time.defines == {"TV_PAGE_SIZE": 0}
    (o1, l1), (o0, l0) = one.run(), run_time.run()
    assert torch.equal(o1, o0) and torch.equal(l1, l0)
    with pytest.raises(ValueError, match="TV_PAGE_SIZE=64, but kv_pool's pages hold 1 tokens"):
        NativeTreeVerify(**x, scale=SCALE, impl=impl, defines={"TV_PAGE_SIZE": 64})


@pytest.mark.gpu
def test_mask_bits_return_the_mask_bytes_bits():
    """The seesaw kernel's tree tiles masked from the packed bits (its default, both schedules) see
    the same keys as its TV_MASK_BITS=0 build's per-key mask loads, so both return the same bits,
    at trees of one to five 64-key tiles; only the build that reads the bits gets them; a NaN in a
    node's latents reaches the rows that see it, and no other row (a hidden key's score is dropped,
    NaN or not), as in the float64 reference."""
    _needs_sm90("wgmma_seesaw")
    schedules = ({}, {"TV_PAIR": 0})
    for lens, nodes, heads in (([5000, 0, 777], 17, 8), ([3000], 257, 8), ([100, 4096], 65, 16)):
        x, _ = make_verify_inputs(lens, nodes=nodes, heads=heads, page_size=1, seed=nodes, device="cuda")
        for d in schedules:
            bits = NativeTreeVerify(**x, scale=SCALE, impl="wgmma_seesaw", defines=d)
            loads = NativeTreeVerify(**x, scale=SCALE, impl="wgmma_seesaw", defines={**d, "TV_MASK_BITS": 0})
            assert bits.tree_bits is not None and loads.tree_bits is None
            o1, l1 = (t.clone() for t in bits.run())
            o0, l0 = loads.run()
            assert torch.equal(o1, o0) and torch.equal(l1, l0), (lens, nodes, heads, d)
    # a NaN score in a tree node's rope column reaches the rows that see the node, and no other
    x, _ = make_verify_inputs([2000], nodes=65, heads=8, page_size=1, seed=5)
    x["tree_kv"][0, 40, 540] = float("nan")
    ref_o, _ = tree_verify_attention_ref(**x, scale=SCALE)
    assert 0 < int(ref_o.isnan().any(-1).sum()) < ref_o.shape[1] * ref_o.shape[2]
    for d in (*schedules, {"TV_MASK_BITS": 0}):
        out, _ = NativeTreeVerify(
            **{k: v.cuda() for k, v in x.items()}, scale=SCALE, impl="wgmma_seesaw", defines=d
        ).run()
        assert torch.equal(out.cpu().isnan(), ref_o.isnan()), d


@pytest.mark.gpu
@pytest.mark.parametrize("spec", [*KERNELS.values(), MERGE], ids=lambda s: s.name)
def test_loaded_modules_export_the_registry_shape(spec):
    _needs_sm90(spec.name)
    loaded = kernels.load_kernel(spec)
    want = kernels.ptx_config(spec.source, defines=dict(spec.defines)) if HAS_NVCC else loaded.config.check(spec)
    assert loaded.config == want


# each kernel's rescale slack (log2 units; RESCALE_SLACK in its source) and a key scaling along
# the prefix that makes every row's max rise well past it within one split
LAZY_RESCALE = {"wgmma_seesaw": (8, 5), "wgmma_wide": (64, 40)}


@pytest.mark.gpu
@pytest.mark.parametrize("impl", sorted(LAZY_RESCALE))
def test_lazy_rescale_follows_a_rising_max(impl):
    """The wgmma kernels move each row's reference max only when it rises by more than their
    slack (online_softmax_lazy). Keys scaled up along the prefix make every row's max climb past
    it along one split (prefix_splits=1), so the reference moves mid-split, and the tree block
    (scaled the most) moves it again: the result must still match float64."""
    _needs_sm90(impl)
    slack, rise = LAZY_RESCALE[impl]
    x, _ = make_verify_inputs([9000, 3000], nodes=17, heads=8, page_size=16, seed=21, q_scale=1.0)
    pt, ps = x["page_table"], x["kv_pool"].shape[1]
    pool = x["kv_pool"].view(-1, x["kv_pool"].shape[-1])
    slots = [
        pt[b, torch.arange(n) // ps].long() * ps + torch.arange(n) % ps for b, n in enumerate(x["prefix_lens"].tolist())
    ]
    for sl in slots:  # key t of a request scaled by 1 + rise t / 9000
        pool[sl] *= (1 + rise * torch.arange(len(sl)) / 9000).to(torch.bfloat16)[:, None]
    x["tree_kv"] *= 7
    ref_o, ref_l = tree_verify_attention_ref(**x, scale=SCALE)
    s = (x["q"][0].float().reshape(-1, 576) @ pool[slots[0]].float().T) * SCALE * math.log2(math.e)  # log2 units
    first, whole = s[:, :64].amax(1), s.amax(1)
    assert float((whole - first).min()) > 2 * slack, "the max must rise past the slack after the first tile"
    op = NativeTreeVerify(**{k: v.cuda() for k, v in x.items()}, scale=SCALE, impl=impl, prefix_splits=1)
    assert op.plan.n_prefix_splits == 1
    out, lse = op.run()
    torch.cuda.synchronize()
    assert relative_error(out.cpu(), ref_o) < 1e-2
    assert relative_error(lse.cpu(), ref_l) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("splits", [3, 300, 1250])
def test_merge_past_its_shared_weight_buffer(splits, groups):
    """The merge keeps up to 1024 split weights in shared memory and recomputes the rest: 1250
    splits (one 32-key tile each) must merge as exactly as 250 or 3, with every split-group
    count (the launcher picks 1 or 4; 2 must work too). The short request has empty splits whose
    partials are poisoned (NaN) and must never be used."""
    x, _ = make_verify_inputs([40000, 100], nodes=3, heads=2, page_size=64, seed=8, device="cuda", q_scale=1.0)
    op = NativeTreeVerify(**x, scale=SCALE, impl="mma", prefix_splits=splits)
    assert (op.plan.splits > 1024) == (splits > 1024)
    merge = op._launches[1]
    op._launches = (
        op._launches[0],
        kernels.PreparedLaunch(merge.func, (*merge.grid[:2], groups), merge.block, merge.buf),
    )
    op.o_part.fill_(float("nan"))
    out, lse = op.run()
    torch.cuda.synchronize()
    ref_o, ref_l = tree_verify_attention_ref(**{k: v.cpu() for k, v in x.items()}, scale=SCALE)
    assert relative_error(out.cpu(), ref_o) < 1e-2
    assert relative_error(lse.cpu(), ref_l) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("impl", [*KERNELS, "auto"])
def test_native_runs_on_a_side_stream(impl):
    _needs_sm90(impl)
    x, _ = make_verify_inputs([3000, 17], nodes=9, heads=8, page_size=16, seed=5, device="cuda")
    ref_o, _ = tree_verify_attention_ref(**{k: v.cpu() for k, v in x.items()}, scale=SCALE)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        op = NativeTreeVerify(**x, scale=SCALE, impl=impl)
        out, _ = op.run()
        res = out.float() * 1  # consumer on the same stream must see the kernel's result
    torch.cuda.synchronize()
    assert relative_error(res, ref_o) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("impl", KERNELS)
def test_profiling_workload_runs_the_chosen_kernel_on_the_planned_grid(impl):
    from specdiag.probes.workloads import make_workload

    _needs_sm90(impl)
    run = make_workload("native", context=5000, heads=8, nodes=9, impl=impl)
    run()
    torch.cuda.synchronize()
    op = run.__self__
    spec = KERNELS[impl]
    p = plan_launch(
        72,
        9,
        5000,
        1,
        torch.cuda.get_device_properties(0).multi_processor_count,
        rows_per_cta=spec.rows_per_cta,
        bn=spec.keys_per_tile,
    )
    assert op.impl == impl and op.plan == p


@pytest.mark.gpu
def test_ablation_variants_run_on_the_gpu():
    """Every TV_SKIP build launches and finishes (a stage left out must not leave a barrier
    waiting); only the full build's time is the kernel's."""
    from specdiag.bench.ablation import VARIANTS, ablate

    for impl in ("wgmma_seesaw", "wgmma_wide"):
        _needs_sm90(impl)
        rows = ablate(shapes=((8192, 8, 9),), impl=impl, rep_ms=5.0, page_sizes=(1,), progress=lambda *_: None)
        assert [r["variant"] for r in rows] == list(VARIANTS) and rows[0]["vs_full"] == 1.0
        assert all(r["ms"] > 0 and r["page_size"] == 1 for r in rows)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", KERNELS)
def test_nan_in_used_inputs_reaches_the_rows_that_use_them(impl):
    """A NaN in a KV element every row attends to (latent or rope column of one prefix token of
    request 0), or in one query row, reaches exactly the outputs the float64 reference makes NaN,
    through several prefix splits and the merge; the other request stays finite and right."""
    _needs_sm90(impl)
    x, _ = make_verify_inputs([9000, 3000], nodes=9, heads=8, page_size=64, seed=11)
    pt, ps = x["page_table"], x["kv_pool"].shape[1]
    cases = []
    for col in (100, 540):  # a V (latent) column, and a rope column: NaN scores
        y = {k: v.clone() for k, v in x.items()}
        tok = 4321
        y["kv_pool"][pt[0, tok // ps], tok % ps, col] = float("nan")
        cases.append(y)
    y = {k: v.clone() for k, v in x.items()}
    y["q"][0, 3, 5, 7] = float("nan")  # one query row: NaN in every split of that row
    cases.append(y)
    for y in cases:
        ref_o, ref_l = tree_verify_attention_ref(**y, scale=SCALE)
        op = NativeTreeVerify(**{k: v.cuda() for k, v in y.items()}, scale=SCALE, impl=impl, prefix_splits=4)
        assert op.plan.n_prefix_splits > 1
        out, lse = (t.cpu() for t in op.run())
        assert torch.equal(out.isnan(), ref_o.isnan()) and bool(ref_o.isnan().any())
        assert torch.equal(lse.isnan(), ref_l.isnan())
        assert relative_error(out[1], ref_o[1]) < 1e-2


def test_session46_chain_table_is_the_recorded_pair_trace():
    """The forty-sixth session's table (docs/kernel_notes.md): warpgroup 1's Q K^T (b) chain at 32k
    x 8 x 257, the medians of data/history/session45_h100.json's pair trace."""
    runs = _h100_session(45)
    cyc = next(r for r in runs["run1_trace_257"]["runs"] if r["defines"].get("TV_PAIR") == 1 and r["context"] == 32768)[
        "median_cycles"
    ]
    keys = ("w0.prev_pv_done", "ld.issued_l1", "w1.late_in", "w1.qk_done")
    got = [f"{round(cyc[k]):,}" for k in keys]
    assert got == ["1,083", "1,338", "2,349", "3,282"]
    section = (ROOT / "docs" / "kernel_notes.md").read_text().split("### The forty-sixth session")[1].split("### ")[0]
    for v in got:
        assert f"| {v} |" in section, v
