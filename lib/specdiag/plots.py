"""Matplotlib figures for the notebooks (each returns the Figure)."""

from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["step_time_vs_context", "gap_vs_context", "speedup_bars", "roofline_fraction"]

_STYLE = {"triton": ("tab:red", "Triton extend, page_size=1 (baseline)"), "native": ("tab:green", "native CUDA mma.sync, page_size=64"),
          "native_ps1": ("tab:olive", "native CUDA mma.sync, page_size=1"), "torch": ("tab:gray", "naive torch (gather + matmul)"),
          "native_wgmma": ("tab:blue", "native CUDA wgmma, page_size=64"), "native_wgmma_ps1": ("tab:cyan", "native CUDA wgmma, page_size=1"),
          "native_wgmma_tma": ("tab:purple", "native CUDA wgmma, TMA tile loads, page_size=64"),
          "native_ws": ("tab:orange", "native CUDA wgmma, warp-specialised, page_size=64"),
          "native_ws_ps1": ("gold", "native CUDA wgmma, warp-specialised, page_size=1"),
          "native_ws_la1": ("tab:brown", "warp-specialised, Q K^T 1 tile ahead"),
          "native_ws_la2": ("tab:pink", "warp-specialised, Q K^T 2 tiles ahead"),
          "native_ws64": ("darkred", "native CUDA wgmma, warp-specialised, 64-key tiles, page_size=64"),
          "native_ws64_ps1": ("salmon", "native CUDA wgmma, warp-specialised, 64-key tiles, page_size=1"),
          "native_seesaw": ("navy", "native CUDA wgmma, two math warpgroups taking turns (seesaw), page_size=64"),
          "native_seesaw_ps1": ("slateblue", "native CUDA wgmma, seesaw, page_size=1"),
          "native_t": ("tab:olive", "native CUDA wgmma, transposed (query rows in N), page_size=64"),
          "native_t_ps1": ("yellowgreen", "native CUDA wgmma, transposed, page_size=1"),
          "native_auto": ("black", "native CUDA, the kernel impl='auto' picks, page_size=64")}


def _label(impl):
    return _STYLE.get(impl, (None, impl))


def _impl_lines(ax, df, heads: int, nodes: int, values) -> None:
    """One line per implementation for a (heads, nodes) shape: ``values(group)`` against context."""
    sel = df[(df.heads == heads) & (df.nodes == nodes) & df.ms.notna()]
    for impl, g in sel.groupby("impl"):
        color, label = _label(impl)
        ax.plot(g.context / 1024, values(g), "o-", color=color, label=label)


def step_time_vs_context(df, heads: int, nodes: int, incident: dict | None = None, layers: int = 61):
    """61-layer attention time per verify step against context, per implementation."""
    fig, ax = plt.subplots(figsize=(7, 4))
    _impl_lines(ax, df, heads, nodes, lambda g: g.ms * layers)
    if incident:
        ctx = sorted(incident)
        ax.plot([c / 1024 for c in ctx], [incident[c] for c in ctx], "k*--", ms=10, label="deployment step time (reported)")
    ax.set_xlabel("context (k tokens)")
    ax.set_ylabel(f"{layers}-layer verify attention per step (ms)")
    ax.set_yscale("log")
    ax.set_title(f"{heads} heads, {nodes}-node tree")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def gap_vs_context(df, heads: int, nodes: int):
    """Measured time over the roofline floor (x_floor column from analysis.add_roofline)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    _impl_lines(ax, df, heads, nodes, lambda g: g.x_floor)
    ax.axhline(1.2, color="k", ls=":", lw=1, label="1.2x of the floor (target)")
    ax.set_yscale("log")
    ax.set_xlabel("context (k tokens)")
    ax.set_ylabel("time / max(bytes/BW, FLOPs/GEMM rate)")
    ax.set_title(f"distance from the roofline floor: {heads} heads, {nodes}-node tree")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def speedup_bars(table, context: int):
    """Baseline / native per (heads, nodes) at one context."""
    sel = table[table.context == context]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"H={h}, T={t}" for h, t in zip(sel.heads, sel.nodes)]
    ax.bar(labels, sel.speedup, color="tab:green")
    for i, v in enumerate(sel.speedup):
        ax.text(i, v, f"{v:.0f}x", ha="center", va="bottom")
    ax.set_ylabel("Triton baseline time / native time")
    ax.set_title(f"speed-up at {context:,} tokens of context")
    fig.tight_layout()
    return fig


def roofline_fraction(df, impl: str = "native"):
    """Achieved TB/s and TFLOP/s of one implementation against the measured ceilings."""
    sel = df[(df.impl == impl) & df.ms.notna()]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for (h, t), g in sel.groupby(["heads", "nodes"]):
        axes[0].plot(g.context / 1024, g.tflop_s, "o-", label=f"H={h}, T={t}")
        axes[1].plot(g.context / 1024, g.tb_s, "o-", label=f"H={h}, T={t}")
    axes[0].set_ylabel("TFLOP/s")
    axes[1].set_ylabel("TB/s (minimum bytes)")
    for ax in axes:
        ax.set_xlabel("context (k tokens)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{impl}: achieved rates")
    fig.tight_layout()
    return fig
