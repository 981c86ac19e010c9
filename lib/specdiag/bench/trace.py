"""Per-tile timeline of the seesaw kernel: a ``TV_TRACE=1`` build records ``clock64()`` at each
event of its first tiles in CTA (0, 0, 0) (``tvsee::Event`` in kernels/tree_verify_seesaw.cu);
``intervals`` turns the events into the waits of each tile, in SM cycles."""

from __future__ import annotations

import numpy as np

__all__ = [
    "TRACE_TILES",
    "TRACE_SHAPES",
    "EVENTS",
    "LOADER_EVENTS",
    "KERNEL_EVENTS",
    "intervals",
    "phases",
    "summarize",
    "trace_seesaw",
]

TRACE_TILES = 128  # tvsee::TRACE_TILES; the buffer has one more row, the whole-kernel events
TRACE_SHAPES = ((32768, 64, 65), (185000, 8, 9))  # many query rows; the deployment's
EVENTS = ("top", "other_p", "part0", "parts_all", "qk_done", "p_arrived", "pv_issued")  # tvsee::Event
LOADER_EVENTS = ("wait_stage", "stage_free", "issued")  # the loader's first warp in slots 0..2, its last in 3..5
KERNEL_EVENTS = ("entry", "loop_end", "done")  # tvsee::KernelEvent, in row TRACE_TILES

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
    ``raw`` [3, TRACE_TILES, 8] (uint64): each tile's events come from its owner, t % 2."""
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


def trace_seesaw(
    context: int, heads: int, nodes: int, page_size: int = 1, defines=None, seed: int = 0, prefix_splits=None
) -> dict:
    """Run the traced seesaw build once (after a warm-up) on one request and return its events,
    per-tile intervals and their medians."""
    import torch

    from .. import kernels
    from ..attention.native import NativeTreeVerify
    from ..cost import SOFTMAX_SCALE
    from .timing import Rotation

    d = {**(defines or {}), "TV_TRACE": 1}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rot = Rotation(context, page_size, nodes, heads, l2, seed=seed, max_sets=2)
    opts = dict(scale=SOFTMAX_SCALE, check=False, impl="wgmma_seesaw", defines=d, prefix_splits=prefix_splits)
    op = NativeTreeVerify(**rot.inputs(0), **opts)
    op.run()
    mod = kernels.load_module("tree_verify_seesaw", torch.cuda.current_device(), d)
    import pycuda.driver as cuda

    ptr, size = mod.get_global("tv_trace")
    raw = np.zeros((3, TRACE_TILES + 1, 8), dtype=np.uint64)
    if raw.nbytes != size:
        raise RuntimeError(f"tv_trace is {size} bytes in the module, {raw.nbytes} expected: TRACE_TILES out of step")
    NativeTreeVerify(**rot.inputs(1), **opts).run()
    torch.cuda.synchronize()
    cuda.memset_d8(ptr, 0, size)
    op.run()
    torch.cuda.synchronize()
    cuda.memcpy_dtoh(raw, ptr)
    n_tiles = op.plan.prefix_tiles_per_split if op.plan.n_prefix_splits else op.plan.tree_tiles_per_split
    iv = intervals(raw[:, :TRACE_TILES], n_tiles)
    part0 = raw[0, 0, EVENTS.index("part0")]  # tile 0's first part usable (its owner, warpgroup 0); 0: not recorded
    first_part0 = float(part0) if part0 else float("nan")
    return dict(
        context=context,
        heads=heads,
        nodes=nodes,
        page_size=page_size,
        defines=d,
        prefix_splits=op.plan.n_prefix_splits,
        tiles=int(min(n_tiles, TRACE_TILES)),
        median_cycles=summarize(iv),
        phases=phases(raw[:, TRACE_TILES], first_part0),
        events=raw[:, : min(n_tiles, TRACE_TILES), :7].tolist(),
        kernel_events=raw[:, TRACE_TILES, : len(KERNEL_EVENTS)].tolist(),
    )
