"""The notebooks' explorers: controls (ipywidgets) over a pure view of recorded data.

Each explorer is a ``*_view(...)`` function, state in and a matplotlib Figure plus a line of text
out (what the tests check), and a builder that wires controls to it. ``Explorer.static()`` is the
view at the default state: the notebooks show it too, so papermill's and the HTML export's
readers (who get no live widget) see the same figure.

* ``commit_explorer`` (01): drafter x text x fault -> commit length against context;
  ``ddtree_explorer``: the tree the DDTree builder makes for a budget, the accepted path marked.
* ``timeline_explorer`` (02): one phase of the probe timeline, the chosen counters.
* ``context_explorer`` (03): any context x heads x nodes -> the bytes, the floor, the measured
  baseline and fix (interpolated between measured contexts) and the gap arithmetic.
* ``shape_explorer`` (05): a measured shape -> our kernel, the baseline, the peers and the floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .cost import LAYERS, floor_ms, kv_bytes_per_step
from .plots import legend_outside, titled

__all__ = [
    "Explorer",
    "commit_view",
    "commit_explorer",
    "ddtree_view",
    "ddtree_explorer",
    "timeline_view",
    "timeline_explorer",
    "context_view",
    "context_explorer",
    "shape_view",
    "shape_explorer",
]


@dataclass
class Explorer:
    """Controls + a view. ``update()`` redraws into ``output``; ``static()`` is the default view."""

    controls: dict
    view: Callable
    title: str

    def state(self) -> dict:
        return {name: c.value for name, c in self.controls.items()}

    def static(self):
        fig, text = self.view(**self.state())
        print(text)
        return fig

    def widget(self):
        import ipywidgets as w
        from IPython.display import display

        out = w.Output()

        def update(_=None):
            with out:
                out.clear_output(wait=True)
                fig, text = self.view(**self.state())
                print(text)
                display(fig)
                plt.close(fig)

        for c in self.controls.values():
            c.observe(update, names="value")
        update()
        return w.VBox([w.HTML(f"<b>{self.title}</b>"), w.HBox(list(self.controls.values())), out])


def _dropdown(options, value, description):
    import ipywidgets as w

    options = list(options)
    return w.Dropdown(options=options, value=value if value in options else options[0], description=description)


# ---- 01: commit length --------------------------------------------------------------------------


def commit_view(rows: pd.DataFrame, drafter: str, text: str, faults=("healthy",), source: str | None = None):
    """Mean commit length per step against context, one line per fault."""
    sel = rows[(rows.drafter == drafter) & (rows.text == text)]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for fault in faults:
        g = sel[sel.fault == fault].sort_values("context")
        ax.plot(g.context / 1024, g.mean_commit, "o-", label=fault)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (k tokens)")
    ax.set_ylabel("tokens committed per step")
    ax.set_ylim(0, max(1.0, float(sel.mean_commit.max()) + 1) if len(sel) else 10)
    ax.set_title(titled(f"{drafter} drafter, {text} text", source))
    legend_outside(ax)
    fig.tight_layout()
    healthy = sel[sel.fault == "healthy"].mean_commit
    note = f"healthy: {healthy.min():.2f} to {healthy.max():.2f} tokens per step" if len(healthy) else "no healthy run"
    return fig, f"{drafter}, {text}: {note}"


def commit_explorer(rows: pd.DataFrame, source: str | None = None) -> Explorer:
    import ipywidgets as w

    faults = sorted(rows.fault.unique(), key=lambda f: (f != "healthy", f))
    controls = dict(
        drafter=_dropdown(sorted(rows.drafter.unique()), "block", "drafter"),
        text=_dropdown(sorted(rows.text.unique()), "predictable", "text"),
        faults=w.SelectMultiple(options=faults, value=tuple(faults), description="faults"),
    )
    return Explorer(
        controls, lambda **s: commit_view(rows, source=source, **s), "commit length: drafter x text x fault"
    )


# ---- 01: one DDTree step ------------------------------------------------------------------------


def _layout(tree) -> dict[int, tuple[float, float]]:
    """x = depth, y = order within the depth (children under their parents, in pop order)."""
    depth = tree.depths.tolist()
    pos, seen = {}, {}
    for i in range(tree.num_nodes):
        d = depth[i]
        pos[i] = (d, -seen.get(d, 0))
        seen[d] = seen.get(d, 0) + 1
    return pos


def ddtree_view(budget: int = 8, seed: int = 0, vocab: int = 6, depth: int = 6, sharpness: float = 2.0):
    """The tree ``build_ddtree`` makes for ``budget`` from seeded draft log-probabilities, verified
    greedily against a target that agrees with the drafter's top token most of the time; the
    accepted path in red."""
    import torch

    from .tree import build_ddtree, verify_greedy

    g = torch.Generator().manual_seed(seed)
    logprobs = torch.log_softmax(torch.randn(depth, vocab, generator=g) * sharpness, -1)
    tree = build_ddtree(logprobs, budget=budget)
    # the target: the drafter's favourite at each depth, except a random token with 25% odds
    fav = logprobs.argmax(-1)
    target = torch.zeros(tree.num_nodes, vocab)
    for i in range(tree.num_nodes):
        d = int(tree.depths[i])
        tok = (
            int(fav[d])
            if d < depth and torch.rand(1, generator=g) > 0.25
            else int(torch.randint(vocab, (1,), generator=g))
        )
        target[i, tok] = 1.0
    res = verify_greedy(tree, target)
    path = set([0, *res.accepted_nodes])
    pos = _layout(tree)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i in range(1, tree.num_nodes):
        p = int(tree.parents[i])
        on = i in path and p in path
        ax.plot(
            [pos[p][0], pos[i][0]], [pos[p][1], pos[i][1]], "-", color="tab:red" if on else "0.7", lw=2.5 if on else 1
        )
    for i, (x, y) in pos.items():
        ax.scatter([x], [y], s=260, color="tab:red" if i in path else "white", edgecolors="k", zorder=3)
        ax.text(x, y, "R" if i == 0 else str(int(tree.tokens[i])), ha="center", va="center", fontsize=7, zorder=4)
    ax.set_xlabel("depth (draft position)")
    ax.set_xticks(range(tree.max_depth + 1))
    ax.set_yticks([])
    ax.set_title(
        f"DDTree, budget {budget}: {tree.num_nodes} nodes (R: the root; red: accepted), {res.commit_length} committed"
    )
    fig.tight_layout()
    return fig, f"budget {budget}: accepted path {sorted(path)}, commit length {res.commit_length}"


def ddtree_explorer() -> Explorer:
    import ipywidgets as w

    controls = dict(
        budget=w.IntSlider(value=8, min=1, max=40, description="budget"),
        seed=w.IntSlider(value=0, min=0, max=20, description="seed"),
    )
    return Explorer(controls, ddtree_view, "one DDTree step: the tree for a budget, the accepted path")


# ---- 02: the probe timeline ---------------------------------------------------------------------

COUNTERS = {
    "util_gpu_pct": "nvidia-smi utilization.gpu (%)",
    "gpm_sm_util": "SMs busy (GPM, %)",
    "gpm_any_tensor_util": "tensor pipes (GPM, %)",
    "gpm_dram_bw_util": "DRAM bandwidth (GPM, %)",
    "power_pct": "power (% of limit)",
}


def timeline_view(
    samples: pd.DataFrame, phase: str, counters=("util_gpu_pct", "gpm_sm_util"), source: str | None = None
):
    """The chosen counters over one phase of the probe run."""
    s = samples[samples.phase == phase].copy()
    s["power_pct"] = 100 * s.power_w / s.power_limit_w
    fig, ax = plt.subplots(figsize=(7, 3.5))
    notes = []
    for c in counters:
        if c in s and s[c].notna().any():
            ax.plot(s.t_s - s.t_s.min(), s[c], "o-", ms=3, label=COUNTERS.get(c, c))
            notes.append(f"{COUNTERS.get(c, c)} median {s[c].median():.1f}")
    ax.set_ylim(0, 105)
    ax.set_xlabel("seconds into the phase")
    ax.set_ylabel("%")
    ax.set_title(titled(f"phase: {phase}", source))
    legend_outside(ax)
    fig.tight_layout()
    return fig, f"{phase}: " + "; ".join(notes)


def timeline_explorer(samples: pd.DataFrame, source: str | None = None) -> Explorer:
    import ipywidgets as w

    phases = [p for p in samples.phase.unique() if p]
    controls = dict(
        phase=_dropdown(phases, "baseline", "phase"),
        counters=w.SelectMultiple(
            options=list(COUNTERS), value=("util_gpu_pct", "gpm_sm_util"), description="counters"
        ),
    )
    return Explorer(
        controls, lambda **s: timeline_view(samples, source=source, **s), "the probe timeline, one phase at a time"
    )


# ---- 03: any context ----------------------------------------------------------------------------


def _per_layer_ms(df: pd.DataFrame, impl: str, heads: int, nodes: int, context: int) -> float | None:
    """``impl``'s measured per-layer time at (heads, nodes), interpolated linearly in context
    between measured contexts (extrapolated from the last two beyond them)."""
    g = df[(df.impl == impl) & (df.heads == heads) & (df.nodes == nodes)].sort_values("context")
    if len(g) < 2:
        return None
    x, y = g.context.to_numpy(float), g.ms.to_numpy(float)
    if context > x[-1]:
        return float(y[-1] + (y[-1] - y[-2]) / (x[-1] - x[-2]) * (context - x[-1]))
    return float(np.interp(context, x, y))


def context_view(
    peers: pd.DataFrame,
    ceilings: dict,
    context: int,
    heads: int = 8,
    nodes: int = 9,
    reported: dict | None = None,
    source: str | None = None,
):
    """A step at any context: its KV bytes, the bandwidth floor, the baseline (the real sglang
    kernel) and the fix interpolated from the measured contexts, and the gaps."""
    kv_gb = kv_bytes_per_step(context) / 1e9
    floor = floor_ms(kv_bytes_per_step(context), 0, ceilings["copy_tb_s"], ceilings["gemm_tflop_s"])
    bars = {"KV read once at copy bandwidth": floor}
    for impl, label in (("native", "the fix (interpolated)"), ("sglang", "sglang's kernel (interpolated)")):
        ms = _per_layer_ms(peers, impl, heads, nodes, context)
        if ms is not None:
            bars[label] = ms * LAYERS
    rep = "the deployment's step (reported)"
    if reported and context in reported:
        bars[rep] = reported[context]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(list(bars), list(bars.values()), color=["0.5", "tab:blue", "tab:red", "k"][: len(bars)])
    ax.set_xscale("log")
    ax.set_xlabel(f"ms per {LAYERS}-layer step (attention)")
    ax.set_title(titled(f"{context:,} tokens, {heads} heads, {nodes} nodes: {kv_gb:.2f} GB of KV per step", source))
    fig.tight_layout()
    base = bars.get("sglang's kernel (interpolated)")
    text = f"{kv_gb:.2f} GB/step at {ceilings['copy_tb_s']:.2f} TB/s = {floor:.2f} ms floor"
    if base:
        text += f"; the baseline is {base / floor:.0f}x above it"
    if rep in bars:
        text += f"; the reported step is {bars[rep] / floor:.0f}x above it"
    return fig, text


def context_explorer(
    peers: pd.DataFrame, ceilings: dict, reported: dict | None = None, source: str | None = None
) -> Explorer:
    import ipywidgets as w

    shapes = peers[["heads", "nodes"]].drop_duplicates()
    controls = dict(
        context=w.IntSlider(value=65536, min=1024, max=262144, step=1024, description="context"),
        heads=_dropdown(sorted(shapes.heads.unique()), 8, "heads"),
        nodes=_dropdown(sorted(shapes.nodes.unique()), 9, "nodes"),
    )
    return Explorer(
        controls,
        lambda **s: context_view(peers, ceilings, reported=reported, source=source, **s),
        "a step at any context",
    )


# ---- 05: a measured shape -----------------------------------------------------------------------

SHAPE_SERIES = {
    "sglang": ("tab:red", "sglang's Triton kernel (baseline)"),
    "triton": ("salmon", "our imitation of it"),
    "flashmla_cascade": ("tab:purple", "FlashMLA + tree + merge"),
    "flashmla_sparse": ("tab:brown", "FlashMLA sparse prefill, page_size=1"),
    "flashmla": ("tab:orange", "FlashMLA prefix call alone"),
    "native": ("tab:blue", "ours, auto, page_size=1"),
    "floor": ("0.5", "floor (same run)"),
}


def shape_view(table: pd.DataFrame, context: int, heads: int, nodes: int, source: str | None = None):
    """Per-layer time of each implementation at one measured shape (``analysis.peer_table``)."""
    row = table[(table.context == context) & (table.heads == heads) & (table.nodes == nodes)]
    fig, ax = plt.subplots(figsize=(7, 3))
    if row.empty:
        ax.set_title(f"{context:,} x {heads} heads x {nodes} nodes: not measured")
        return fig, "not measured"
    r = row.iloc[0]
    names = [k for k in SHAPE_SERIES if k in r and r[k] == r[k]]
    ax.barh([SHAPE_SERIES[k][1] for k in names], [r[k] * 1e3 for k in names], color=[SHAPE_SERIES[k][0] for k in names])
    ax.set_xscale("log")
    ax.set_xlabel("one layer (us)")
    ax.set_title(titled(f"{context:,} tokens, {heads} heads, {nodes} nodes", source))
    fig.tight_layout()
    parts = [f"ours {r.native * 1e3:.1f} us", f"{r.native / r.floor:.2f}x the floor"]
    if "sglang" in names:
        parts.append(f"{r.sglang / r.native:.0f}x faster than sglang's kernel")
    if "flashmla" in names:
        parts.append(f"{r.native / r.flashmla:.2f}x FlashMLA's prefix call")
    return fig, "; ".join(parts)


def shape_explorer(table: pd.DataFrame, source: str | None = None) -> Explorer:
    controls = dict(
        context=_dropdown(sorted(table.context.unique()), 185000, "context"),
        heads=_dropdown(sorted(table.heads.unique()), 8, "heads"),
        nodes=_dropdown(sorted(table.nodes.unique()), 9, "nodes"),
    )
    return Explorer(
        controls,
        lambda **s: shape_view(table, source=source, **s),
        "one shape: ours, the baseline, the peers, the floor",
    )
