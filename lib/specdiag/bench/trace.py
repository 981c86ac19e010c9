"""Per-tile timelines of the seesaw and wide kernels: a ``TV_TRACE=1`` build records ``clock64()``
at each event of its first tiles in one CTA, (0, 0, 0) or for the wide kernel any split's
(``tvsee::Event`` and, for the seesaw kernel's pair schedule, ``tvsee::PairEvent`` in
kernels/tree_verify_seesaw.cu; ``tvwide::Event`` in kernels/tree_verify_wide.cu); ``intervals``,
``pair_timeline`` and ``wide_intervals`` turn the events into the waits of each tile or pair, in
SM cycles. The seesaw kernel's traced build also stamps every CTA's start and end with its SM in
global ns (``cta_timeline``, ``cta_summary``): the launch as a whole, its waves and its tail."""

from __future__ import annotations

import numpy as np

__all__ = [
    "TRACE_IMPLS",
    "TRACE_TILES",
    "TRACE_SLOTS",
    "TRACE_SHAPES",
    "EVENTS",
    "LOADER_EVENTS",
    "KERNEL_EVENTS",
    "intervals",
    "phases",
    "summarize",
    "trace_seesaw",
    "PAIR_EVENTS",
    "pair_timeline",
    "trace_pairs",
    "WIDE_EVENTS",
    "wide_intervals",
    "wide_clock",
    "trace_wide",
    "TRACE_CTAS",
    "cta_timeline",
    "cta_summary",
    "cta0_clock",
    "read_stamps",
]

TRACE_TILES = 128  # tvg::TRACE_TILES; the buffer has one more row, the whole-kernel events
TRACE_SLOTS = 16  # tvg::TRACE_SLOTS: events a row
TRACE_IMPLS = ("wgmma_seesaw", "wgmma_wide")  # the kernels with a TV_TRACE build
TRACE_SHAPES = ((32768, 64, 65), (185000, 8, 9))  # many query rows; the deployment's
EVENTS = ("top", "other_p", "part0", "parts_all", "qk_done", "p_arrived", "pv_issued")  # tvsee::Event
LOADER_EVENTS = ("wait_stage", "stage_free", "issued")  # the loader's first warp in slots 0..2, its last in 3..5
KERNEL_EVENTS = ("entry", "loop_end", "done")  # tvsee::KernelEvent, in row TRACE_TILES
TRACE_CTAS = 2048  # tvg::TRACE_CTAS: the CTAs (in launch order) whose start and end are stamped
CTA_SLOTS = 8  # tvg::CTA_SLOTS: the SM + 1, then each math warpgroup's KERNEL_EVENTS in global ns

# interval name -> (from event, to event), both of the tile's owner, in the kernel's order of steps
OWNER_INTERVALS = {
    "wait_other_p": ("top", "other_p"),  # (1): the other warpgroup's P (t - 1)
    "wait_part0": ("other_p", "part0"),  # (2): tile t's first part
    "wait_parts": ("part0", "parts_all"),  # the rest of tile t
    "qk_tail": ("parts_all", "qk_done"),  # Q K^T (t) finishing after its last part landed
    "softmax": ("qk_done", "p_arrived"),  # (4)
    "pv_issue": ("p_arrived", "pv_issued"),  # (5)
}


def intervals(raw: np.ndarray, n_tiles: int) -> dict[str, np.ndarray]:
    """Per-tile intervals (cycles; NaN where an event was not recorded) from the trace buffer
    ``raw`` [3, TRACE_TILES, TRACE_SLOTS] (uint64): each tile's events come from its owner, t % 2."""
    n = min(n_tiles, raw.shape[1])
    t = np.arange(n)
    ev = np.where(raw == 0, np.nan, raw.astype(np.float64))
    own = ev[t % 2, t]  # [n, 8]: the owner's events for each tile
    out = {name: own[:, EVENTS.index(b)] - own[:, EVENTS.index(a)] for name, (a, b) in OWNER_INTERVALS.items()}
    top = own[:, EVENTS.index("top")]
    out["period"] = np.concatenate([top[2:] - top[:-2], [np.nan, np.nan]])[:n] / 2  # per tile, both warpgroups
    loader = ev[2, :n]
    out["loader_wait_stage"] = loader[:, 1] - loader[:, 0]
    out["load_issue"] = loader[:, 2] - loader[:, 1]
    out["last_warp_wait_stage"] = loader[:, 4] - loader[:, 3]  # the same for the loader's last warp
    out["last_warp_load_issue"] = loader[:, 5] - loader[:, 4]
    out["load_to_part0"] = own[:, EVENTS.index("part0")] - loader[:, 1]  # stage free -> first part usable
    out["load_to_all"] = own[:, EVENTS.index("parts_all")] - loader[:, 1]
    return out


def phases(kernel_row: np.ndarray, first_part0: float) -> dict[str, float]:
    """Whole-kernel phases (cycles) of the traced CTA from ``kernel_row`` [3, 8] (each warpgroup's
    KernelEvent clocks; 0 = not recorded) and the clock at which tile 0's first part was usable:
    ``prologue`` (the kernel's start to that), ``loop`` (that to the later math warpgroup's end of
    its last P V), ``epilogue`` (the later math warpgroup's row sums and partial-row writes), ``total``."""
    ev = np.where(kernel_row == 0, np.nan, kernel_row.astype(np.float64))
    entry, loop_end, done = (ev[:, KERNEL_EVENTS.index(k)] for k in KERNEL_EVENTS)
    start = np.nanmin(entry) if np.isfinite(entry).any() else np.nan
    math_end = np.nanmax(loop_end[:2]) if np.isfinite(loop_end[:2]).any() else np.nan
    math_done = np.nanmax(done[:2]) if np.isfinite(done[:2]).any() else np.nan
    return {
        "prologue": first_part0 - start,
        "loop": math_end - first_part0,
        "epilogue": math_done - math_end,
        "total": (np.nanmax(done) if np.isfinite(done).any() else np.nan) - start,
    }


def summarize(iv: dict[str, np.ndarray], skip: int = 4) -> dict[str, float]:
    """Median of each interval over the steady tiles (the first and last ``skip`` left out)."""
    res = {}
    for k, v in iv.items():
        x = v[skip : len(v) - skip] if len(v) > 2 * skip else v
        x = x[np.isfinite(x)]
        res[k] = float(np.median(x)) if len(x) else float("nan")
    return res


def cta_timeline(raw: np.ndarray, grid: tuple[int, int, int], n_prefix_splits: int) -> dict[str, np.ndarray]:
    """Every CTA of a ``grid`` (x: query tiles, y: splits, z: requests; the first TRACE_CTAS in
    launch order) from ``raw`` [TRACE_CTAS, CTA_SLOTS] (uint64, 0 = not stamped): its split and SM,
    and in ns after the launch's first start its start (the earlier math warpgroup's), the end of its
    loop and its end (the later one's); ``tree``: a split past the prefix's."""
    if raw.shape != (TRACE_CTAS, CTA_SLOTS):
        raise ValueError(f"raw is [{TRACE_CTAS}, {CTA_SLOTS}] (TRACE_CTAS, CTA_SLOTS), got {list(raw.shape)}")
    n = min(int(np.prod(grid)), TRACE_CTAS)
    ev = raw[:n].astype(np.int64)  # (global ns are ~1e18: differences taken in integers, exact)
    stamped = (ev[:, :7] > 0).all(1)
    if not stamped.all():
        raise ValueError(
            f"{n - int(stamped.sum())} of {n} CTAs not stamped: a build without TV_TRACE, or a grid other than {grid}"
        )
    wg = ev[:, 1:7].reshape(n, 2, len(KERNEL_EVENTS))  # [cta, who, event]
    entry, loop_end, done = wg[:, :, 0].min(1), wg[:, :, 1].max(1), wg[:, :, 2].max(1)
    t0 = entry.min()
    split = (np.arange(n) // grid[0]) % grid[1]
    return {
        "split": split,
        "sm": ev[:, 0] - 1,
        "tree": split >= n_prefix_splits,
        "start": (entry - t0).astype(np.float64),
        "loop_end": (loop_end - t0).astype(np.float64),
        "end": (done - t0).astype(np.float64),
    }


def cta_summary(tl: dict[str, np.ndarray]) -> dict:
    """The launch's span, how many CTAs started only after some CTA had ended (a later wave), and
    per kind (prefix, tree) the count and the first, median and last start and end, the median
    life (start to end) and epilogue (loop end to end), all in us."""
    first_end = tl["end"].min()
    out: dict = {"span_us": float(tl["end"].max()) / 1e3, "later_wave": int((tl["start"] > first_end).sum())}
    for kind, sel in (("prefix", ~tl["tree"]), ("tree", tl["tree"])):
        if not sel.any():
            out[kind] = {"ctas": 0}
            continue
        start, end = tl["start"][sel], tl["end"][sel]
        out[kind] = {
            "ctas": int(sel.sum()),
            **{
                f"{what}_{k}": float(f(x)) / 1e3
                for what, x in (("start", start), ("end", end))
                for k, f in (("first", np.min), ("median", np.median), ("last", np.max))
            },
            "life_median": float(np.median(end - start)) / 1e3,
            "epilogue_median": float(np.median(end - tl["loop_end"][sel])) / 1e3,
        }
    return out


def cta0_clock(trace: np.ndarray, ctas: np.ndarray) -> dict:
    """The clock CTA (0, 0, 0) ran at: its cycles (its math warpgroups' first entry to last end, row
    TRACE_TILES of the trace buffer [3, TRACE_TILES + 1, TRACE_SLOTS]) over its global-timer ns (row
    0 of the CTA stamps [TRACE_CTAS, CTA_SLOTS])."""
    kernel = trace[:2, TRACE_TILES, : len(KERNEL_EVENTS)].astype(np.int64)  # [math warpgroup, event]
    cta0 = ctas[0].astype(np.int64)  # SM + 1, then each math warpgroup's entry, loop end, done
    if (kernel == 0).any() or (cta0[1:7] == 0).any():
        raise ValueError("CTA (0, 0, 0) is not stamped: not a traced build's buffers")
    cycles = int(kernel[:, 2].max() - kernel[:, 0].min())
    ns = int(max(cta0[3], cta0[6]) - min(cta0[1], cta0[4]))
    return {"cta0_cycles": cycles, "cta0_ns": ns, "effective_ghz": cycles / ns}


def trace_seesaw(
    context: int, heads: int, nodes: int, page_size: int = 1, defines=None, seed: int = 0, prefix_splits=None
) -> dict:
    """Run the traced seesaw build once (after a warm-up) on one request and return its events,
    per-tile intervals and their medians. The trace is the turn-taking schedule's (``TV_PAIR=0``;
    the pair schedule's is ``trace_pairs``)."""
    if (defines or {}).get("TV_PAIR", 0):
        raise ValueError("trace_seesaw traces tiles in turns: TV_PAIR must be 0 (the pair schedule: trace_pairs)")
    d = {**(defines or {}), "TV_TRACE": 1, "TV_PAIR": 0}
    op, raw, ctas = _traced("wgmma_seesaw", context, heads, nodes, page_size, d, seed, prefix_splits)
    n_tiles = _tiles_per_split(op)
    iv = intervals(raw[:, :TRACE_TILES], n_tiles)
    part0 = raw[0, 0, EVENTS.index("part0")]  # tile 0's first part usable (its owner, warpgroup 0); 0: not recorded
    first_part0 = float(part0) if part0 else float("nan")
    return dict(
        **_header(context, heads, nodes, page_size, d),
        prefix_splits=op.plan.n_prefix_splits,
        tiles=int(min(n_tiles, TRACE_TILES)),
        median_cycles=summarize(iv),
        phases=phases(raw[:, TRACE_TILES], first_part0),
        events=raw[:, : min(n_tiles, TRACE_TILES), :7].tolist(),
        kernel_events=raw[:, TRACE_TILES, : len(KERNEL_EVENTS)].tolist(),
        ctas=_ctas(op, raw, ctas),
    )


_LANDED = ("early_in", "late_in")  # (both math warpgroups, slots 8 and 9) their tile's early and late groups landed
# tvsee::PairEvent, per role (row `who` of the buffer; its row i is pair i: tiles 2 i and 2 i + 1)
PAIR_EVENTS = (
    ("top", "prev_pv_done", "qk_done", "max_out", "pv_done", "max_in", "p_out", "pv_b_issued", *_LANDED),  # warpgroup 0
    # warpgroup 1, and in slot 10 its P (b) handed over
    ("top", "qk_done", "max_in", "max_out", "pv_issued", "p_in", "pv_b_done", "pv_done", *_LANDED, "p_out"),
    # the loader's first warp: each group's stage free (after a bar.sync: see pair_timeline) and issued
    (
        *("top", "free_e0", "free_e1", "free_l0", "free_l1", "issued"),
        *("issued_e0", "issued_e1", "issued_l0", "issued_l1"),
    ),
)
PAIR_ROLES = ("w0", "w1", "ld")


def pair_timeline(raw: np.ndarray, n_tiles: int) -> dict[str, np.ndarray]:
    """Per pair of tiles, every role's events in cycles after warpgroup 0's loop top of the same
    pair (``"w1.qk_done"``, ``"ld.free_e0"``: the loader's events of pair i are the copies of its
    tiles, so they come before that top), and ``period``: the cycles a tile from one top to the
    next, over two; NaN where an event was not recorded. ``raw`` [3, TRACE_TILES, TRACE_SLOTS] (uint64). An
    event just after a bar.sync (``max_in``, ``p_in``, the loader's ``free_*``) can read the clock
    before the wait ends (BAR.SYNC.DEFER_BLOCKING): measure intervals from arrives and wgmma waits."""
    n = min((n_tiles + 1) // 2, raw.shape[1])
    ev = np.where(raw[:, :n] == 0, np.nan, raw[:, :n].astype(np.float64))
    top = ev[0, :, 0]
    out = {
        f"{role}.{name}": ev[who, :, slot] - top
        for who, (role, names) in enumerate(zip(PAIR_ROLES, PAIR_EVENTS))
        for slot, name in enumerate(names)
    }
    out["period"] = np.concatenate([(top[1:] - top[:-1]) / 2, [np.nan]])
    return out


def trace_pairs(
    context: int, heads: int, nodes: int, page_size: int = 1, defines=None, seed: int = 0, prefix_splits=None
) -> dict:
    """The seesaw kernel's pair schedule traced once (after a warm-up) on one request: each pair's
    events, their medians over the steady pairs as offsets from warpgroup 0's loop top
    (``pair_timeline``), and the whole-kernel phases, with Q K^T of tile 0 done as the first
    tile's end."""
    if not (defines or {}).get("TV_PAIR", 1):
        raise ValueError("trace_pairs traces the pair schedule: TV_PAIR=0 is trace_seesaw's")
    d = {**(defines or {}), "TV_TRACE": 1, "TV_PAIR": 1}
    op, raw, ctas = _traced("wgmma_seesaw", context, heads, nodes, page_size, d, seed, prefix_splits)
    n_tiles = _tiles_per_split(op)
    qk0 = raw[0, 0, PAIR_EVENTS[0].index("qk_done")]
    return dict(
        **_header(context, heads, nodes, page_size, d),
        prefix_splits=op.plan.n_prefix_splits,
        tiles=int(min(n_tiles, 2 * TRACE_TILES)),
        median_cycles=summarize(pair_timeline(raw[:, :TRACE_TILES], n_tiles), skip=2),
        phases=phases(raw[:, TRACE_TILES], float(qk0) if qk0 else float("nan")),
        events=raw[:, : min((n_tiles + 1) // 2, TRACE_TILES), :].tolist(),
        kernel_events=raw[:, TRACE_TILES, : len(KERNEL_EVENTS)].tolist(),
        ctas=_ctas(op, raw, ctas),
    )


# tvwide::Event, per warpgroup (row `who` of the buffer): 0 scores and softmax, 1 the other half
# of O^T, 2 the loader
WIDE_EVENTS = (
    ("top", "part0", "qk_issued", "qk_done", "p_out", "voted", "stored", "fenced"),
    ("wait_p", "got_p", "pv_issued", "pv_done"),
    ("wait_free", "free", "issued", "landed"),
)
# interval name -> ((who, event), (who, event)), both of tile t
WIDE_INTERVALS = {
    "wait_part0": ((0, "top"), (0, "part0")),  # P V (t - 1) issued, then tile t's first part
    "wait_parts": ((0, "part0"), (0, "qk_issued")),  # the rest of tile t, S^T (t) issued
    "qk_tail": ((0, "qk_issued"), (0, "qk_done")),
    "softmax": ((0, "qk_done"), (0, "p_out")),
    "sm_vote": ((0, "qk_done"), (0, "voted")),  # the softmax's steps: scale and mask, the vote (bar.red)
    "sm_exp_store": ((0, "voted"), (0, "stored")),  # (the rare reduction), exponents, P^T's swaps and stores
    "sm_fence": ((0, "stored"), (0, "fenced")),  # fence.proxy.async
    "pv_wait_p": ((1, "wait_p"), (1, "got_p")),  # warpgroup 1 waiting for P^T (t)
    "pv_issue": ((1, "got_p"), (1, "pv_issued")),  # its rescale and P V issue
    "pv": ((1, "pv_issued"), (1, "pv_done")),
    "load_wait_free": ((2, "wait_free"), (2, "free")),
    "load_issue": ((2, "free"), (2, "issued")),
    "load_land": ((2, "issued"), (2, "landed")),
    "load_to_part0": ((2, "free"), (0, "part0")),  # stage free -> first part usable
}


def wide_clock(kernel_row: np.ndarray) -> dict[str, float]:
    """From the wide kernel's row TRACE_TILES ([3, 8]: each warpgroup's clock and global ns at its
    start and end, slots 0-3; the math warpgroups' clock at their last P V done, slot 4, and past
    the sums' barrier, slot 5; warpgroup 0's at the end of its warm run, slot 6): the SM clock over
    warpgroup 0's span (GHz), each warpgroup's span in us, warpgroup 0's warm run in cycles from
    its start, and each math warpgroup's epilogue in cycles (last P V to the barrier, the barrier
    to its end); NaN where an event is missing."""
    ev = np.where(kernel_row == 0, np.nan, kernel_row.astype(np.float64))
    ns = ev[:, 3] - ev[:, 1]
    return {
        "sm_clock_ghz": float((ev[0, 2] - ev[0, 0]) / ns[0]),
        **{f"span_us_{who}": float(ns[i] / 1e3) for i, who in enumerate(("softmax", "pv", "loader"))},
        "warm_run": float(ev[0, 6] - ev[0, 0]),
        **{f"epilogue_{who}_to_sums": float(ev[i, 5] - ev[i, 4]) for i, who in enumerate(("softmax", "pv"))},
        **{f"epilogue_{who}_stores": float(ev[i, 2] - ev[i, 5]) for i, who in enumerate(("softmax", "pv"))},
    }


def wide_intervals(raw: np.ndarray, n_tiles: int) -> dict[str, np.ndarray]:
    """Per-tile intervals (cycles; NaN where an event was not recorded) of the wide kernel from
    its trace buffer ``raw`` [3, TRACE_TILES, 8] (uint64); ``period``: top (t + 1) - top (t); the
    loader's ``load_reads`` (landed (t) to its wait for tile t + 1's stage: the next tile's page-table
    reads) and ``load_cycle`` (wait (t) to wait (t + 1))."""
    n = min(n_tiles, raw.shape[1])
    ev = np.where(raw[:, :n] == 0, np.nan, raw[:, :n].astype(np.float64))

    def at(who: int, name: str) -> np.ndarray:  # (NaN for an event newer than the recording)
        slot = WIDE_EVENTS[who].index(name)
        return ev[who, :, slot] if slot < ev.shape[2] else np.full(n, np.nan)

    out = {k: at(*b) - at(*a) for k, (a, b) in WIDE_INTERVALS.items()}

    def later(x: np.ndarray, y: np.ndarray) -> np.ndarray:  # tile t + 1's x - tile t's y
        return np.concatenate([x[1:] - y[:-1], [np.nan]])

    top, wait = at(0, "top"), at(2, "wait_free")
    out["period"] = later(top, top)
    out["load_reads"] = later(wait, at(2, "landed"))  # the loader's reads of the next tile's page-table entries
    out["load_cycle"] = later(wait, wait)  # the loader's own loop, one tile
    return out


def _header(context: int, heads: int, nodes: int, page_size: int, defines: dict) -> dict:
    return dict(context=context, heads=heads, nodes=nodes, page_size=page_size, defines=defines)


def _tiles_per_split(op) -> int:
    """The traced CTA's tiles: a prefix split's, or the tree split's where there is no prefix."""
    return op.plan.prefix_tiles_per_split if op.plan.n_prefix_splits else op.plan.tree_tiles_per_split


def _traced(impl: str, context: int, heads: int, nodes: int, page_size: int, defines, seed: int, prefix_splits):
    """Run ``impl``'s traced build once (after a warm-up) on one request: (its op, the trace buffer,
    and for the seesaw kernel the CTA stamps [TRACE_CTAS, CTA_SLOTS], else None)."""
    import torch

    from .. import kernels
    from ..attention.native import NativeTreeVerify
    from ..attention.registry import KERNELS
    from ..cost import SOFTMAX_SCALE
    from .timing import Rotation

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rot = Rotation(context, page_size, nodes, heads, l2, seed=seed, max_sets=2)
    opts = dict(scale=SOFTMAX_SCALE, check=False, impl=impl, defines=defines, prefix_splits=prefix_splits)
    op = NativeTreeVerify(**rot.inputs(0), **opts)
    op.run()
    mod = kernels.load_module(KERNELS[impl].source, torch.cuda.current_device(), op.defines)
    import pycuda.driver as cuda

    bufs = [_global(mod, "tv_trace")] + ([_global(mod, "tv_ctas")] if impl == "wgmma_seesaw" else [])
    NativeTreeVerify(**rot.inputs(1), **opts).run()
    torch.cuda.synchronize()
    for ptr, host in bufs:
        cuda.memset_d8(ptr, 0, host.nbytes)
    op.run()
    torch.cuda.synchronize()
    for ptr, host in bufs:
        cuda.memcpy_dtoh(host, ptr)
    return op, bufs[0][1], bufs[1][1] if len(bufs) > 1 else None  # (the wide kernel stamps no CTAs)


# the traced build's device buffers and their shapes here
_BUFFERS = {"tv_trace": (3, TRACE_TILES + 1, TRACE_SLOTS), "tv_ctas": (TRACE_CTAS, CTA_SLOTS)}


def _global(mod, name: str) -> tuple:
    """(device pointer, zeroed host array) of the traced build's buffer ``name``, its size checked."""
    ptr, size = mod.get_global(name)
    host = np.zeros(_BUFFERS[name], dtype=np.uint64)
    if host.nbytes != size:
        raise RuntimeError(
            f"{name} is {size} bytes in the module, {host.nbytes} expected: {_BUFFERS[name]} out of step"
        )
    return ptr, host


def read_stamps(op) -> tuple[np.ndarray, np.ndarray]:
    """The seesaw kernel's traced build's trace buffer and CTA stamps as its last launch left them
    (``op``: a NativeTreeVerify of that build)."""
    import pycuda.driver as cuda
    import torch

    from .. import kernels
    from ..attention.registry import KERNELS

    mod = kernels.load_module(KERNELS["wgmma_seesaw"].source, torch.cuda.current_device(), op.defines)
    out = []
    for name in ("tv_trace", "tv_ctas"):
        ptr, host = _global(mod, name)
        cuda.memcpy_dtoh(host, ptr)
        out.append(host)
    return out[0], out[1]


def _ctas(op, raw: np.ndarray, ctas: np.ndarray) -> dict:
    """The launch's CTA timeline (``cta_timeline``, ns rounded), its ``cta_summary`` and the clock
    CTA (0, 0, 0) ran at (``cta0_clock``)."""
    tl = cta_timeline(ctas, (op.plan.m_tiles, op.plan.splits, 1), op.plan.n_prefix_splits)
    rows = np.stack([tl["split"], tl["sm"], tl["start"], tl["loop_end"], tl["end"]], axis=1)
    return {
        "columns": ["split", "sm", "start_ns", "loop_end_ns", "end_ns"],
        "rows": rows.round().astype(np.int64).tolist(),
        "summary": cta_summary(tl),
        "clock": cta0_clock(raw, ctas),
    }


def trace_wide(
    context: int,
    heads: int,
    nodes: int,
    page_size: int = 1,
    defines=None,
    seed: int = 0,
    tree: bool = False,
    prefix_splits: int | None = None,
) -> dict:
    """The wide kernel's traced build on one request: events, per-tile intervals, their medians
    over the steady tiles, and the clock at which each tile's step began (from tile 0's); of its
    first prefix split, or with ``tree`` of its tree split (the first split past the prefix's).
    ``prefix_splits`` forces the plan's prefix split count (not with ``tree``)."""
    if tree and prefix_splits is not None:
        raise ValueError("tree traces the plan's own tree split: no prefix_splits")
    split = 0
    if tree:  # the plan the op will make (it is checked below), without building one
        import torch

        from ..attention.plan import plan_launch
        from ..attention.registry import KERNELS

        spec, sms = (
            KERNELS["wgmma_wide"],
            torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count,
        )
        split = plan_launch(
            nodes * heads, nodes, context, 1, sms, rows_per_cta=spec.rows_per_cta, bn=spec.keys_per_tile
        ).n_prefix_splits
    d = {**(defines or {}), "TV_TRACE": 1, "TV_TRACE_SPLIT": split}
    op, raw, _ = _traced("wgmma_wide", context, heads, nodes, page_size, d, seed, prefix_splits)
    if op.plan.n_prefix_splits != split and tree:
        raise RuntimeError(f"the traced build planned {op.plan.n_prefix_splits} prefix splits, not {split}")
    n_tiles = min(op.plan.tree_tiles_per_split if tree else _tiles_per_split(op), TRACE_TILES)
    iv = wide_intervals(raw[:, :TRACE_TILES], n_tiles)
    top = raw[0, :n_tiles, 0].astype(np.float64)
    return dict(
        impl="wgmma_wide",
        **_header(context, heads, nodes, page_size, d),
        splits=op.plan.splits,
        traced_split=split,
        tiles=int(n_tiles),
        median_cycles=summarize(iv),
        top_cycles=(top - top[0]).tolist(),
        clock=wide_clock(raw[:, TRACE_TILES]),
        events=raw[:, :n_tiles, : len(WIDE_EVENTS[0])].tolist(),
        kernel_events=raw[:, TRACE_TILES, :7].tolist(),
    )
