"""Kernel variants and the per-tile trace: parsing, the bench modes' input errors, the trace's
interval arithmetic (CPU), the traced build (nvcc), and both on the GPU."""

from __future__ import annotations

import numpy as np
import pytest

from specdiag import kernels
from specdiag.attention.registry import KERNELS
from specdiag.bench.__main__ import main as bench_main
from specdiag.bench.trace import (
    EVENTS,
    KERNEL_EVENTS,
    TRACE_CTAS,
    TRACE_IMPLS,
    TRACE_SLOTS,
    TRACE_TILES,
    WIDE_EVENTS,
    cta0_clock,
    cta_summary,
    cta_timeline,
    intervals,
    phases,
    summarize,
    wide_clock,
    wide_intervals,
)
from specdiag.bench.variants import parse_shapes, parse_variants


def test_check_switches_names_the_kernels_own_defines_only():
    from specdiag.bench.variants import check_switches

    check_switches("wgmma_seesaw", [{"TV_SKIP": 1}, {"TV_TRACE": 1}])
    check_switches("mma_small", [{"TV_MMA_KEYS": 16}])
    with pytest.raises(ValueError, match="TV_SKIPP is not a switch of kernels/tree_verify_seesaw.cu"):
        check_switches("wgmma_seesaw", [{"TV_SKIPP": 1}])
    with pytest.raises(ValueError, match="impl must be one of"):
        check_switches("nope", [{"TV_SKIP": 1}])


def test_parse_variants():
    assert parse_variants("TV_A=1; TV_A=2,TV_B=-3") == [{"TV_A": 1}, {"TV_A": 2, "TV_B": -3}]
    for bad in ("", ";", "TV_A", "TV_A=x", "1A=2", "TV_A=1,=2"):
        with pytest.raises(ValueError):
            parse_variants(bad)


def test_parse_shapes():
    """The one parser of CONTEXTxHEADSxNODES lists (bench --shapes, the stalls launcher, the ncu and
    timeline tools): three integers each, one line of error otherwise."""
    assert parse_shapes("32768x8x257,185000X128x65") == [(32768, 8, 257), (185000, 128, 65)]
    for bad in ("", "32768x8", "1x2x3x4", "ax8x9", "32768x8x9,"):
        with pytest.raises(ValueError, match="each shape is CONTEXTxHEADSxNODES"):
            parse_shapes(bad)


def test_seesaw_traces_refuse_the_other_schedule():
    from specdiag.bench.trace import trace_pairs, trace_seesaw

    with pytest.raises(ValueError, match="TV_PAIR must be 0"):
        trace_seesaw(32768, 8, 9, defines={"TV_PAIR": 1})
    with pytest.raises(ValueError, match="TV_PAIR=0 is trace_seesaw's"):
        trace_pairs(32768, 8, 9, defines={"TV_PAIR": 0})


def test_pair_timeline_puts_each_role_after_warpgroup_0s_top():
    """pair_timeline: every role's events of pair i as cycles after warpgroup 0's loop top of pair
    i, the period per tile from one top to the next, and an unrecorded event NaN."""
    from specdiag.bench.trace import PAIR_EVENTS, pair_timeline

    raw = np.zeros((3, TRACE_TILES, TRACE_SLOTS), dtype=np.uint64)
    tops = 10_000 + 5000 * np.arange(4)  # four pairs, 2,500 cycles a tile
    for who, names in enumerate(PAIR_EVENTS):
        for slot in range(len(names)):
            raw[who, :4, slot] = tops + 100 * slot - (3000 if who == 2 else 0)  # the loader a pair ahead
    raw[1, 2, PAIR_EVENTS[1].index("max_in")] = 0  # not recorded
    tl = pair_timeline(raw, n_tiles=7)  # 7 tiles: 4 pairs, the last one short
    assert tl["w0.top"].tolist() == [0, 0, 0, 0]
    assert tl["w1.pv_done"].tolist() == [700] * 4 and tl["ld.free_e0"].tolist() == [-2900] * 4
    assert np.isnan(tl["w1.max_in"][2]) and tl["w1.max_in"][1] == 200
    assert tl["period"][:3].tolist() == [2500, 2500, 2500] and np.isnan(tl["period"][3])
    assert len(tl) == sum(len(n) for n in PAIR_EVENTS) + 1


def test_trace_impls_are_the_kernels_with_a_traced_build():
    traced = {k for k, s in KERNELS.items() if "TV_TRACE" in kernels.kernel_path(s.source).read_text()}
    assert set(TRACE_IMPLS) == traced


@pytest.mark.parametrize(
    "args",
    [
        ["variants", "--defines", "TV_A"],
        ["variants", "--defines", ""],
        ["trace", "--page-sizes", "1,x"],
        ["trace", "--shapes", "185000x8"],
        ["trace", "--defines", "TV_SKIPP=1"],
        ["variants", "--impl", "mma", "--defines", "TV_SKIP=1"],
        ["variants", "--impl", "wgmma", "--defines", "TV_SKIP=1"],  # its header names it, it obeys none
        ["check", "--defines", "TV_SKIP=1"],  # which kernel's source: --impl is needed
        ["check", "--impl", "wgmma_seesaw", "--defines", "TV_NOPE=1"],
        ["stalls", "--defines", "TV_SKIP=1"],  # it profiles the default build only
        ["stalls", "--impl", "mma"],  # no warp roles to split
        ["trace", "--impl", "mma"],  # no TV_TRACE build
        ["trace", "--impl", "wgmma_wide", "--tree-split", "--prefix-splits", "4"],
        ["trace", "--tree-split"],  # the seesaw's trace has no CTA choice
        ["ablate", "--impl", "mma"],  # no TV_SKIP stage switches
        ["ablate", "--shapes", "185000x8"],
        ["ablate", "--page-sizes", "one"],
    ],
)
def test_bench_variant_modes_refuse_bad_arguments_in_one_line(args, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert bench_main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bad --")
    assert not out.exists()


def _synthetic(n: int, period: int, offsets: list[int], load_offsets: list[int]) -> np.ndarray:
    raw = np.zeros((3, TRACE_TILES, TRACE_SLOTS), dtype=np.uint64)
    for t in range(n):
        base = 100_000 + t * period
        for e, off in enumerate(offsets):
            raw[t % 2, t, e] = base + off
        for e, off in enumerate(load_offsets):
            raw[2, t, e] = base + off
    return raw


def test_trace_intervals_follow_the_owner_of_each_tile():
    offsets = [0, 110, 3500, 4700, 5300, 6300, 6530]  # EVENTS order
    raw = _synthetic(20, 3000, offsets, [-4000, -3960, -1000])
    med = summarize(intervals(raw, 20))
    assert med["wait_other_p"] == 110 and med["wait_part0"] == 3390 and med["wait_parts"] == 1200
    assert med["qk_tail"] == 600 and med["softmax"] == 1000 and med["pv_issue"] == 230
    assert med["period"] == 3000  # top (t + 2) - top (t), per tile
    assert med["loader_wait_stage"] == 40 and med["load_issue"] == 2960 and med["load_to_part0"] == 3500 + 3960
    assert len(EVENTS) == len(offsets)


def test_trace_phases_split_the_kernel_at_its_first_tile_and_its_epilogue():
    row = np.zeros((3, TRACE_SLOTS), dtype=np.uint64)
    row[:, 0] = [1000, 1010, 990]  # entry: math 0, math 1, loader
    row[:, 1] = [50_000, 50_400, 48_000]  # loop end
    row[:, 2] = [53_000, 53_100, 49_000]  # done
    ph = phases(row, first_part0=4_000.0)
    assert ph == {"prologue": 3010, "loop": 46_400, "epilogue": 2_700, "total": 52_110}
    row[1, 1:] = 0  # a warpgroup's events missing: the other's stand
    assert phases(row, 4_000.0)["epilogue"] == 53_000 - 50_000
    assert np.isnan(phases(np.zeros((3, TRACE_SLOTS), dtype=np.uint64), 4_000.0)["total"])
    assert len(KERNEL_EVENTS) == 3


def test_cta_timeline_takes_each_ctas_split_sm_and_stamps_and_summarizes_its_waves():
    """A grid of 2 query tiles x (2 prefix splits + 1 tree split): each CTA's start is its earlier
    math warpgroup's, its ends the later one's, all from the first start; the tree CTA that starts
    after a prefix CTA has ended counts as a later wave."""
    raw = np.zeros((TRACE_CTAS, 8), dtype=np.uint64)
    t = 1_765_000_000_000_000_123  # a global timer's ns: past float64's exact integers
    #        SM + 1, wg0 entry, loop end, done, wg1 entry, loop end, done
    raw[0] = [5, t, t + 40_000, t + 42_000, t + 10, t + 40_500, t + 42_500, 0]
    raw[1] = [6, t + 300, t + 41_000, t + 43_000, t + 200, t + 41_000, t + 43_000, 0]
    raw[2] = [7, t + 500, t + 39_000, t + 41_000, t + 500, t + 39_000, t + 41_000, 0]
    raw[3] = [8, t + 600, t + 40_000, t + 45_000, t + 600, t + 40_000, t + 45_000, 0]
    raw[4] = [9, t + 700, t + 3_700, t + 4_700, t + 700, t + 3_700, t + 4_700, 0]  # tree CTAs
    raw[5] = [9, t + 5_000, t + 8_000, t + 9_000, t + 5_000, t + 8_000, t + 9_000, 0]  # after CTA 4, same SM
    tl = cta_timeline(raw, (2, 3, 1), n_prefix_splits=2)
    assert tl["split"].tolist() == [0, 0, 1, 1, 2, 2] and tl["tree"].tolist() == [False] * 4 + [True] * 2
    assert tl["sm"].tolist() == [4, 5, 6, 7, 8, 8]
    assert tl["start"].tolist()[:2] == [0, 200] and tl["loop_end"][0] == 40_500 and tl["end"][0] == 42_500
    s = cta_summary(tl)
    assert s["span_us"] == 45.0 and s["later_wave"] == 1
    assert s["prefix"]["ctas"] == 4 and s["prefix"]["start_last"] == 0.6 and s["prefix"]["end_last"] == 45.0
    assert s["prefix"]["life_median"] == (42.5 + 42.8) / 2 and s["prefix"]["epilogue_median"] == 2.0
    assert s["tree"] == {
        "ctas": 2,
        **{"start_first": 0.7, "start_median": 2.85, "start_last": 5.0},
        **{"end_first": 4.7, "end_median": 6.85, "end_last": 9.0},
        **{"life_median": 4.0, "epilogue_median": 1.0},
    }
    raw[3, 2] = 0  # a CTA not stamped (a build without TV_TRACE, or another grid): refused
    with pytest.raises(ValueError, match="1 of 6 CTAs not stamped"):
        cta_timeline(raw, (2, 3, 1), n_prefix_splits=2)
    with pytest.raises(ValueError, match="raw is"):
        cta_timeline(raw[:10], (2, 3, 1), n_prefix_splits=2)


def test_cta0_clock_is_its_cycles_over_its_stamped_ns():
    """CTA (0, 0, 0)'s cycles from its math warpgroups' first entry to last end over its stamped ns;
    unstamped buffers are refused."""
    trace = np.zeros((3, TRACE_TILES + 1, TRACE_SLOTS), dtype=np.uint64)
    ctas = np.zeros((TRACE_CTAS, 8), dtype=np.uint64)
    with pytest.raises(ValueError, match="not stamped"):
        cta0_clock(trace, ctas)
    trace[0, TRACE_TILES, :3] = [1_000, 150_000, 171_000]  # warpgroup 0: entry, loop end, done
    trace[1, TRACE_TILES, :3] = [990, 150_500, 172_000]
    t = 1_765_000_000_000_000_000
    ctas[0, :7] = [5, t + 10, t + 87_000, t + 99_000, t, t + 87_400, t + 100_000]
    assert cta0_clock(trace, ctas) == {"cta0_cycles": 171_010, "cta0_ns": 100_000, "effective_ghz": 1.7101}


def test_traced_buffers_are_checked_against_the_modules_sizes():
    """A traced build's buffer comes back as a zeroed host array of trace.py's shape, and a module
    whose buffer has another size (the kernel's TRACE_* constants changed alone) is refused."""
    from specdiag.bench import trace

    class Module:
        def __init__(self, size):
            self.size = size

        def get_global(self, name):
            return 1234, self.size

    ptr, host = trace._global(Module(TRACE_CTAS * 8 * 8), "tv_ctas")
    assert ptr == 1234 and host.shape == (TRACE_CTAS, 8) and host.dtype == np.uint64 and not host.any()
    with pytest.raises(RuntimeError, match="tv_trace is 8 bytes in the module"):
        trace._global(Module(8), "tv_trace")


def test_trace_intervals_leave_missing_events_out():
    raw = _synthetic(10, 3000, [0, 110, 3500, 4700, 5300, 6300, 6530], [-4000, -3960, -1000])
    raw[1, :, EVENTS.index("p_arrived")] = 0  # the odd tiles lose an event
    iv = intervals(raw, 10)
    assert np.isnan(iv["softmax"][1::2]).all() and np.isfinite(iv["softmax"][0::2]).all()
    assert summarize(iv)["softmax"] == 1000  # medians skip the holes


def test_wide_trace_intervals_take_each_event_from_its_warpgroup():
    raw = np.zeros((3, TRACE_TILES, TRACE_SLOTS), dtype=np.uint64)
    offsets = (
        [0, 900, 3900, 4100, 5600, 4400, 5200, 5450],
        [-800, 5610, 6400, 6700],
        [-3000, -2960, -1100, 1500],
    )  # WIDE_EVENTS
    for t in range(12):
        for who, offs in enumerate(offsets):
            raw[who, t, : len(offs)] = [100_000 + 6000 * t + o for o in offs]
    raw[1, 5, 1] = 0  # a lost event: that tile's intervals through it are NaN, the rest stand
    iv = wide_intervals(raw, 12)
    med = summarize(iv)
    assert med["wait_part0"] == 900 and med["wait_parts"] == 3000 and med["qk_tail"] == 200 and med["softmax"] == 1500
    assert med["sm_vote"] == 300 and med["sm_exp_store"] == 800 and med["sm_fence"] == 250
    assert med["pv_wait_p"] == 6410 and med["pv_issue"] == 790 and med["pv"] == 300
    assert med["load_wait_free"] == 40 and med["load_issue"] == 1860 and med["load_land"] == 2600
    assert med["load_to_part0"] == 900 + 2960 and med["period"] == 6000
    assert med["load_reads"] == 6000 - 4500 and med["load_cycle"] == 6000 and np.isnan(iv["load_cycle"][-1])
    assert np.isnan(iv["pv_wait_p"][5]) and np.isnan(iv["period"][-1]) and np.isfinite(iv["pv"][5])
    assert [len(e) for e in WIDE_EVENTS] == [8, 4, 4]


def test_wide_clock_is_cycles_over_global_nanoseconds():
    row = np.zeros((3, TRACE_SLOTS), dtype=np.uint64)
    row[:, :4] = [
        [1_000, 5_000_000, 181_000, 5_100_000],
        [1_200, 5_000_100, 170_000, 5_090_100],
        [900, 4_999_900, 0, 0],
    ]
    row[:2, 4:6] = [[150_000, 160_000], [152_000, 160_100]]
    row[0, 6] = 31_000
    c = wide_clock(row)
    assert c["warm_run"] == 30_000
    assert c["sm_clock_ghz"] == 1.8 and c["span_us_softmax"] == 100 and c["span_us_pv"] == 90
    assert np.isnan(c["span_us_loader"])  # its end was not recorded
    assert c["epilogue_softmax_to_sums"] == 10_000 and c["epilogue_softmax_stores"] == 21_000
    assert c["epilogue_pv_to_sums"] == 8_100 and c["epilogue_pv_stores"] == 9_900


def _mnemonic(instruction: str) -> str:
    """'@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, ...' -> 'SYNCS.PHASECHK.TRANS64.TRYWAIT' (its suffixes
    kept, which kernels.opcode drops)."""
    words = instruction.split()
    return words[1] if words[0].startswith("@") else words[0]


def _listing(spec, defines: dict | None = None) -> list[str]:
    """The instructions of ``spec``'s build with ``defines``, in order."""
    return [x for _, x in kernels.sass_instructions(kernels.sass(spec.source, defines=defines))]


def _assert_builds_clean(spec, defines: dict) -> None:
    """The build of ``spec`` with ``defines`` compiles without spills, a stack frame or serialised wgmma."""
    f = kernels.nvcc_check(spec.source, defines=defines)[spec.entry]
    assert not f.spills and f.stack_frame == 0 and not f.wgmma_serialized, (defines, f)


@pytest.mark.sass
def test_wide_traced_build_records_the_clock():
    spec = KERNELS["wgmma_wide"]
    traced, default = kernels.sass(spec.source, defines={"TV_TRACE": 1}), kernels.sass(spec.source)
    assert "SR_CLOCKLO" in traced and "GLOBALTIMER" in traced
    assert "SR_CLOCKLO" not in default and "GLOBALTIMER" not in default


@pytest.mark.sass
def test_traced_build_records_the_clock_and_the_default_build_does_not():
    spec = KERNELS["wgmma_seesaw"]
    for traced in ({"TV_TRACE": 1, "TV_PAIR": 0}, {"TV_TRACE": 1}):  # tiles in turns; pairs
        _assert_builds_clean(spec, traced)
        assert "SR_CLOCKLO" in kernels.sass(spec.source, defines=traced), traced
    for untraced in ({}, {"TV_PAIR": 0}):
        assert "SR_CLOCKLO" not in kernels.sass(spec.source, defines=untraced)


@pytest.mark.sass
def test_l2_prefetch_build_puts_the_size_on_the_tiles_copies_only():
    """TV_L2_PREFETCH=256 puts the L2 prefetch size on every key-tile copy (36 LDGSTS per inlined
    tile load) and on none of Q's 36; the default build has it nowhere."""
    spec = KERNELS["wgmma_seesaw"]
    _assert_builds_clean(spec, {"TV_L2_PREFETCH": 256})

    def copies(text):
        ops = [op for ln in text.splitlines() for op in ln.split() if op.startswith("LDGSTS.E")]
        return sum(".LTC256B" in op for op in ops), sum(".LTC256B" not in op for op in ops)

    tiles, q = copies(kernels.sass(spec.source, defines={"TV_L2_PREFETCH": 256}))
    assert tiles > 0 and tiles % 36 == 0 and q == 36
    assert copies(kernels.sass(spec.source)) == (0, tiles + q)


@pytest.mark.sass
def test_pair_schedule_switches_build_clean_and_change_what_they_name():
    """TV_PV_FIRST=1 moves warpgroup 1's P stores behind its P V; TV_MAX_FIRST=1 has each warpgroup
    hand its max over before its exponents; TV_FREE_FIRST=1 has warpgroup 0 free b - 1's late group
    before issuing Q K^T (a): each builds without spills or serialised wgmma (the last two also
    traced) and differs from the default build. By default both warpgroups' 32 exponents
    a tile come before the arrive that hands their max over; with TV_MAX_FIRST only the rescale
    factors' do."""
    spec = KERNELS["wgmma_seesaw"]
    built = {"": _listing(spec)}  # each build compiled once: "" the default, else the switch's name
    for name in ("TV_PV_FIRST", "TV_MAX_FIRST", "TV_FREE_FIRST"):
        _assert_builds_clean(spec, {name: 1})
        built[name] = _listing(spec, {name: 1})
        assert built[name] != built[""], name
    for name in ("TV_MAX_FIRST", "TV_FREE_FIRST"):
        _assert_builds_clean(spec, {name: 1, "TV_TRACE": 1})

    def exps_before_arrive(listing: list[str]) -> list[int]:
        """MUFU.EX2 since the last wgmma, at each BAR.ARV that follows at least one of them."""
        counts, run = [], 0
        for x in listing:
            op = _mnemonic(x)
            if op.startswith("HGMMA"):
                run = 0
            elif op.startswith("MUFU.EX2"):
                run += 1
            elif op.startswith("BAR.ARV") and run:
                counts.append(run)
                run = 0
        return counts

    assert sum(exps_before_arrive(built[""])) >= 64 and sum(exps_before_arrive(built["TV_MAX_FIRST"])) <= 8

    def waits(listing: list[str]) -> tuple[int, int]:
        """The wgmma waits for all groups and for all but the newest one."""
        return tuple(sum(x.strip() == f"WARPGROUP.DEPBAR.LE gsb0, 0x{k}" for x in listing) for k in (0, 1))

    # warpgroup 0's wait for P V (a - 1) becomes a wait for all: nothing of Q K^T (a) is issued yet
    (all0, but0), (all1, but1) = waits(built[""]), waits(built["TV_FREE_FIRST"])
    assert (all1, but1) == (all0 + 1, but0 - 1) and but1 >= 1


@pytest.mark.sass
def test_block_barriers_switch_waits_for_each_column_block():
    """TV_BLOCK_BARS=1 puts each of a tile's 9 column blocks on its own mbarrier in the pair
    schedule: it builds without spills or serialised wgmma (traced too), inits 9 mbarriers a stage
    where the default inits 3, and waits 9 times a tile in each math warpgroup where the default waits
    twice (once a group)."""
    spec = KERNELS["wgmma_seesaw"]
    for d in ({"TV_BLOCK_BARS": 1}, {"TV_BLOCK_BARS": 1, "TV_TRACE": 1}):
        _assert_builds_clean(spec, d)

    default, blocks = _listing(spec), _listing(spec, {"TV_BLOCK_BARS": 1})

    def count(listing: list[str], prefix: str) -> int:
        return sum(_mnemonic(x).startswith(prefix) for x in listing)

    assert count(blocks, "SYNCS.EXCH.64") == 3 * count(default, "SYNCS.EXCH.64") == 18
    assert 2 * count(blocks, "SYNCS.PHASECHK") == 9 * count(default, "SYNCS.PHASECHK")


@pytest.mark.sass
def test_mask_bits_switch_drops_the_per_key_mask_loads():
    """The seesaw kernel masks its tree tiles from two 64-bit words a tile (the host's packed bits),
    in both schedules, and exports that it reads them; TV_MASK_BITS=0 loads each key's mask byte
    (LDG.E.U8) instead and exports that it does not. Each builds without spills or serialised
    wgmma, the bits' math loops are shorter, and with the masking compiled out (TV_SKIP=32) the
    two are the same build."""
    spec = KERNELS["wgmma_seesaw"]
    for schedule in ({}, {"TV_PAIR": 0}):
        bits, loads = schedule, {**schedule, "TV_MASK_BITS": 0}
        for d in (bits, loads):
            _assert_builds_clean(spec, d)
        on, off = kernels.sass(spec.source, defines=bits), kernels.sass(spec.source, defines=loads)
        assert "LDG.E.U8" in off and "LDG.E.U8" not in on and "LDG.E.64.CONSTANT" in on, schedule
        assert len(kernels.sass_instructions(on)) < len(kernels.sass_instructions(off)), schedule
        assert kernels.ptx_config(spec.source, defines=bits).tree_bits, schedule
        assert not kernels.ptx_config(spec.source, defines=loads).tree_bits, schedule
    lean = [kernels.sass(spec.source, defines={"TV_SKIP": 32, **d}) for d in ({}, {"TV_MASK_BITS": 0})]
    assert [x for _, x in kernels.sass_instructions(lean[0])] == [x for _, x in kernels.sass_instructions(lean[1])]
    others = [k for k in KERNELS.values() if k.source != spec.source]
    assert not any(kernels.ptx_config(k.source, defines=dict(k.defines)).tree_bits for k in others)


@pytest.mark.gpu
def test_trace_and_variants_on_the_gpu():
    """The traced build's output is its schedule's (tiles in turns, TV_PAIR=0) bit for bit, and
    its timeline is whole: every steady tile has every event, in order."""
    import torch

    from specdiag.bench.trace import trace_seesaw
    from specdiag.bench.variants import identity

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the seesaw kernel needs sm_90")
    turns = {"TV_PAIR": 0}
    rows = identity(
        "wgmma_seesaw", [{"TV_TRACE": 1, **turns}], cases=(([20000], 9, 8, 1),), progress=lambda *_: None, base=turns
    )
    assert rows[0]["bit_identical"]
    r = trace_seesaw(185000, 8, 9, page_size=1)  # 44 tiles per split
    med = r["median_cycles"]
    assert r["tiles"] > 8 and all(med[k] >= 0 for k in ("wait_other_p", "wait_part0", "softmax", "period"))
    ev = np.array(r["events"], dtype=np.float64)  # [3, tiles, 7]
    own = ev[np.arange(r["tiles"]) % 2, np.arange(r["tiles"])]
    steady = own[2 : r["tiles"] - 2]
    assert (steady > 0).all() and (np.diff(steady[:, 2:], axis=1) >= 0).all()  # part0 <= ... <= pv_issued
    ph = r["phases"]  # the whole kernel: start, first tile, loop, epilogue, in that order
    assert all(ph[k] > 0 for k in ("prologue", "loop", "epilogue")) and ph["total"] >= ph["prologue"] + ph["loop"]
    entry, loop_end, done = np.array(r["kernel_events"], dtype=np.float64).T
    assert (entry > 0).all() and (loop_end > entry).all() and (done >= loop_end).all()


@pytest.mark.gpu
def test_pair_trace_on_the_gpu():
    """The pair schedule's traced build gives the default build's bits, and each steady pair has
    every role's events, each role's in the kernel's order (the loader's frees and issues, and each
    math warpgroup's groups landed before its Q K^T is done, interleaved as the code runs them)."""
    import torch

    from specdiag.bench.trace import PAIR_EVENTS, trace_pairs
    from specdiag.bench.variants import identity

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the seesaw kernel needs sm_90")
    rows = identity("wgmma_seesaw", [{"TV_TRACE": 1}], cases=(([20000], 9, 8, 1),), progress=lambda *_: None)
    assert rows[0]["bit_identical"]
    r = trace_pairs(32768, 8, 65, page_size=1)  # 37 tiles per split: 19 pairs
    ev = np.array(r["events"], dtype=np.float64)  # [3, pairs, TRACE_SLOTS]
    steady = ev[:, 2 : ev.shape[1] - 2]
    assert steady.shape[1] > 8
    for who, n in enumerate((8, 8, 6)):
        assert (steady[who, :, :n] > 0).all() and (np.diff(steady[who, :, :n], axis=1) >= 0).all(), who
    orders = (
        ("top", "early_in", "prev_pv_done", "late_in", "qk_done"),
        ("top", "early_in", "late_in", "qk_done", "pv_issued", "p_out", "p_in"),
        (
            "top",
            "free_e0",
            "issued_e0",
            "free_e1",
            "issued_e1",
            "free_l0",
            "issued_l0",
            "free_l1",
            "issued_l1",
            "issued",
        ),
    )
    for who, order in enumerate(orders):
        seq = steady[who][:, [PAIR_EVENTS[who].index(e) for e in order]]
        assert (seq > 0).all() and (np.diff(seq, axis=1) >= 0).all(), who
    assert r["median_cycles"]["period"] > 0 and r["median_cycles"]["w1.pv_done"] > 0
    entry, loop_end, done = np.array(r["kernel_events"], dtype=np.float64).T
    assert (entry > 0).all() and (loop_end > entry).all() and (done >= loop_end).all()
    # every CTA stamped: 9 query tiles x (14 prefix splits + 1 tree split) on this plan
    split, sm, start, loop_end, end = np.array(r["ctas"]["rows"]).T
    assert len(split) == 9 * (r["prefix_splits"] + 1) and sorted(set(split)) == list(range(r["prefix_splits"] + 1))
    assert (sm >= 0).all() and (sm < torch.cuda.get_device_properties(0).multi_processor_count).all()
    assert start.min() == 0 and (start < loop_end).all() and (loop_end <= end).all()
    summary = r["ctas"]["summary"]
    assert summary["prefix"]["ctas"] == 9 * r["prefix_splits"] and summary["tree"]["ctas"] == 9
    assert summary["span_us"] * 1e3 == pytest.approx(end.max())
    assert 0.5 < r["ctas"]["clock"]["effective_ghz"] < 3.0  # an SM's clock, in GHz


@pytest.mark.gpu
def test_wide_trace_on_the_gpu():
    """The wide kernel's traced build matches its default build bit for bit, and each steady
    tile's events come in the kernel's order."""
    import torch

    from specdiag.bench.trace import trace_wide
    from specdiag.bench.variants import identity

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wide kernel needs sm_90")
    # the traced build and the build without the warm run of the softmax's code give the same bits
    cases = (([20000], 9, 8, 1), ([64, 129, 1], 10, 8, 1))
    builds = [
        {"TV_TRACE": 1},
        {"TV_WIDE_WARM": 0},
    ]
    rows = identity("wgmma_wide", builds, cases=cases, progress=lambda *_: None)
    assert len(rows) == 2 * len(builds) and all(r["bit_identical"] for r in rows)
    r = trace_wide(185000, 8, 9)
    ev = np.array(r["events"], dtype=np.float64)  # [3, tiles, 8]: tvwide::Event
    steady = ev[:, 2 : r["tiles"] - 2]
    assert r["tiles"] > 8 and (steady[0] > 0).all() and (steady[1:, :, :4] > 0).all()
    # warpgroup 0: part0 <= S^T issued <= done <= voted <= P^T stored <= fenced <= P^T out
    assert (np.diff(steady[0][:, [1, 2, 3, 5, 6, 7, 4]], axis=1) >= 0).all()
    assert (np.diff(steady[1, :, 1:4], axis=1) >= 0).all() and (np.diff(steady[2, :, 1:4], axis=1) >= 0).all()
    assert r["median_cycles"]["period"] > 0 and r["top_cycles"][0] == 0
    assert 0.5 < r["clock"]["sm_clock_ghz"] < 3 and r["clock"]["span_us_softmax"] > 0
    assert all(r["clock"][f"epilogue_{w}_{k}"] > 0 for w in ("softmax", "pv") for k in ("to_sums", "stores"))
    t = trace_wide(32768, 8, 9, tree=True)  # the tree split's CTA: one tile of 9 nodes
    assert t["traced_split"] > 0 and t["tiles"] == 1 and t["events"][0][0][4] > t["events"][0][0][3] > 0


@pytest.mark.gpu
def test_variant_table_sets_each_peer_against_the_default_build():
    from specdiag import analysis

    shape = dict(context=32768, heads=64, nodes=9)
    rows = [
        dict(impl="wgmma_seesaw", defines={}, page_size=1, ms=2.0, **shape),
        dict(impl="wgmma_seesaw", defines={"X": 1}, page_size=1, ms=1.8, **shape),
        dict(impl="wgmma_seesaw", defines={}, page_size=64, ms=1.9, **shape),
        dict(impl="wgmma_seesaw", defines={"X": 1}, page_size=64, ms=1.9, **shape),
        dict(impl="flashmla", defines={}, page_size=64, ms=1.5, **shape),
        dict(impl="flashmla_sparse", defines={}, page_size=1, ms=2.5, **shape),
    ]
    t = analysis.variant_table({"rows": rows}).droplevel([0, 1, 2])
    assert list(t.columns) == ["default_us", "X=1", "flashmla/default", "flashmla_sparse/default"]
    assert (
        t.loc[1, "X=1"] == 0.9 and t.loc[1, "flashmla/default"] == 0.75 and t.loc[1, "flashmla_sparse/default"] == 1.25
    )
    assert t.loc[64, "flashmla_sparse/default"] != t.loc[64, "flashmla_sparse/default"]  # page size 1 only: NaN
    assert analysis.variant_summary({"rows": rows}) == [
        "X=1 / default: page size 1: 0.90x to 0.90x (median 0.90x), page size 64: 1.00x to 1.00x (median 1.00x)"
    ]


def test_recorded_variants_and_trace_tables():
    """The recordings behind docs/kernel_notes.md's thirteenth-session section: every variant
    bit-identical to the default build, ratios over the default build's time, and the trace's
    medians per build."""
    from specdiag import analysis, data

    doc = data.load_json("history/seesaw_variants_h200.json")
    table = analysis.variant_table(doc)
    assert {"default_us", "flashmla/default"} <= set(table.columns)
    assert set(table.index.get_level_values("page_size")) == {1, 64}
    assert all(r["bit_identical"] for r in doc["identity"])
    lines = analysis.variant_summary(doc)
    assert len(lines) == len(table.columns) - 2 and all("bit-identical in 7 of 7" in ln for ln in lines)
    pf = data.load_json("history/seesaw_prefetch_variants_h200.json")  # the fourteenth session's L2 prefetches
    assert all(r["bit_identical"] for r in pf["identity"]) and len(pf["identity"]) == 14
    assert set(analysis.variant_table(pf).columns) == {
        "default_us", "TV_PREFETCH=1", "TV_PREFETCH=1,TV_PREFETCH_LINES=1", "flashmla/default"
    }  # fmt: skip
    tr = analysis.trace_table(data.load_json("trace_seesaw_h200.json"))
    assert {"default", "TV_SKIP=7"} <= set(tr.index.get_level_values("build"))
    assert (tr["period"] > 0).all() and (tr["load_issue"] > 0).all()


def test_recorded_fifteenth_session_mechanisms():
    """The recordings behind the fifteenth session's notes: FlashMLA's mechanisms one at a time.
    The address and store changes are bit-identical to the default build; the pair schedule sums in
    another order, so it is not, and its float64 checks pass instead. The default build's spread
    across the five runs is what a single run's ratio is read against."""
    from specdiag import analysis, data
    from specdiag.bench.checks import passed

    docs = {
        n: data.load_json(f"history/seesaw_{n}_variants_h200.json")
        for n in ("l2_prefetch", "pair", "loader", "stsm", "share_v1")
    }
    for name, doc in docs.items():
        for r in doc["identity"]:
            assert r["bit_identical"] == ("TV_PAIR" not in r["defines"]), (name, r["defines"])
    checks = data.load_json("history/native_check_seesaw_pair_h200.json")["results"]
    assert len(checks) == 12 and all(passed(r) and r["defines"] == {"TV_PAIR": 1} for r in checks)
    spread = analysis.default_spread(docs)
    assert (spread["max / min"] >= 1).all() and len(spread) == 12
    peers = data.load_json("history/peers_sparse_h200.json")
    assert {r["impl"] for r in peers["rows"]} == {"native", "flashmla", "flashmla_sparse"}


def test_recorded_sixteenth_session_loaders():
    """The recordings behind the sixteenth session's notes: the sharing and register-loader builds
    pass the float64 checks, are bit-identical to the default build, and are slower than it at
    the median of every page size (what the notes and notebook 05 say)."""
    from specdiag import analysis, data
    from specdiag.bench.checks import passed

    for name, builds in (("share_v2_v3", 2), ("hybrid", 2)):
        checks = data.load_json(f"history/native_check_seesaw_{name}_h200.json")["results"]
        assert len(checks) == 12 * builds and all(passed(r) for r in checks)
    for name in ("share_v2_v3", "share_order", "hybrid"):
        doc = data.load_json(f"history/seesaw_{name}_variants_h200.json")
        assert doc["identity"] and all(r["bit_identical"] for r in doc["identity"])
        table = analysis.variant_table(doc)
        builds = [c for c in table.columns if c != "default_us" and "/" not in c]
        assert builds and all((table[b].groupby(level="page_size").median() > 1).all() for b in builds), name
    for name in ("share_v2_v3", "share_order", "hybrid", "bn32"):
        t = analysis.trace_table(data.load_json(f"history/trace_seesaw_{name}_h200.json"))
        assert (t["period"] > 0).all() and len(set(t.index.get_level_values("build"))) == 3


def test_recorded_sixteenth_session_ring_and_qk_first():
    """TV_BN=32 and TV_BN=32,TV_QK_FIRST=1: correct (float64), summed in another order (not
    bit-identical), slower at the median; with four stages the loader waits longer for a stage
    and the softmax step of a 32-key tile takes more than half a 64-key one's (the notes)."""
    from specdiag import analysis, data
    from specdiag.bench.checks import passed

    checks = data.load_json("history/native_check_seesaw_bn32_h200.json")["results"]
    assert len(checks) == 24 and all(passed(r) for r in checks)
    doc = data.load_json("history/seesaw_bn32_variants_h200.json")
    assert doc["identity"] and not any(r["bit_identical"] for r in doc["identity"])
    table = analysis.variant_table(doc)
    for b in ("TV_BN=32", "TV_BN=32,TV_QK_FIRST=1"):
        assert (table[b].groupby(level="page_size").median() > 1).all()
    t = analysis.trace_table(data.load_json("history/trace_seesaw_bn32_h200.json")).droplevel([2, 3])
    for shape in set(t.index.droplevel("build")):
        g = t.loc[shape]
        assert g.loader_wait_stage["TV_BN=32"] > g.loader_wait_stage["default"]
        assert 0.5 * g.softmax["default"] < g.softmax["TV_BN=32"] < g.softmax["default"]


def test_recorded_sixteenth_session_pv_late():
    """TV_PV_LATE (timed as a trace build): correct, bit-identical, slower at the median, and
    its loader waits longer for a stage than the default build's (the notes' reading)."""
    from specdiag import analysis, data
    from specdiag.bench.checks import passed

    checks = data.load_json("history/native_check_seesaw_pv_late_h200.json")["results"]
    assert len(checks) == 12 and all(passed(r) and r["defines"] == {"TV_PV_LATE": 1, "TV_TRACE": 1} for r in checks)
    doc = data.load_json("history/seesaw_pv_late_variants_h200.json")
    assert all(r["bit_identical"] for r in doc["identity"])
    table = analysis.variant_table(doc)
    assert (table["TV_PV_LATE=1,TV_TRACE=1"].groupby(level="page_size").median() > 1.4).all()
    runs = data.load_json("history/trace_seesaw_pv_late_h200.json")["runs"]
    wait = {(r["context"], r["defines"].get("TV_PV_LATE", 0)): r["median_cycles"]["loader_wait_stage"] for r in runs}
    assert all(wait[(c, 1)] > 2 * wait[(c, 0)] for c, late in wait if late)


def test_recorded_seventeenth_session_qk_ahead():
    """Q K^T (t) issued before the wait for the other's P (t - 1), at 216 math registers
    (TV_QK_AHEAD 1-3), and a stage freed in two halves (TV_SPLIT_RELEASE): every build passes the
    float64 checks, the reordered ones are bit-identical (the split ones sum Q K^T in another
    order), all are slower at the median of each page size, and in every Q K^T-ahead build the
    loader waits more than 1.8 times as long for a stage as the default build does (the notes)."""
    from specdiag import analysis, data
    from specdiag.bench.checks import passed

    runs = {"qk_ahead": (2, True), "qk_ahead2": (1, True), "split": (2, False), "split_qk3": (1, False)}
    for name, (checked, identical) in runs.items():
        checks = data.load_json(f"history/native_check_seesaw_{name}_h200.json")["results"]
        assert len(checks) == 12 * checked and all(passed(r) for r in checks), name
        doc = data.load_json(f"history/seesaw_{name}_variants_h200.json")
        assert doc["identity"] and all(r["bit_identical"] == identical for r in doc["identity"]), name
        table = analysis.variant_table(doc)
        for b in (c for c in table.columns if "TV_QK_AHEAD" in c or "TV_SPLIT_RELEASE" in c):
            assert (table[b].groupby(level="page_size").median() > 1).all(), (name, b)
        t = analysis.trace_table(data.load_json(f"history/trace_seesaw_{name}_h200.json")).droplevel([2, 3])
        for shape in set(t.index.droplevel("build")):
            g = t.loc[shape]
            ahead = [b for b in g.index if "TV_QK_AHEAD" in b]
            assert ahead or name == "split"
            assert all(g.loader_wait_stage[b] > 1.8 * g.loader_wait_stage["default"] for b in ahead), (name, shape)


def test_recorded_seventeenth_session_early_parts_and_release():
    """Only one or two parts of Q K^T ahead (TV_QK_EARLY), and the other's stage released earlier
    in the default order (TV_RELEASE_FIRST, TV_RELEASE_PART): correct, bit-identical, not faster
    at the median of either page size; releasing earlier leaves the tiles landed long before the
    math waits for them (load_to_all up), and draining the P V first lengthens the period."""
    from specdiag import analysis, data
    from specdiag.bench.checks import passed

    for name, builds in (("qk_early", 3), ("release_first", 1), ("release_part", 2)):
        checks = data.load_json(f"history/native_check_seesaw_{name}_h200.json")["results"]
        assert len(checks) == 12 * builds and all(passed(r) for r in checks), name
        doc = data.load_json(f"history/seesaw_{name}_variants_h200.json")
        assert doc["identity"] and all(r["bit_identical"] for r in doc["identity"]), name
        table = analysis.variant_table(doc)
        for b in (c for c in table.columns if c != "default_us" and "/" not in c):
            assert (table[b].groupby(level="page_size").median() > 1).all(), (name, b)
    for name, build in (("release_first", "TV_RELEASE_FIRST=1"), ("release_part", "TV_RELEASE_PART=1")):
        t = analysis.trace_table(data.load_json(f"history/trace_seesaw_{name}_h200.json")).droplevel([2, 3])
        for shape in set(t.index.droplevel("build")):
            g = t.loc[shape]
            assert g.load_to_all[build] > 1.3 * g.load_to_all["default"] and g.period[build] > g.period["default"]


def test_recorded_seventeenth_session_fast_exp():
    """One ex2.approx.ftz per score (TV_FAST_EXP, the default since): correct in both runs,
    bit-identical on the identity cases, faster at the median of both page sizes in both runs,
    with a shorter softmax step and period in both traces (what the notes and notebook 05 say)."""
    from specdiag import analysis, data
    from specdiag.bench.checks import passed

    for name, builds in (("softmax", 3), ("fast_exp", 2)):
        checks = data.load_json(f"history/native_check_seesaw_{name}_h200.json")["results"]
        assert len(checks) == 12 * builds and all(passed(r) for r in checks), name
        doc = data.load_json(f"history/seesaw_{name}_variants_h200.json")
        assert all(r["bit_identical"] for r in doc["identity"] if r["defines"] == {"TV_FAST_EXP": 1})
        med = analysis.variant_table(doc)["TV_FAST_EXP=1"].groupby(level="page_size").median()
        assert (med < 1).all(), name
        t = analysis.trace_table(data.load_json(f"history/trace_seesaw_{name}_h200.json")).droplevel([2, 3])
        for shape in set(t.index.droplevel("build")):
            g = t.loc[shape]
            assert g.softmax["TV_FAST_EXP=1"] < g.softmax["default"] and g.period["TV_FAST_EXP=1"] < g.period["default"]


def test_recorded_stalls_rerun_matches_the_recording():
    """The stall sampling re-run after its refactor (bench stalls, history/ncu_stalls_seesaw_rerun)
    puts each role's barrier share within 2 points of the sixteenth session's recording of the
    same build (history/ncu_stalls_seesaw_exp2f: the build before one MUFU per exponent)."""
    from specdiag import analysis, data

    a = analysis.stall_table(data.load_json("history/ncu_stalls_seesaw_exp2f_h200.json"))
    b = analysis.stall_table(data.load_json("history/ncu_stalls_seesaw_rerun_h200.json"))
    assert list(a.index) == list(b.index)
    assert ((a.barrier - b.barrier).abs() < 2).all() and (b.samples > 0).all()


def test_default_spread_reads_each_runs_default_time():
    from specdiag import analysis

    def doc(ms):
        return {"rows": [dict(impl="wgmma_seesaw", defines={}, context=1, heads=8, nodes=9, page_size=1, ms=ms)]}

    t = analysis.default_spread({"a": doc(0.1), "b": doc(0.12)})
    assert list(t.columns) == ["a", "b", "max / min"] and abs(t["max / min"].iloc[0] - 1.2) < 1e-12
    assert analysis.default_spread({"a": doc(0.1)}).empty  # one run has no spread


def test_recorded_ncu_comparison_table():
    from specdiag import analysis, data

    t = analysis.ncu_table(data.load_json("history/ncu_seesaw_flashmla_h200.json"))
    assert set(t.index.get_level_values("kernel")) == {"seesaw", "flashmla"}
    assert set(t.index.get_level_values("shape")) == {"32768x64x65", "185000x8x9"}
    assert t.notna().all().all() and (t.cycles > 0).all()


def test_wide_trace_table_recomputes_the_recorded_medians():
    """analysis.wide_trace_table computes each interval again from a recording's events: the
    intervals the recording already had come out as recorded, and the loader's loop is its parts."""
    from specdiag import analysis, data

    doc = data.load_json("history/wide_kernel_h100_run26.json")["run2_trace"]
    t = analysis.wide_trace_table(doc)
    for r, (_, row) in zip(doc["runs"], t.iterrows(), strict=True):
        for k, v in r["median_cycles"].items():
            assert row[k] == round(v) or (np.isnan(v) and np.isnan(row[k])), (k, v, row[k])
    d = t.xs("default", level="build").iloc[0]
    parts = d["load_reads"] + d["load_wait_free"] + d["load_issue"] + d["load_land"]
    assert abs(d["load_cycle"] - parts) < 0.1 * parts  # (medians of a sum and a sum of medians)
