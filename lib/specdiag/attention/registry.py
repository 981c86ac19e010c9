"""The native kernels, one row each, and the rule ``impl="auto"`` follows.

Adding a kernel is one ``KernelSpec`` row here plus its ``kernels/<source>.cu``, which exports
the same launch shape (``TV_EXPORT_CONFIG``; the loader and a CPU test compare the two). A row
may be a variant of another's source: its ``defines`` set the source's compile-time parameters.
Why ``auto`` picks what it picks, with the measurements: ``docs/kernel_notes.md``, "Current state".
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "KernelSpec",
    "KERNELS",
    "MERGE",
    "SMEM_PER_BLOCK",
    "hopper_auto",
    "portable_kernel",
    "auto_kernel",
    "resolve_impl",
]


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
    smem_bytes: int  # dynamic shared memory per CTA (the source's Smem struct)
    ablations: bool = False  # built with TV_SKIP stage switches (specdiag.bench.ablation)
    defines: tuple[tuple[str, int], ...] = ()  # compile-time parameters of a variant of ``source``

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
            "mma",
            "tree_verify_mma",
            "tree_verify_partial_mma",
            256,
            64,
            32,
            "native",
            "mma.sync, 64 rows x 32 keys (GPUs with 227 KB of shared memory: sm_90, sm_100)",
            207360,
        ),
        KernelSpec(
            "mma_k16",
            "tree_verify_mma",
            "tree_verify_partial_mma",
            256,
            64,
            16,
            "native_mma_k16",
            "mma.sync, 64 rows x 16 keys (163 KB: sm_80, sm_87)",
            143104,
            defines=(("TV_MMA_ROW_GROUPS", 4), ("TV_MMA_KEYS", 16)),
        ),
        KernelSpec(
            "mma_small",
            "tree_verify_mma",
            "tree_verify_partial_mma",
            128,
            32,
            16,
            "native_mma_small",
            "mma.sync, 32 rows x 16 keys (99 KB: sm_86, sm_89, sm_120)",
            99584,
            defines=(("TV_MMA_ROW_GROUPS", 2), ("TV_MMA_KEYS", 16)),
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
            205824,
        ),
        KernelSpec(
            "wgmma_seesaw",
            "tree_verify_seesaw",
            "tree_verify_partial_seesaw",
            384,
            64,
            64,
            "native_seesaw",
            "wgmma seesaw: two math warpgroups take the tiles in pairs, one loads (sm_90a)",
            232448,
            ablations=True,
        ),
        KernelSpec(
            "wgmma_wide",
            "tree_verify_wide",
            "tree_verify_partial_wide",
            384,
            72,
            64,
            "native_wide",
            "wgmma, transposed products: 72 query rows per CTA, each key read once per request (sm_90a)",
            232448,
            ablations=True,
        ),
    )
}
MERGE = KernelSpec(
    "merge", "tree_verify_merge", "tree_verify_merge", 128, 1, 0, "merge", "log-sum-exp merge of the split partials", 0
)

# the most dynamic shared memory one CTA may opt into, by compute capability (CUDA programming
# guide, "Technical Specifications per Compute Capability")
SMEM_PER_BLOCK = {
    (8, 0): 166912,
    (8, 6): 101376,
    (8, 7): 166912,
    (8, 9): 101376,
    (9, 0): 232448,
    (10, 0): 232448,
    (10, 3): 232448,
    (12, 0): 101376,
    (12, 1): 101376,
}
PORTABLE = ("mma", "mma_k16", "mma_small")  # largest tiles first

# auto on sm_90, by query rows per request and the longest prefix: the seesaw kernel from these
# prefixes on, the wgmma kernel (lower fixed cost) below them
AUTO_SEESAW_FEWEST_MIN_PREFIX = 65536  # up to 64 rows
AUTO_SEESAW_FEW_MIN_PREFIX = 16384  # 65-80 rows: data/history/wide_kernel_h100_run29.json, data/peers_h200.json
AUTO_SEESAW_MIN_PREFIX = 4096  # more rows
AUTO_SEESAW_MIN_ROWS = 2048  # from here at any prefix
# the wide kernel from here, for requests of 65-72 rows (one CTA where the 64-row kernels take two)
# and 129-144 (two where they take three): data/peers_h200.json
AUTO_WIDE_MIN_PREFIX = 32768


def hopper_auto(rows: int | None, max_prefix: int | None) -> str:
    """The kernel ``auto`` picks on sm_90 for ``rows`` query rows per request and the longest
    prefix (either may be unknown: None). Needs no GPU: notebooks apply it to recordings."""
    wide, narrow = KERNELS["wgmma_wide"].rows_per_cta, KERNELS["wgmma_seesaw"].rows_per_cta
    wide_rows = rows is not None and (narrow < rows <= wide or 2 * narrow < rows <= 2 * wide)
    if wide_rows and max_prefix is not None and max_prefix >= AUTO_WIDE_MIN_PREFIX:
        return "wgmma_wide"
    if rows is not None and rows <= 80:  # an unknown prefix gets the short-prefix choice
        min_prefix = AUTO_SEESAW_FEWEST_MIN_PREFIX if rows <= 64 else AUTO_SEESAW_FEW_MIN_PREFIX
        return "wgmma_seesaw" if max_prefix is not None and max_prefix >= min_prefix else "wgmma"
    if rows is not None and rows >= AUTO_SEESAW_MIN_ROWS:
        return "wgmma_seesaw"
    return "wgmma" if max_prefix is not None and max_prefix < AUTO_SEESAW_MIN_PREFIX else "wgmma_seesaw"


def portable_kernel(smem_per_block: int) -> str:
    """The portable variant with the largest tiles whose shared memory fits ``smem_per_block``."""
    for name in PORTABLE:
        if KERNELS[name].smem_bytes <= smem_per_block:
            return name
    raise ValueError(
        f"no native kernel fits {smem_per_block} bytes of shared memory per CTA "
        f"(the smallest, {PORTABLE[-1]!r}, needs {KERNELS[PORTABLE[-1]].smem_bytes})"
    )


def auto_kernel(
    capability: tuple[int, int],
    rows: int | None = None,
    max_prefix: int | None = None,
    smem_per_block: int | None = None,
) -> str:
    """The kernel ``auto`` picks on a GPU of compute ``capability``: the Hopper kernels on sm_90,
    elsewhere the mma.sync variant that fits the GPU's shared memory per CTA (``smem_per_block``,
    by default ``SMEM_PER_BLOCK``'s entry; an unknown GPU is assumed to have 99 KB)."""
    if tuple(capability) == (9, 0):
        return hopper_auto(rows, max_prefix)
    return portable_kernel(smem_per_block or SMEM_PER_BLOCK.get(tuple(capability), 101376))


def resolve_impl(impl: str, device=None, max_prefix: int | None = None, rows: int | None = None) -> str:
    """``impl`` itself if it names a kernel, or ``auto``'s pick on ``device``."""
    if impl == "auto":
        import torch

        props = torch.cuda.get_device_properties(device)
        smem = getattr(props, "shared_memory_per_block_optin", None)
        return auto_kernel((props.major, props.minor), rows, max_prefix, smem)
    if impl not in KERNELS:
        raise ValueError(f"impl must be 'auto' or one of {tuple(KERNELS)}, got {impl!r}")
    return impl
