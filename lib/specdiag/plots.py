"""Matplotlib figures for the notebooks (each returns the Figure)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from .attention.registry import KERNELS

__all__ = ["step_time_vs_context", "gap_vs_context", "speedup_bars", "SERIES"]

# The series a figure may show, in legend order: the baseline, what auto runs, the portable
# kernel, the naive path. Other implementations in a frame are left out.
SERIES = {
    "triton": ("tab:red", "Triton extend, page_size=1 (the baseline)"),
    "native_auto": ("tab:blue", "native, the kernel impl='auto' picks (page_size=64)"),
    KERNELS["mma"].label: ("tab:green", f"native {KERNELS['mma'].title} (page_size=64)"),
    "torch": ("tab:gray", "naive torch (gather + matmul)"),
}


def _impl_lines(ax, df, heads: int, nodes: int, values) -> None:
    """One line per known series for a (heads, nodes) shape: ``values(group)`` against context."""
    sel = df[(df.heads == heads) & (df.nodes == nodes) & df.ms.notna()]
    for impl, (color, label) in SERIES.items():
        g = sel[sel.impl == impl]
        if len(g):
            ax.plot(g.context / 1024, values(g), "o-", color=color, label=label)


def _titled(title: str, source: str | None) -> str:
    """The title, with where the numbers come from (``data.provenance``) on a second line."""
    return f"{title}\n({source})" if source else title


def _finish(fig, ax):
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def step_time_vs_context(
    df, heads: int, nodes: int, incident: dict | None = None, layers: int = 61, source: str | None = None
):
    """61-layer attention time per verify step against context, per implementation."""
    fig, ax = plt.subplots(figsize=(9, 4))
    _impl_lines(ax, df, heads, nodes, lambda g: g.ms * layers)
    if incident:
        ctx = sorted(incident)
        ax.plot(
            [c / 1024 for c in ctx], [incident[c] for c in ctx], "k*--", ms=10, label="deployment step time (reported)"
        )
    ax.set_xlabel("context (k tokens)")
    ax.set_ylabel(f"{layers}-layer verify attention per step (ms)")
    ax.set_yscale("log")
    ax.set_title(_titled(f"{heads} heads, {nodes}-node tree", source))
    return _finish(fig, ax)


def gap_vs_context(df, heads: int, nodes: int, source: str | None = None):
    """Measured time over the roofline floor (x_floor column from analysis.add_roofline)."""
    fig, ax = plt.subplots(figsize=(9, 4))
    _impl_lines(ax, df, heads, nodes, lambda g: g.x_floor)
    ax.axhline(1.0, color="k", ls=":", lw=1, label="the floor")
    ax.set_yscale("log")
    ax.set_xlabel("context (k tokens)")
    ax.set_ylabel("time / max(bytes/BW, FLOPs/GEMM rate)")
    ax.set_title(_titled(f"distance from the roofline floor: {heads} heads, {nodes}-node tree", source))
    return _finish(fig, ax)


def speedup_bars(table, context: int, source: str | None = None):
    """Baseline / native per (heads, nodes) at one context."""
    sel = table[table.context == context]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"H={h}, T={t}" for h, t in zip(sel.heads, sel.nodes)]
    ax.bar(labels, sel.speedup, color="tab:green")
    for i, v in enumerate(sel.speedup):
        ax.text(i, v, f"{v:.0f}x", ha="center", va="bottom")
    ax.set_ylabel("Triton baseline time / native time")
    ax.set_title(_titled(f"speed-up at {context:,} tokens of context", source))
    fig.tight_layout()
    return fig
