"""Where a kernel's time goes: the kernel rebuilt with one stage left out at a time (the
``TV_SKIP`` switches of its source; results wrong by design), each variant timed on the same
launches as a fraction of the full kernel."""

from __future__ import annotations

import torch

from ..attention.registry import KERNELS

__all__ = [
    "SKIP_QK",
    "SKIP_PV",
    "SKIP_SOFTMAX",
    "SKIP_LOADS",
    "SKIP_PAGES",
    "SKIP_MASK",
    "VARIANTS",
    "ABLATION_SHAPES",
    "ablation_shapes",
    "ablate",
]

# tvg::Skip in kernels/tree_verify_sm90.cuh (the seesaw and the wide kernel obey it)
SKIP_QK, SKIP_PV, SKIP_SOFTMAX, SKIP_LOADS, SKIP_PAGES, SKIP_MASK = 1, 2, 4, 8, 16, 32
VARIANTS = {
    "full": 0,
    "no_qk": SKIP_QK,
    "no_pv": SKIP_PV,
    "no_softmax": SKIP_SOFTMAX,
    "no_loads": SKIP_LOADS,
    "no_mma": SKIP_QK | SKIP_PV,
    "loads_only": SKIP_QK | SKIP_PV | SKIP_SOFTMAX,
    "no_page_lookup": SKIP_PAGES,  # prefix token n from pool row n: the page table left unread
    "no_mask": SKIP_MASK,  # every tile a whole prefix tile: the masking branch gone
}
ABLATION_SHAPES = ((65536, 64, 257), (185000, 8, 65), (185000, 8, 9))
_WIDE_SHAPES = ((185000, 8, 9), (65536, 8, 9))  # the wide kernel's: one CTA for 72 rows


def ablation_shapes(impl: str) -> tuple:
    """The shapes ``ablate`` takes for ``impl`` when none are given (context, heads, nodes)."""
    return _WIDE_SHAPES if impl == "wgmma_wide" else ABLATION_SHAPES


def ablate(
    shapes=None,
    impl: str = "wgmma_seesaw",
    rep_ms: float = 30.0,
    page_sizes=(64,),
    progress=print,
) -> list[dict]:
    """Time every ``VARIANTS`` build of ``impl`` (a kernel with ``ablations``) on ``shapes``
    (context, heads, nodes; default ``ablation_shapes(impl)``) at each of ``page_sizes``."""
    from .timing import Rotation, time_rotating

    spec = KERNELS.get(impl)
    if spec is None or not spec.ablations:
        raise ValueError(
            f"no stage switches in {impl!r}; kernels with them: {[k for k, s in KERNELS.items() if s.ablations]}"
        )
    if spec.hopper_only and torch.cuda.get_device_capability() != (9, 0):
        raise RuntimeError(f"the {impl} kernel needs an sm_90 GPU")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for ctx, h, t in shapes or ablation_shapes(impl):
        for ps in page_sizes:
            rot = Rotation(ctx, ps, t, h, l2, seed=ctx + h + t)
            full = None
            for name, skip in VARIANTS.items():
                ops = rot.native_ops(impl=impl, defines={"TV_SKIP": skip})
                ms = time_rotating([op.run for op in ops], rep_ms)
                full = full or ms
                row = dict(impl=impl, context=ctx, heads=h, nodes=t, page_size=ps, variant=name, ms=ms)
                rows.append(row | {"vs_full": ms / full})
                progress(f"{impl} ctx={ctx} H={h} T={t} ps={ps} {name:>14}: {ms:.3f} ms ({ms / full:.2f} of full)")
                del ops
            del rot
            torch.cuda.empty_cache()
    return rows
