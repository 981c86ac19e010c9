"""The native kernels, one row each, and the rule ``impl="auto"`` follows.

Adding a kernel is one ``KernelSpec`` row here plus its ``kernels/<source>.cu``, which exports
the same launch shape (``TV_EXPORT_CONFIG``; the loader and a CPU test compare the two).
Why ``auto`` picks what it picks, with the measurements: ``docs/kernel_notes.md``, "Current state".
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KernelSpec", "KERNELS", "MERGE", "hopper_auto", "auto_kernel", "resolve_impl"]


@dataclass(frozen=True)
class KernelSpec:
    name: str  # the ``impl`` name
    source: str  # kernels/<source>.cu
    entry: str  # its extern "C" entry point
    threads: int  # per CTA
    rows_per_cta: int  # query rows per CTA
    keys_per_tile: int  # keys per tile (the launch plan's unit)
    label: str  # the sweep's and the figures' name for it
    title: str  # one line for tables and figures
    ablations: bool = False  # built with TV_SKIP stage switches (specdiag.bench.ablation)

    @property
    def arch(self) -> str:
        """The target the source asks for (``// specdiag-arch:``; sm_90 where it names none)."""
        from .. import kernels

        return kernels.kernel_arch(self.source)

    @property
    def hopper_only(self) -> bool:
        return self.arch == "sm_90a"


KERNELS = {
    k.name: k
    for k in (
        KernelSpec(
            "mma", "tree_verify_mma", "tree_verify_partial_mma", 256, 64, 32, "native", "mma.sync, any GPU from sm_80"
        ),
        KernelSpec(
            "wgmma",
            "tree_verify_wgmma",
            "tree_verify_partial_wgmma",
            256,
            64,
            32,
            "native_wgmma",
            "wgmma, two symmetric warpgroups (sm_90a; short prefixes)",
        ),
        KernelSpec(
            "wgmma_seesaw",
            "tree_verify_seesaw",
            "tree_verify_partial_seesaw",
            384,
            64,
            64,
            "native_seesaw",
            "wgmma seesaw: two math warpgroups take turns, one loads (sm_90a)",
            ablations=True,
        ),
    )
}
MERGE = KernelSpec(
    "merge", "tree_verify_merge", "tree_verify_merge", 128, 1, 0, "merge", "log-sum-exp merge of the split partials"
)

# auto on sm_90, by query rows per request and the longest prefix: the seesaw kernel from these
# prefixes on, the wgmma kernel (lower fixed cost) below them
AUTO_SEESAW_FEWEST_MIN_PREFIX = 65536  # up to 64 rows
AUTO_SEESAW_FEW_MIN_PREFIX = 32768  # 65-80 rows
AUTO_SEESAW_MIN_PREFIX = 4096  # more rows
AUTO_SEESAW_MIN_ROWS = 2048  # from here at any prefix


def hopper_auto(rows: int | None, max_prefix: int | None) -> str:
    """The kernel ``auto`` picks on sm_90 for ``rows`` query rows per request and the longest
    prefix (either may be unknown: None). Needs no GPU: notebooks apply it to recordings."""
    if rows is not None and rows <= 80:  # an unknown prefix gets the short-prefix choice
        min_prefix = AUTO_SEESAW_FEWEST_MIN_PREFIX if rows <= 64 else AUTO_SEESAW_FEW_MIN_PREFIX
        return "wgmma_seesaw" if max_prefix is not None and max_prefix >= min_prefix else "wgmma"
    if rows is not None and rows >= AUTO_SEESAW_MIN_ROWS:
        return "wgmma_seesaw"
    return "wgmma" if max_prefix is not None and max_prefix < AUTO_SEESAW_MIN_PREFIX else "wgmma_seesaw"


def auto_kernel(capability: tuple[int, int], rows: int | None = None, max_prefix: int | None = None) -> str:
    """The kernel ``auto`` picks on a GPU of compute ``capability``: the Hopper kernels on sm_90,
    the portable mma.sync kernel elsewhere."""
    return hopper_auto(rows, max_prefix) if tuple(capability) == (9, 0) else "mma"


def resolve_impl(impl: str, device=None, max_prefix: int | None = None, rows: int | None = None) -> str:
    """``impl`` itself if it names a kernel, or ``auto``'s pick on ``device``."""
    if impl == "auto":
        import torch

        return auto_kernel(torch.cuda.get_device_capability(device), rows, max_prefix)
    if impl not in KERNELS:
        raise ValueError(f"impl must be 'auto' or one of {tuple(KERNELS)}, got {impl!r}")
    return impl
