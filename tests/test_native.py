"""Native CUDA kernel: nvcc compile checks (CPU, needs nvcc), launch planning, GPU correctness."""

import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch

from specdiag import kernels
from specdiag.attention import make_verify_inputs, relative_error, tree_verify_attention_ref
from specdiag.attention.native import BN, CTA_OVERHEAD_TILES, HOPPER_IMPLS, NativeTreeVerify, plan_launch, plan_makespan, resolve_impl, smem_bytes

HAS_NVCC = shutil.which("nvcc") is not None
SCALE = 1 / math.sqrt(192)


def test_sources_are_shipped():
    assert "tree_verify_mla" in kernels.kernel_names()
    assert "TV_INSTANTIATE(4)" in kernels.kernel_source("tree_verify_mla")
    with pytest.raises(FileNotFoundError, match="no CUDA source"):
        kernels.kernel_source("nope")


def test_kernel_source_pastes_the_projects_own_headers(tmp_path, monkeypatch):
    for name in ("tree_verify_mla", "tree_verify_mla_wgmma", "tree_verify_mla_ws"):
        src = kernels.kernel_source(name)  # what pycuda compiles: no include path needed
        assert src.count("struct SplitWork") == 1 and '#include "tree_verify_common.cuh"' not in src
        assert name == "tree_verify_mla" or (src.count("namespace tvg {") == 1 and '#include "tree_verify_wgmma.cuh"' not in src)
    (tmp_path / "h.cuh").write_text('#pragma once\n#include "g.cuh"\nint from_h;\n')
    (tmp_path / "g.cuh").write_text("int from_g;\n")
    (tmp_path / "k.cu").write_text('#include <stdint.h>\n#include "h.cuh"\n#include "g.cuh"\n#include "elsewhere.h"\nint k;\n')
    monkeypatch.setattr(kernels, "_kernel_dir", lambda: tmp_path)
    src = kernels.kernel_source("k")
    assert src.count("int from_g;") == 1 and src.count("int from_h;") == 1  # each header once
    assert "#include <stdint.h>" in src and '#include "elsewhere.h"' in src  # not ours: left alone
    assert "pragma once" not in src
    assert kernels.kernel_names() == ["k"]


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH")
@pytest.mark.parametrize("name", kernels.kernel_names())
def test_compiles_for_sm90_without_spills(name):
    funcs = kernels.nvcc_check(name)  # sm_90, or sm_90a where the source says so
    assert funcs, "ptxas reported no kernels"
    for f in funcs.values():
        assert not f.spills, f"{f.name} spills: {f}"
        assert f.stack_frame == 0, f"{f.name} uses a stack frame (local memory): {f}"
        assert f.registers <= 255
        assert not f.wgmma_serialized, f"ptxas serialized {f.name}'s wgmma pipeline"


@pytest.mark.skipif(not HAS_NVCC or kernels.find_cuobjdump() is None, reason="needs nvcc and cuobjdump")
def test_sass_uses_tensor_cores_and_async_copies():
    sass = kernels.sass("tree_verify_mla", arch="sm_90")
    assert "HMMA.16816.F32.BF16" in sass  # mma.sync m16n8k16 bf16 -> fp32
    assert "LDGSTS.E.BYPASS.128" in sass  # 16-byte cp.async.cg
    assert "LDSM.16.MT88.4" in sass  # transposed ldmatrix for V
    assert "LDL" not in sass and "STL" not in sass  # no local-memory traffic


@pytest.mark.skipif(not HAS_NVCC or kernels.find_cuobjdump() is None, reason="needs nvcc and cuobjdump")
def test_wgmma_kernel_sass_uses_warpgroup_mma():
    sass = kernels.sass("tree_verify_mla_wgmma")
    assert "HGMMA.64x32x16.F32.BF16" in sass  # S = Q K^T, both operands from shared memory
    assert "HGMMA.64x256x16.F32.BF16" in sass  # O += P V, P from registers
    assert "LDGSTS.E.BYPASS.128" in sass
    assert "LDL" not in sass and "STL" not in sass


@pytest.mark.skipif(not HAS_NVCC or kernels.find_cuobjdump() is None, reason="needs nvcc and cuobjdump")
def test_ws_kernel_sass_uses_warpgroup_mma_and_named_barriers():
    sass = kernels.sass("tree_verify_mla_ws")
    assert "HGMMA.64x32x16.F32.BF16" in sass  # S = Q K^T (warpgroup 0)
    assert "HGMMA.64x256x16.F32.BF16" in sass  # O += P V (both; warpgroup 1 with P from shared memory)
    assert "LDGSTS.E.BYPASS.128" in sass  # warpgroup 1's tile loads
    assert "BAR.ARV" in sass and "BAR.SYNC" in sass  # the warpgroups' named barriers
    assert "LDL" not in sass and "STL" not in sass


@pytest.mark.skipif(not HAS_NVCC or kernels.find_cuobjdump() is None, reason="needs nvcc and cuobjdump")
def test_transposed_kernel_sass_uses_warpgroup_mma_with_query_rows_in_n():
    sass = kernels.sass("tree_verify_mla_t")
    assert "HGMMA.64x40x16.F32.BF16" in sass  # S^T = K Q^T and O^T += V^T P^T: N = 40 query rows
    assert "HGMMA.64x32x16" not in sass and "HGMMA.64x256x16" not in sass  # no product with query rows in M
    assert "LDGSTS.E.BYPASS.128" in sass and "BAR.ARV" in sass and "BAR.SYNC" in sass
    assert "LDL" not in sass and "STL" not in sass


def test_kernel_targets():
    assert kernels.kernel_arch("tree_verify_mla") == "sm_90"
    assert kernels.kernel_arch("tree_verify_mla_wgmma") == "sm_90a"
    assert kernels.kernel_arch("tree_verify_mla_ws") == "sm_90a"
    assert kernels.kernel_arch("tree_verify_mla_t") == "sm_90a"
    assert kernels.kernel_arch("tree_verify_mla_seesaw") == "sm_90a"
    assert kernels.arch_flags("sm_90") == ["-arch=sm_90"]
    assert kernels.arch_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    with pytest.raises(ValueError, match="unknown target"):
        kernels.arch_flags("hopper")


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH")
def test_wgmma_kernel_needs_sm90a():
    with pytest.raises(RuntimeError, match=r"nvcc failed for tree_verify_mla_wgmma\.cu \(sm_90\)"):
        kernels.nvcc_check("tree_verify_mla_wgmma", arch="sm_90")


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not on PATH")
def test_wgmma_layout_arithmetic_on_cpu(tmp_path):
    """tests/cuda/wgmma_layout_check.cu: the kernel's own load and descriptor helpers against
    the PTX canonical layouts, compiled as a host program and run here (no GPU needed)."""
    src = Path(__file__).parent / "cuda" / "wgmma_layout_check.cu"
    exe = tmp_path / "layout_check"
    build = subprocess.run(["nvcc", *kernels.arch_flags("sm_90a"), "-std=c++17", "-O1", "-o", str(exe), str(src)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "all checks passed" in run.stdout


@pytest.mark.parametrize("name, impl", [("tree_verify_mla_wgmma", "wgmma"), ("tree_verify_mla_ws", "wgmma_ws"), ("tree_verify_mla_ws64", "wgmma_ws64"), ("tree_verify_mla_seesaw", "wgmma_seesaw"), ("tree_verify_mla_t", "wgmma_t")])
def test_wgmma_smem_matches_the_source(name, impl):
    import re

    from specdiag.attention.native import T_BN, T_ROWS, T_STAGES, WS64_BN, WS_STAGES

    src = kernels.kernel_source(name)
    assert f"// {smem_bytes(4, impl)} = specdiag.attention.native.smem_bytes(4, \"{impl}\")" in src
    assert smem_bytes(4, impl) <= 227 * 1024
    stages = re.search(r"constexpr int STAGES = (\d+);", src)
    if impl == "wgmma_t":
        assert re.search(r"constexpr int BN = (\d+);", src).group(1) == str(T_BN)
        assert re.search(r"constexpr int NQ = (\d+);", src).group(1) == str(T_ROWS)
        assert f"tree_verify_partial_t{T_ROWS}(" in src
        assert stages.group(1) == str(T_STAGES)
        return
    if impl == "wgmma_ws64":
        assert re.search(r"constexpr int BN = (\d+);", src).group(1) == str(WS64_BN)
        assert stages.group(1) == "2" and "tree_verify_partial_ws64(" in src
        return
    if impl == "wgmma_seesaw":  # two math warpgroups and a loader: the launch's block size
        from specdiag.attention.native import SEESAW_THREADS

        assert re.search(r"constexpr int BN = (\d+);", src).group(1) == str(WS64_BN)
        assert re.search(r"constexpr int NT = 3 \* WG;", src) and re.search(r"constexpr int WG = (\d+);", src).group(1) == str(SEESAW_THREADS // 3)
        assert stages.group(1) == "2" and "tree_verify_partial_seesaw(" in src
        return
    assert re.search(r"constexpr int BN = (\d+);", src).group(1) == str(BN)
    if impl == "wgmma_ws":
        assert stages.group(1) == str(WS_STAGES)


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


@pytest.mark.parametrize("tiles", [{}, {"cta_rows": 40, "bn": 64}])  # the mma / wgmma / ws kernels, wgmma_t
@pytest.mark.parametrize("rows, nodes, prefix, batch", [(72, 9, 185000, 1), (16448, 257, 185000, 1), (8, 1, 0, 1), (520, 65, 33, 3), (2048, 1024, 4096, 2)])
def test_plan_covers_every_tile_once(rows, nodes, prefix, batch, tiles):
    plan = plan_launch(rows, nodes, prefix, batch, num_sms=132, **tiles)
    bn = tiles.get("bn", BN)
    assert plan.bn == bn and plan.rows_per_cta == tiles.get("cta_rows", 16 * plan.rg)
    prefix_tiles = math.ceil(prefix / bn)
    covered = sorted(t for s in range(plan.n_prefix_splits) for t in range(s * plan.prefix_tiles_per_split, min((s + 1) * plan.prefix_tiles_per_split, prefix_tiles)))
    assert covered == list(range(prefix_tiles))
    tree_tiles = math.ceil(nodes / bn)
    covered = sorted(t for s in range(plan.n_tree_splits) for t in range(s * plan.tree_tiles_per_split, min((s + 1) * plan.tree_tiles_per_split, tree_tiles)))
    assert covered == list(range(tree_tiles))
    assert plan.m_tiles * plan.rows_per_cta >= rows > (plan.m_tiles - 1) * plan.rows_per_cta
    assert smem_bytes(plan.rg) <= 227 * 1024


def test_makespan_model_reproduces_the_recorded_tuning_run():
    """plan_makespan's fitted CTA cost against data/native_tune_h200.json: for each shape, the
    measured time ratios between 1, 2 and 4 waves of splits match the model's within 5%."""
    tune = json.loads((Path(__file__).resolve().parents[1] / "data" / "native_tune_h200.json").read_text())
    groups = {}
    for r in tune["rows"]:
        if r["rg"] != 4:
            continue
        m = math.ceil(r["heads"] * r["nodes"] / 64)
        p = plan_launch(r["heads"] * r["nodes"], r["nodes"], r["context"], 1, 132, rg=4, prefix_splits=max(1, math.ceil(r["waves"] * 132 / m)))
        assert p.splits == r["splits"]  # the plan the run timed
        est = plan_makespan(p.m_tiles, math.ceil(r["context"] / BN), p.prefix_tiles_per_split, p.m_tiles * p.n_tree_splits, p.tree_tiles_per_split, 132)
        groups.setdefault((r["context"], r["heads"], r["nodes"]), []).append((r["ms"], est))
    assert len(groups) == 3
    for rows in groups.values():
        ms0, est0 = rows[0]
        for ms, est in rows:
            assert abs(ms / ms0 - est / est0) < 0.05, (rows, ms, est)


@pytest.mark.parametrize("ctx, heads, nodes", [(185000, 8, 9), (185000, 8, 65), (185000, 64, 9), (185000, 64, 65), (185000, 64, 257), (32768, 8, 257), (4096, 8, 65)])
def test_plan_fills_whole_waves(ctx, heads, nodes):
    """The chosen split count keeps the estimated time within 10% of the work spread evenly over
    the SMs plus one CTA's fixed cost (ceil(132 / 9) = 15 splits of 9 query tiles used to spill
    3 CTAs into a second wave and take 1.96x that)."""
    p = plan_launch(heads * nodes, nodes, ctx, 1, 132)
    tiles = math.ceil(ctx / BN)
    est = plan_makespan(p.m_tiles, tiles, p.prefix_tiles_per_split, p.m_tiles * p.n_tree_splits, p.tree_tiles_per_split, 132)
    ideal = p.m_tiles * tiles / 132 + CTA_OVERHEAD_TILES
    assert est <= 1.1 * ideal, (p, est, ideal)


def test_ws_lookahead_follows_the_measured_rule():
    """Two Q K^T ahead from 3 query tiles on (the H200 run: 2 tiles faster with 1, >= 9 with 2)."""
    from specdiag.attention.native import WS_LOOKAHEAD_MIN_TILES, ws_lookahead

    assert WS_LOOKAHEAD_MIN_TILES == 3
    assert ws_lookahead(plan_launch(72, 9, 185000, 1, 132)) == 1  # 2 query tiles
    assert ws_lookahead(plan_launch(520, 65, 185000, 1, 132)) == 2  # 9
    assert ws_lookahead(plan_launch(129, 1, 4096, 1, 132)) == 2  # 3
    assert ws_lookahead(plan_launch(128, 1, 4096, 1, 132)) == 1  # 2


def test_kernel_arguments_are_packed_from_numpy_scalars():
    """The prepared launch packs each argument by its numpy type (pycuda's struct codes: 'L'
    for a 64-bit pointer, 'i' int32, 'f' float32); anything else is refused, since a Python int
    or a tensor would have no defined width."""
    np = pytest.importorskip("numpy")
    assert kernels.arg_format((np.uintp(1), np.int32(2), np.float32(3.0))) == np.dtype(np.uintp).char + "if"
    assert kernels.arg_format(()) == ""
    with pytest.raises(TypeError, match="#1 is a int"):
        kernels.arg_format((np.uintp(1), 7))
    with pytest.raises(TypeError, match="#0 is a Tensor"):
        kernels.arg_format((torch.zeros(1),))


def test_merge_groups_rule():
    from specdiag.attention.native import MERGE_GROUPS_MIN_SPLITS, merge_groups

    assert [merge_groups(n) for n in (1, 3, MERGE_GROUPS_MIN_SPLITS - 1, MERGE_GROUPS_MIN_SPLITS, 65, 2000)] == [1, 1, 1, 4, 4, 4]
    with pytest.raises(ValueError, match=">= 1"):
        merge_groups(0)


def test_swapping_the_partial_kernel_drops_the_prepared_launches():
    """The ablation swaps ``_partial`` on live ops; the launches prepared for the old function
    must not survive it (they would silently time the wrong kernel)."""
    op = NativeTreeVerify.__new__(NativeTreeVerify)
    op._launches = ("prepared for the old kernel",)
    op._partial = "variant"
    assert op._launches is None and op._partial == "variant"


def test_plan_rejects_bad_arguments():
    with pytest.raises(ValueError):
        plan_launch(10, 1, 100, 1, 132, rg=3)
    with pytest.raises(ValueError):
        plan_launch(0, 1, 100, 1, 132)
    with pytest.raises(ValueError, match="prefix_splits"):
        plan_launch(10, 1, 100, 1, 132, prefix_splits=0)


def test_native_rejects_bad_impl_choices():
    x, _ = make_verify_inputs([10], nodes=3, heads=2, page_size=4)
    with pytest.raises(ValueError, match="impl must be 'auto' or one of"):
        NativeTreeVerify(**x, scale=SCALE, impl="tcgen05")
    with pytest.raises(ValueError, match="64 query rows"):
        NativeTreeVerify(**x, scale=SCALE, impl="wgmma", rg=2)
    with pytest.raises(ValueError, match="tma=True needs the wgmma kernel"):
        NativeTreeVerify(**x, scale=SCALE, impl="mma", tma=True)
    with pytest.raises(ValueError, match="the wgmma_ws kernel loads with cp.async only"):
        NativeTreeVerify(**x, scale=SCALE, impl="wgmma_ws", tma=True)
    with pytest.raises(ValueError, match="wgmma_ws kernel always takes 64 query rows"):
        NativeTreeVerify(**x, scale=SCALE, impl="wgmma_ws", rg=1)
    with pytest.raises(ValueError, match="wgmma_t kernel always takes 40 query rows"):
        NativeTreeVerify(**x, scale=SCALE, impl="wgmma_t", rg=2)
    with pytest.raises(ValueError, match="lookahead is an option of the wgmma_ws kernel, not of 'wgmma_t'"):
        NativeTreeVerify(**x, scale=SCALE, impl="wgmma_t", lookahead=1)
    with pytest.raises(ValueError, match="lookahead must be 1 or 2"):
        NativeTreeVerify(**x, scale=SCALE, impl="wgmma_ws", lookahead=3)
    with pytest.raises(ValueError, match="lookahead is an option of the wgmma_ws kernel, not of 'wgmma'"):
        NativeTreeVerify(**x, scale=SCALE, impl="wgmma", lookahead=2)


def test_auto_picks_wgmma_seesaw_on_sm90_only(monkeypatch):
    for cap, rg, want in [((9, 0), None, "wgmma_seesaw"), ((9, 0), 4, "wgmma_seesaw"), ((9, 0), 2, "mma"), ((8, 0), None, "mma"), ((10, 0), None, "mma"), ((12, 0), None, "mma")]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        assert resolve_impl("auto", None, rg) == want, (cap, rg)
        if want == "wgmma_seesaw":  # short prefixes keep the wgmma kernel (its fixed cost is lower)
            assert resolve_impl("auto", None, rg, max_prefix=4095) == "wgmma"
            assert resolve_impl("auto", None, rg, max_prefix=4096) == "wgmma_seesaw"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    # by query rows: wgmma_seesaw for up to 64 from a 64k prefix, for 65-80 from 32k and for more
    # rows from 4k (from 2048 rows at any prefix), wgmma below; never wgmma_ws, _ws64 or _t
    for rows, prefix, want in [(72, 32767, "wgmma"), (72, 32768, "wgmma_seesaw"), (80, 185000, "wgmma_seesaw"), (40, 65535, "wgmma"), (40, 65536, "wgmma_seesaw"), (64, 65535, "wgmma"), (64, 65536, "wgmma_seesaw"), (1, 185000, "wgmma_seesaw"), (1, 32768, "wgmma"),
                               (81, 185000, "wgmma_seesaw"), (520, 4096, "wgmma_seesaw"), (520, 4095, "wgmma"), (2047, 1024, "wgmma"), (2048, 1024, "wgmma_seesaw"), (16448, 0, "wgmma_seesaw")]:
        assert resolve_impl("auto", None, None, max_prefix=prefix, rows=rows) == want, (rows, prefix)
    assert resolve_impl("auto", None, None, rows=72) == "wgmma"  # prefix unknown: the short-prefix choice
    assert resolve_impl("auto", None, 2, max_prefix=185000, rows=72) == "mma"
    assert resolve_impl("mma", None) == "mma" and resolve_impl("wgmma", None) == "wgmma"
    with pytest.raises(ValueError, match="impl must be"):
        resolve_impl("fastest", None)


def test_native_rejects_non_bf16_and_cpu_tensors():
    x, _ = make_verify_inputs([10], nodes=3, heads=2, page_size=4, dtype=torch.float32)
    with pytest.raises(ValueError, match="bf16"):
        NativeTreeVerify(**x, scale=SCALE)
    x, _ = make_verify_inputs([10], nodes=3, heads=2, page_size=4)
    with pytest.raises(ValueError, match="CUDA device"):
        NativeTreeVerify(**x, scale=SCALE)


def test_wheel_ships_the_cuda_sources(tmp_path):
    root = Path(__file__).resolve().parents[1]
    # build offline where setuptools is already installed (GPU machines have no network)
    offline = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *offline, "-q", "-w", str(tmp_path), str(root)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("specdiag-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "specdiag/_cu/tree_verify_mla.cu" in names
    assert "specdiag/_cu/tree_verify_mla_wgmma.cu" in names
    assert "specdiag/_cu/tree_verify_mla_ws.cu" in names
    assert "specdiag/_cu/tree_verify_wgmma.cuh" in names
    assert "specdiag/_cu/tree_verify_common.cuh" in names
    assert "specdiag/attention/native.py" in names


def test_tma_maps_are_checked_before_the_driver_sees_them():
    from specdiag import tma

    m = tma.token_rows_map(1 << 20, rows=4096, row_bytes=1152, box_rows=BN)
    assert m.dims == (64, 9, 4096) and m.strides == (128, 1152) and m.box == (64, 1, BN)
    tma.check_tiled(m)  # the kernel's own map is valid
    bad = {
        "16-byte aligned": dict(address=(1 << 20) + 8),
        "multiple of 16": dict(strides=(128, 1160)),
        "1..256": dict(box=(64, 1, 300)),
        "at most 128 bytes": dict(box=(128, 1, 32)),
        "2 strides and 3 box": dict(strides=(128,)),
        "outside 1..2\\^32": dict(dims=(64, 9, 0)),
    }
    for msg, change in bad.items():
        with pytest.raises(ValueError, match=msg):
            tma.check_tiled(tma.TiledMap(**{**m.__dict__, **change}))
    with pytest.raises(ValueError, match="multiple of 128 bytes"):
        tma.token_rows_map(1 << 20, rows=10, row_bytes=1000, box_rows=32)


def test_poisoning_unused_pool_slots_leaves_the_reference_unchanged():
    """check_native fills every pool slot no prefix uses with NaN: the reference (which reads
    only used slots) must not change, and the partial last pages and spare pages are hit."""
    from specdiag.bench import poison_unused_slots

    x, _ = make_verify_inputs([1000, 33, 0], nodes=5, heads=2, page_size=64, seed=3)
    ref_o, ref_l = tree_verify_attention_ref(**x, scale=SCALE)
    n = poison_unused_slots(x["kv_pool"], x["page_table"], x["prefix_lens"])
    used = 1000 + 33
    assert n == x["kv_pool"].shape[0] * 64 - used
    assert int(torch.isnan(x["kv_pool"]).any(-1).sum()) == n
    o, l = tree_verify_attention_ref(**x, scale=SCALE)
    assert torch.equal(o, ref_o) and torch.equal(l, ref_l)


# ---------------------------------------------------------------- GPU only


def _needs_sm90(impl):
    if impl in HOPPER_IMPLS and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"the {impl} kernel is built for sm_90a only")


@pytest.mark.gpu
@pytest.mark.parametrize("impl, tma, lookahead", [("mma", False, None), ("wgmma", False, None), ("wgmma", True, None), ("wgmma_ws", False, 1), ("wgmma_ws", False, 2), ("wgmma_ws64", False, None), ("wgmma_seesaw", False, None), ("wgmma_t", False, None)])
def test_native_matches_float64_reference_on_gpu(impl, tma, lookahead):
    from specdiag.bench import check_native

    _needs_sm90(impl)
    results = check_native(seed=int(torch.randint(0, 10_000, (1,))), impl=impl, tma=tma, lookahead=lookahead)
    assert len(results) >= 11
    for r in results:
        assert r["all_written"], r
        assert r["rel_err_out"] < 1e-2, r
        assert r["rel_err_lse"] < 1e-3, r
        assert r["poisoned_slots"] > 0, r  # every case has spare pages
        # TMA loads the tree block always, the prefix where a 32-key tile stays in one page
        want = (["prefix"] if r["page_size"] % BN == 0 else []) + ["tree"] if impl == "wgmma" and tma else []
        assert r["tma_parts"] == want, r
        assert r["lookahead"] == lookahead, r


@pytest.mark.gpu
@pytest.mark.parametrize("impl, lookahead", [("wgmma_ws", 1), ("wgmma_ws", 2), ("wgmma_ws64", None), ("wgmma_seesaw", None), ("wgmma_t", None)])
def test_lazy_rescale_follows_a_rising_max(impl, lookahead):
    """The ws and transposed kernels move each row's reference max only when it rises by more than 2^8
    (online_softmax_lazy). Keys scaled up along the prefix make every row's max climb by tens
    of log2 units along one split (prefix_splits=1), so the reference moves several times
    mid-split, and the tree block (scaled the most) moves it again: the result must still match
    float64."""
    _needs_sm90(impl)
    x, _ = make_verify_inputs([9000, 3000], nodes=17, heads=8, page_size=16, seed=21, q_scale=1.0)
    pt, ps = x["page_table"], x["kv_pool"].shape[1]
    pool = x["kv_pool"].view(-1, x["kv_pool"].shape[-1])
    slots = [pt[b, torch.arange(n) // ps].long() * ps + torch.arange(n) % ps for b, n in enumerate(x["prefix_lens"].tolist())]
    for sl in slots:  # key t of a request scaled by 1 + 5 t / 9000
        pool[sl] *= (1 + 5 * torch.arange(len(sl)) / 9000).to(torch.bfloat16)[:, None]
    x["tree_kv"] *= 7
    ref_o, ref_l = tree_verify_attention_ref(**x, scale=SCALE)
    s = (x["q"][0].float().reshape(-1, 576) @ pool[slots[0]].float().T) * SCALE * math.log2(math.e)  # log2 units
    first, whole = s[:, :32].amax(1), s.amax(1)
    assert float((whole - first).min()) > 8, "the max must rise past the slack after the first tile"
    # one prefix split: a single CTA walks the whole ramp (planned splits would each see ~2 units)
    op = NativeTreeVerify(**{k: v.cuda() for k, v in x.items()}, scale=SCALE, impl=impl, prefix_splits=1, lookahead=lookahead)
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
    op._merge_grid = (*op._merge_grid[:2], groups)
    op.o_part.fill_(float("nan"))
    out, lse = op.run()
    torch.cuda.synchronize()
    ref_o, ref_l = tree_verify_attention_ref(**{k: v.cpu() for k, v in x.items()}, scale=SCALE)
    assert relative_error(out.cpu(), ref_o) < 1e-2
    assert relative_error(lse.cpu(), ref_l) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["mma", "wgmma", "wgmma_ws", "wgmma_ws64", "wgmma_seesaw", "wgmma_t", "auto"])
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
@pytest.mark.parametrize("impl", ["mma", "wgmma", "wgmma_ws", "wgmma_ws64", "wgmma_seesaw", "wgmma_t"])
def test_profiling_workload_runs_the_chosen_kernel_on_the_planned_grid(impl):
    from specdiag.probes.workloads import make_workload

    _needs_sm90(impl)
    run = make_workload("native", context=5000, heads=8, nodes=9, impl=impl)
    run()
    torch.cuda.synchronize()
    op = run.__self__
    tiles = dict(cta_rows=40, bn=64) if impl == "wgmma_t" else dict(bn=64) if impl in ("wgmma_ws64", "wgmma_seesaw") else {}
    p = plan_launch(72, 9, 5000, 1, torch.cuda.get_device_properties(0).multi_processor_count, rg=4 if impl != "mma" else None, **tiles)
    assert op.impl == impl and op.plan == p


@pytest.mark.skipif(not HAS_NVCC or kernels.find_cuobjdump() is None, reason="needs nvcc and cuobjdump")
@pytest.mark.parametrize("kernel, func, extra", [("tree_verify_mla_wgmma", "tree_verify_partial_wgmma", {"no_exchange"}), ("tree_verify_mla_ws", "tree_verify_partial_ws", {"no_rescale", "eager"}), ("tree_verify_mla_seesaw", "tree_verify_partial_seesaw", set())])
def test_ablation_variants_apply_and_drop_their_stage(kernel, func, extra):
    """bench.ablation_variants edits a Hopper kernel's source text; each edit must still match
    the source (else it raises) and compile, and the variants without matrix multiplies must
    lose them."""
    from specdiag.bench import ablation_variants

    variants = ablation_variants(kernel)
    assert set(variants) == {"full", "no_qk", "no_pv", "no_softmax", "no_loads", "no_mma", "loads_only"} | extra
    assert variants["full"] == kernels.kernel_source(kernel)
    assert len(set(variants.values())) == len(variants)
    for name in ("no_qk", "no_mma", "loads_only"):
        f = kernels.nvcc_check(kernel, source=variants[name])[func]
        assert not f.spills and f.stack_frame == 0 and not f.wgmma_serialized  # (a serialised variant times ptxas, not the stage)
    with tempfile.TemporaryDirectory() as td:
        src = Path(td) / "no_mma.cu"
        src.write_text(variants["no_mma"])
        cubin = Path(td) / "k.cubin"
        subprocess.run(["nvcc", *kernels.arch_flags("sm_90a"), "-cubin", "-O3", "-o", str(cubin), str(src)], check=True, capture_output=True)
        dump = subprocess.run([kernels.find_cuobjdump(), "--dump-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    # (ptxas keeps empty commit groups as null HGMMA.64x8x16 on RZ; the real shapes must be gone)
    assert set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", dump)) <= {"64x8x16"} and "LDGSTS" in dump
    with pytest.raises(ValueError, match="no ablations"):
        ablation_variants("tree_verify_mla")


def test_merge_ablation_replaces_one_kernels_rows_and_keeps_the_others():
    """``bench ablate --append`` merges one kernel's run into the recorded file: that kernel's
    (and entry point's) rows are replaced, every other kernel's stay, and ``runs`` names the
    machine of each."""
    from specdiag.bench import merge_ablation

    row = lambda impl, variant, ms, la=None: dict(impl=impl, lookahead=la, context=65536, heads=64, nodes=257, variant=variant, ms=ms)  # noqa: E731
    old = {"kind": "native_ablation", "machine": {"gpu": "A"}, "rows": [row("wgmma", "full", 7.0), row("wgmma_ws", "full", 5.0, 1), row("wgmma_ws", "full", 5.5, 2)]}
    doc = merge_ablation(old, [row("wgmma_ws", "full", 4.0, 2), row("wgmma_ws", "no_qk", 3.0, 2)], {"gpu": "B"})
    assert doc["runs"] == {"wgmma": {"gpu": "A"}, "wgmma_ws_la2": {"gpu": "B"}}  # (a file from before "runs": its machine is v4's)
    assert sorted((r["impl"], r["lookahead"], r["ms"]) for r in doc["rows"]) == [("wgmma", None, 7.0), ("wgmma_ws", 1, 5.0), ("wgmma_ws", 2, 3.0), ("wgmma_ws", 2, 4.0)]
    doc = merge_ablation(doc, [row("wgmma_seesaw", "full", 4.3)], {"gpu": "C"})
    assert set(doc["runs"]) == {"wgmma", "wgmma_ws_la2", "wgmma_seesaw"} and len(doc["rows"]) == 5
    assert merge_ablation(None, [row("wgmma_seesaw", "full", 4.3)], {"gpu": "C"})["runs"] == {"wgmma_seesaw": {"gpu": "C"}}
    with pytest.raises(ValueError, match="one kernel"):
        merge_ablation(old, [row("wgmma", "full", 1.0), row("wgmma_seesaw", "full", 1.0)], {})
    with pytest.raises(ValueError, match="not an ablation"):
        merge_ablation({"kind": "context_sweep", "rows": []}, [row("wgmma", "full", 1.0)], {})
