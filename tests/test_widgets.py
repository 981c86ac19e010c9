"""The notebooks' explorers on CPU: each built from the recordings, its controls driven, its
figure's data checked against the data it shows."""

import matplotlib
import pandas as pd
import pytest

from specdiag import analysis, data, widgets

matplotlib.use("Agg")
pytest.importorskip("ipywidgets")


def _bars(fig) -> dict:
    """A horizontal bar chart's {label: width}."""
    return {t.get_text(): p.get_width() for t, p in zip(fig.axes[0].get_yticklabels(), fig.axes[0].patches)}


def _drive(explorer, **values):
    box = explorer.widget()  # wires the controls
    for name, value in values.items():
        explorer.controls[name].value = value  # fires the redraw
    return box, explorer.view(**explorer.state())


def test_commit_explorer_plots_the_recorded_commit_lengths():
    rows = pd.DataFrame(data.load_json("drafter_validation_h200.json")["rows"])
    ex = widgets.commit_explorer(rows)
    _, (fig, text) = _drive(ex, drafter="autoregressive", text="predictable", faults=("healthy", "broken window"))
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    want = rows[(rows.drafter == "autoregressive") & (rows.text == "predictable") & (rows.fault == "broken window")]
    assert list(lines["broken window"].get_ydata()) == want.sort_values("context").mean_commit.tolist()
    assert text.startswith("autoregressive, predictable: healthy: ")


def test_ddtree_explorer_draws_the_builders_tree_and_marks_the_accepted_path():
    ex = widgets.ddtree_explorer()
    _, (fig, text) = _drive(ex, budget=12, seed=3)
    dots = [c for c in fig.axes[0].collections]
    assert len(dots) == 13  # root + 12 nodes
    red = sum(1 for c in dots if tuple(c.get_facecolor()[0][:3]) != (1.0, 1.0, 1.0))
    commit = int(text.rsplit(" ", 1)[1])
    assert red == commit  # root + accepted nodes = accepted + bonus
    with pytest.raises(ValueError):
        widgets.ddtree_view(budget=0)


def test_timeline_explorer_shows_one_phase():
    samples = pd.DataFrame(data.load_json("probes_h200.json")["samples"])
    ex = widgets.timeline_explorer(samples)
    _, (fig, text) = _drive(ex, phase="native", counters=("gpm_sm_util",))
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_ydata()) == samples[samples.phase == "native"].gpm_sm_util.tolist()
    assert text.startswith("native: SMs busy (GPM, %) median ")


def test_context_explorer_interpolates_between_measured_contexts():
    doc = data.load_json("peers_h200.json")
    df = analysis.peers_frame(doc)
    ex = widgets.context_explorer(df, doc["ceilings"], reported=analysis.INCIDENT["step_ms"])
    _, (fig, text) = _drive(ex, context=65536, heads=8, nodes=9)
    bars = _bars(fig)
    measured = df[(df.impl == "sglang") & (df.heads == 8) & (df.nodes == 9) & (df.context == 65536)].ms.iloc[0]
    assert bars["sglang's kernel (interpolated)"] == pytest.approx(measured * 61)
    assert bars["the deployment's step (reported)"] == 327.0
    mid = widgets.context_view(df, doc["ceilings"], 98304)[0]  # halfway between 64k and 128k
    lo, hi = (
        df[(df.impl == "native") & (df.heads == 8) & (df.nodes == 9) & (df.context == c)].ms.iloc[0]
        for c in (65536, 131072)
    )
    got = _bars(mid)
    assert got["the fix (interpolated)"] == pytest.approx((lo + hi) / 2 * 61)
    assert "x above it" in text


def test_shape_explorer_shows_each_peer_at_the_chosen_shape():
    doc = data.load_json("peers_h200.json")
    table = analysis.peer_table(analysis.peers_frame(doc))
    ex = widgets.shape_explorer(table, source=data.provenance(doc))
    _, (fig, text) = _drive(ex, context=65536, heads=64, nodes=65)
    assert fig.axes[0].get_title().endswith(f"({data.provenance(doc)})")
    row = table[(table.context == 65536) & (table.heads == 64) & (table.nodes == 65)].iloc[0]
    bars = _bars(fig)
    assert bars["ours, auto, page_size=1"] == pytest.approx(row.native * 1e3)
    assert bars["FlashMLA prefix call alone"] == pytest.approx(row.flashmla * 1e3)
    assert text.startswith(f"ours {row.native * 1e3:.1f} us")
    assert ex.static() is not None
