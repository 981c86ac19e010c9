"""Matplotlib figures for the notebooks (each returns the Figure)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from .attention.registry import KERNELS

__all__ = [
    "titled",
    "legend_outside",
    "step_time_vs_context",
    "gap_vs_context",
    "speedup_bars",
    "peers_vs_context",
    "cta_lanes",
    "SERIES",
    "PEER_SERIES",
]

# The series a figure may show, in legend order: the baseline, what auto runs, the portable
# kernel, the naive path. Other implementations in a frame are left out.
SERIES = {
    "triton": ("tab:red", "Triton extend, page_size=1 (the baseline)"),
    "native_auto": ("tab:blue", "native, the kernel impl='auto' picks (page_size=64)"),
    KERNELS["mma"].label: ("tab:green", "native, the portable mma.sync kernel (page_size=64)"),
    "torch": ("tab:gray", "naive torch (gather + matmul)"),
}


# data/peers_h200.json's series: the deployment's own kernel, ours, the peer, the floor
PEER_SERIES = {
    "sglang": ("tab:red", "sglang 0.5.23 Triton extend, page_size=1 (what the deployment ran)"),
    "native": ("tab:blue", "native, impl='auto', page_size=1 (the fix)"),
    "flashmla": ("tab:orange", "FlashMLA prefix call alone (no tree block, page 64)"),
    "flashmla_cascade": ("tab:purple", "FlashMLA + tree block + merge in torch (page 64)"),
    "flashmla_sparse": ("tab:brown", "FlashMLA sparse prefill, whole verify (page_size=1)"),
}


def _impl_lines(ax, df, heads: int, nodes: int, values, series=None) -> None:
    """One line per known series for a (heads, nodes) shape: ``values(group)`` against context."""
    sel = df[(df.heads == heads) & (df.nodes == nodes) & df.ms.notna()]
    for impl, (color, label) in (series or SERIES).items():
        g = sel[sel.impl == impl]
        if len(g):
            ax.plot(g.context / 1024, values(g), "o-", color=color, label=label)


def titled(title: str, source: str | None) -> str:
    """The title, with where the numbers come from (``data.provenance``) on a second line."""
    return f"{title}\n({source})" if source else title


def legend_outside(ax, fontsize: int = 8, gap: float = 1.02) -> None:
    """The legend to the right of the axes, clear of the data."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(gap, 1.0), borderaxespad=0)


def _finish(fig, ax):
    ax.grid(alpha=0.3, which="both")
    legend_outside(ax)
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
    ax.set_title(titled(f"{heads} heads, {nodes}-node tree", source))
    return _finish(fig, ax)


def gap_vs_context(df, heads: int, nodes: int, source: str | None = None):
    """Measured time over the roofline floor (x_floor column from analysis.add_roofline)."""
    fig, ax = plt.subplots(figsize=(9, 4))
    _impl_lines(ax, df, heads, nodes, lambda g: g.x_floor)
    ax.axhline(1.0, color="k", ls=":", lw=1, label="the floor")
    ax.set_yscale("log")
    ax.set_xlabel("context (k tokens)")
    ax.set_ylabel("time / max(bytes/BW, FLOPs/GEMM rate)")
    ax.set_title(titled(f"distance from the roofline floor: {heads} heads, {nodes}-node tree", source))
    return _finish(fig, ax)


def speedup_bars(table, context: int, source: str | None = None):
    """Baseline / native per (heads, nodes) at one context."""
    sel = table[table.context == context]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"H={h}, T={t}" for h, t in zip(sel.heads, sel.nodes)]
    ax.bar(labels, sel.speedup, color="tab:green")
    for i, v in enumerate(sel.speedup):
        ax.text(i, v, f"{v:.0f}x", ha="center", va="bottom")
    ax.margins(y=0.12)  # room above the tallest bar for its label
    ax.set_ylabel("Triton baseline time / native time")
    ax.set_title(titled(f"speed-up at {context:,} tokens of context", source))
    fig.tight_layout()
    return fig


def peers_vs_context(df, heads: int, nodes: int, source: str | None = None):
    """Per-layer time against context beside the real peers, with the floor (df: a peers
    recording with ``analysis.add_roofline``'s columns)."""
    fig, ax = plt.subplots(figsize=(11, 4))
    _impl_lines(ax, df, heads, nodes, lambda g: g.ms * 1e3, series=PEER_SERIES)
    fl = df[(df.heads == heads) & (df.nodes == nodes) & (df.impl == "native")].sort_values("context")
    ax.plot(fl.context / 1024, fl.floor_ms * 1e3, "k:", label="floor: max(bytes/BW, FLOPs/GEMM), same run")
    ax.set_yscale("log")
    ax.set_xlabel("context (k tokens)")
    ax.set_ylabel("one layer's verify attention (us)")
    ax.set_title(titled(f"beside the real peers: {heads} heads, {nodes}-node tree", source))
    return _finish(fig, ax)


def cta_lanes(traces: list[dict], source: str | None = None):
    """Each SM's CTAs over one launch, a panel per trace (``bench.trace.trace_pairs`` results with
    their ``ctas``): a bar from each CTA's start to its end, prefix and tree CTAs apart."""
    fig, axes = plt.subplots(1, len(traces), figsize=(5.5 * len(traces), 4.5), squeeze=False)
    kinds = (("prefix", "tab:blue", "a prefix split's CTA"), ("tree", "tab:orange", "a tree CTA"))
    for ax, r in zip(axes[0], traces):
        rows, n = r["ctas"]["rows"], r["prefix_splits"]
        for kind, color, label in kinds:
            sel = [x for x in rows if (x[0] >= n) == (kind == "tree")]
            ax.hlines(
                [x[1] for x in sel],
                [x[2] / 1e3 for x in sel],
                [x[4] / 1e3 for x in sel],
                color=color,
                lw=1.5,
                label=label,
            )
        ax.set_xlabel("us after the launch's first CTA starts")
        ax.set_ylabel("SM")
        ax.set_title(f"{r['context']:,} tokens x {r['heads']} heads x {r['nodes']} nodes", fontsize=10)
        ax.grid(alpha=0.3)
    legend_outside(axes[0][-1])
    fig.suptitle(titled("every CTA of one launch, by SM", source), fontsize=10)
    fig.tight_layout()
    return fig
