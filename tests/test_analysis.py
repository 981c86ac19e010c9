import pandas as pd
import pytest

from specdiag import analysis, cost, data
from specdiag.bench import timing


def test_kv_bytes_per_step_matches_the_postmortem():
    # 64k context, 61 layers, 576 bf16 per token per layer: ~4.5 GB per step
    gb = analysis.kv_bytes_per_step(65536) / 1e9
    assert 4.5 <= gb <= 4.7
    with pytest.raises(ValueError):
        analysis.kv_bytes_per_step(-1)


def test_bandwidth_gap_arithmetic():
    g = analysis.bandwidth_gap(65536, 327.0, copy_tb_s=1.8445)  # 4.61 GB at 1.84 TB/s = 2.5 ms
    assert g["floor_ms"] == pytest.approx(2.5, rel=0.01)
    assert g["gap"] == pytest.approx(130, rel=0.01)


def test_attention_cost_counts():
    c = cost.attention_cost(prefix=1000, nodes=9, heads=8)
    rows = 72
    assert c["flops"] == 2 * rows * 1009 * (576 + 512)
    assert c["bytes"] == 1009 * 1152 + rows * 576 * 2 + rows * 512 * 2
    assert c["kv_bytes"] == 1000 * 1152


def test_floor_picks_the_larger_term():
    assert analysis.floor_ms(4.27e9, 0, 4.27, 100) == pytest.approx(1.0)
    assert analysis.floor_ms(0, 7.84e11, 4.27, 784) == pytest.approx(1.0)
    assert analysis.floor_ms(4.27e9, 7.84e12, 4.27, 784) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        analysis.floor_ms(1, 1, 0, 1)


def test_recorded_sweep_has_metadata_and_reproduces_the_story():
    doc = data.load_json("context_sweep_h200.json")
    assert doc["machine"]["gpu"].startswith("NVIDIA")
    for key in ("driver", "torch", "triton", "sm_count", "recorded_utc"):
        assert doc["machine"].get(key), key
    df = analysis.add_roofline(data.sweep_frame(doc), doc["ceilings"])
    base = df[(df.impl == "triton") & (df.heads == 8) & (df.nodes == 9)].sort_values("context")
    # the baseline's per-step time grows with context (the collapse)
    assert base.ms.is_monotonic_increasing
    speed = analysis.speedup_table(df)
    assert set(speed.columns) >= {"context", "heads", "nodes", "triton_ms", "native_ms", "speedup"}
    assert (speed.speedup > 1).all()


def test_measure_or_load_follows_the_measure_parameter(capsys):
    ran = []

    def run():
        ran.append(1)
        return {"rows": [1], "machine": {"gpu": "here"}}

    doc = data.measure_or_load("never", "context_sweep_h200.json", run, available=lambda: True)
    assert doc["source"] == "recorded" and not ran and "data/context_sweep_h200.json" in capsys.readouterr().out
    doc = data.measure_or_load("auto", "context_sweep_h200.json", run, available=lambda: True)
    assert doc == {"rows": [1], "machine": {"gpu": "here"}, "source": "measured"} and ran == [1]
    assert data.measure_or_load("auto", "context_sweep_h200.json", run, available=lambda: False)["source"] == "recorded"
    with pytest.raises(RuntimeError, match="measure='always' needs an engine"):
        data.measure_or_load("always", "x.json", run, available=lambda: False, needs="an engine")
    with pytest.raises(ValueError, match="measure must be one of"):
        data.measure_or_load("sometimes", "x.json", run)


def test_speedup_table_joins_on_shape():
    df = pd.DataFrame(
        [
            dict(impl="triton", context=1, heads=8, nodes=9, ms=10.0),
            dict(impl="native", context=1, heads=8, nodes=9, ms=2.0),
            dict(impl="native", context=2, heads=8, nodes=9, ms=2.0),
        ]
    )
    t = analysis.speedup_table(df)
    assert len(t) == 1 and t.speedup.iloc[0] == 5.0


def test_speedup_range_reports_long_and_all_contexts():
    df = pd.DataFrame(
        [
            dict(impl=i, context=c, heads=8, nodes=9, ms=ms)
            for i, c, ms in [
                ("a", 4096, 1.0),
                ("b", 4096, 2.0),
                ("a", 65536, 9.0),
                ("b", 65536, 3.0),
                ("a", 131072, 8.0),
                ("b", 131072, 2.0),
            ]
        ]
    )
    assert (
        analysis.speedup_range(df, "a", "b", "b over a")
        == "b over a: 3.00x to 4.00x at >= 32k (all contexts: 0.50x to 4.00x)"
    )
    assert (
        analysis.speedup_range(df[df.context < 32768], "a", "b", "x")
        == "x: no contexts >= 32k (all contexts: 0.50x to 0.50x)"
    )
    assert analysis.speedup_range(df, "a", "c", "c over a") == "c over a: not measured here (a or c missing)"


def test_sweep_refuses_unknown_implementations_before_touching_the_gpu():
    with pytest.raises(ValueError, match="native_foo"):
        timing.context_sweep(contexts=(1024,), impls=("native", "native_foo"))
    native = {k for k, (kernel, _) in timing.SWEEP_IMPLS.items() if kernel}
    assert native == {
        "native",
        "native_ps1",
        "native_mma_k16",
        "native_mma_k16_ps1",
        "native_mma_small",
        "native_mma_small_ps1",
        "native_wgmma",
        "native_wgmma_ps1",
        "native_seesaw",
        "native_seesaw_ps1",
        "native_wide",
        "native_wide_ps1",
        "native_auto",
        "native_auto_ps1",
    }
    assert all(ps == 1 for k, (_, ps) in timing.SWEEP_IMPLS.items() if k.endswith("_ps1") or k in ("triton", "torch"))


def test_bench_cli_needs_out_and_the_profiling_workload_refuses_unknown_kernels():
    from specdiag.bench.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["sweep", "--quick"])
    assert e.value.code == 2
    from specdiag.probes import workloads

    with pytest.raises(SystemExit) as e:
        workloads.main(["native", "--impl", "tcgen05"])
    assert e.value.code == 2


def test_with_auto_takes_the_kernel_auto_picks_per_shape():
    import pandas as pd

    rows = []
    for ctx, h, t in [
        (8192, 8, 9),
        (16384, 8, 9),
        (32768, 8, 9),
        (32768, 8, 5),
        (65536, 8, 5),
        (185000, 8, 65),
        (2048, 64, 9),
        (1024, 8, 257),
    ]:
        for impl, ms in (
            ("native_wgmma", 3.0),
            ("native_seesaw", 2.0),
            ("native_wide", 1.5),
            ("native", 1.0),
            ("triton", 9.0),
        ):
            rows.append(dict(impl=impl, context=ctx, heads=h, nodes=t, ms=ms * ctx))
    df = pd.DataFrame(rows)
    out = analysis.with_auto(df)
    auto = out[out.impl == "native_auto"].set_index(["context", "heads", "nodes"])
    assert len(auto) == 8 and len(out) == len(df) + 8
    assert auto.loc[(8192, 8, 9), "kernel"] == "wgmma"  # 72 rows below a 16k prefix
    assert auto.loc[(16384, 8, 9), "kernel"] == "wgmma_seesaw"  # 72 rows from 16k
    assert auto.loc[(32768, 8, 9), "kernel"] == "wgmma_wide"  # 72 rows from 32k
    assert auto.loc[(32768, 8, 5), "kernel"] == "wgmma"  # 40 rows: wgmma_seesaw from 64k only
    assert auto.loc[(65536, 8, 5), "kernel"] == "wgmma_seesaw"
    assert auto.loc[(185000, 8, 65), "kernel"] == "wgmma_seesaw"
    assert auto.loc[(2048, 64, 9), "kernel"] == "wgmma"  # 576 rows below 4k
    assert auto.loc[(1024, 8, 257), "kernel"] == "wgmma_seesaw"  # 2056 rows: at any prefix
    assert auto.loc[(185000, 8, 65), "ms"] == 2.0 * 185000  # the picked kernel's own measurement
    assert analysis.with_auto(df[df.impl == "triton"]).equals(df[df.impl == "triton"])  # nothing to pick from
    assert analysis.with_auto(out).equals(out)  # a frame that has measured auto rows keeps them
    lacking = df[~((df.impl == "native_wgmma") & (df.context == 8192))]  # auto's pick at 8k x 8 x 9
    with pytest.raises(ValueError, match=r"lacks .*native_wgmma at 8192 x 8 heads x 9 nodes$"):
        analysis.with_auto(lacking)


def test_recorded_sweep_auto_uses_the_wide_kernel_for_the_incident_shape():
    from specdiag import data

    doc = data.load_json("context_sweep_h200.json")
    df = analysis.with_auto(analysis.add_roofline(data.sweep_frame(doc), doc["ceilings"]))
    row = df[(df.impl == "native_auto") & (df.context == 185000) & (df.heads == 8) & (df.nodes == 9)].iloc[0]
    assert row.kernel == "wgmma_wide"
    for other in ("native_wgmma", "native_seesaw", "native"):  # the other kernels at that shape
        assert (
            row.ms < df[(df.impl == other) & (df.context == 185000) & (df.heads == 8) & (df.nodes == 9)].iloc[0].ms
        ), other


def test_figures_show_at_most_six_series_and_where_their_numbers_come_from():
    from matplotlib.colors import to_rgba

    from specdiag import plots

    doc = data.load_json("context_sweep_h200.json")
    doc["source"] = "recorded"
    source = data.provenance(doc)
    assert source == f"recorded on NVIDIA H200, {doc['machine']['recorded_utc'][:10]}"
    df = analysis.with_auto(analysis.add_roofline(data.sweep_frame(doc), doc["ceilings"]))
    assert len(set(df.impl)) > 6  # the recording holds more than a figure may show
    for fig in (
        plots.step_time_vs_context(df, 8, 9, incident=analysis.INCIDENT["step_ms"], source=source),
        plots.gap_vs_context(df, 8, 9, source=source),
    ):
        ax = fig.axes[0]
        labels = ax.get_legend_handles_labels()[1]
        assert 1 < len(labels) <= 6 and len(set(labels)) == len(labels)
        assert len({to_rgba(line.get_color()) for line in ax.get_lines()}) == len(ax.get_lines())  # distinct colours
        assert source in ax.get_title()
        assert (
            ax.get_legend().get_bbox_to_anchor().x0 >= ax.get_window_extent().x1 - 1
        )  # the legend sits outside the axes
    assert (
        data.provenance({"machine": {"gpu": "X", "recorded_utc": "2026-01-02T03:04"}, "source": "measured"})
        == "measured now on X, 2026-01-02"
    )


def test_cta_lanes_draw_every_cta_of_each_launch_by_kind():
    from specdiag import plots

    doc = data.load_json("history/session43_h100.json")
    runs = doc["run3_trace_ctas"]["runs"][:2]
    fig = plots.cta_lanes(runs, source=data.provenance(doc))
    assert len(fig.axes) == 2 and data.provenance(doc) in fig._suptitle.get_text()
    for ax, r in zip(fig.axes, runs):
        bars = {c.get_label(): len(c.get_segments()) for c in ax.collections}
        tree = sum(x[0] >= r["prefix_splits"] for x in r["ctas"]["rows"])
        assert bars == {"a prefix split's CTA": len(r["ctas"]["rows"]) - tree, "a tree CTA": tree}
    assert fig.axes[-1].get_legend() is not None


def test_peer_table_sets_ours_against_each_peer_it_holds():
    import pandas as pd

    rows = [
        dict(impl="native", context=32768, heads=64, nodes=9, ms=2.0, floor_ms=1.0),
        dict(impl="flashmla", context=32768, heads=64, nodes=9, ms=1.6, floor_ms=1.0),
        dict(impl="flashmla_sparse", context=32768, heads=64, nodes=9, ms=2.5, floor_ms=1.0),
        dict(impl="native", context=32768, heads=8, nodes=9, ms=0.5, floor_ms=0.25),
        dict(impl="flashmla", context=32768, heads=8, nodes=9, ms=0.4, floor_ms=0.25),
    ]
    t = analysis.peer_table(pd.DataFrame(rows)).set_index(["heads"])
    assert t.loc[64, "native / flashmla"] == 1.25 and t.loc[64, "native / flashmla_sparse"] == 0.8
    assert t.loc[8, "native / flashmla_sparse"] != t.loc[8, "native / flashmla_sparse"]  # not measured: NaN
    assert t.loc[8, "native / floor"] == 2.0 and t.loc[64, "rows"] == 576


def test_targets_name_the_peer_times_that_fall_as_the_context_grows():
    """A peer slower at a context than at the next longer one (the H200's FlashMLA at 32k x 8 and
    16 heads x 9 nodes, thirty-fifth session) is named beside the first target; the count itself
    is not changed. Only shapes from the target's 32k are named; ours is never checked."""
    ms = {  # (context, heads): (ours, FlashMLA)
        (4096, 8): (0.02, 0.05),
        (16384, 8): (0.03, 0.04),
        (32768, 8): (0.04, 0.24),
        (65536, 8): (0.05, 0.055),
        (131072, 8): (0.07, 0.08),
        (32768, 64): (0.09, 0.08),
        (65536, 64): (0.16, 0.14),
    }
    rows = [
        dict(impl=impl, context=c, heads=h, nodes=9, ms=v[i], floor_ms=0.01)
        for (c, h), v in ms.items()
        for i, impl in enumerate(("native", "flashmla"))
    ]
    t = analysis.peer_table(pd.DataFrame(rows))
    assert analysis.slower_than_longer(t) == [(4096, 8, 9), (32768, 8, 9)]
    assert analysis.slower_than_longer(t, "native") == [] and analysis.slower_than_longer(t, "sglang") == []
    first = analysis.peer_targets(t)[0]["measured"]
    assert first.startswith("3 of 5 shapes;") and first.endswith(
        "; FlashMLA slower than at a longer context at 32k x 8 x 9 (suspect)"
    )
    t.loc[t.context == 32768, "flashmla"] = 0.045
    assert "suspect" not in analysis.peer_targets(t)[0]["measured"]


def test_context_fits_split_each_time_into_per_key_and_fixed_cost():
    """Times on a line through the contexts from 32k give that line back (us per 1,024 keys, us at
    zero keys); a suspect peer time (slower than at a longer context) and shorter contexts are left
    out, and a shape left with one context is skipped."""
    rows = []
    for c in (4096, 32768, 65536, 131072):
        rows += [
            dict(impl="native", context=c, heads=8, nodes=257, ms=(60 + 6.8 * c / 1024) / 1e3, floor_ms=0.01),
            dict(impl="flashmla", context=c, heads=8, nodes=257, ms=(7 + 6.5 * c / 1024) / 1e3, floor_ms=0.01),
        ]
    rows[0]["ms"] = 1.0  # ours at 4k, off the line: below 32k, left out
    rows[3]["ms"] = 1.0  # FlashMLA at 32k, slower than at 65k: suspect, left out
    rows += [dict(impl=i, context=185000, heads=64, nodes=65, ms=2.0, floor_ms=0.01) for i in ("native", "flashmla")]
    f = analysis.context_fits(analysis.peer_table(pd.DataFrame(rows))).set_index("impl")
    assert list(f.index) == ["native", "flashmla"]  # the 64 x 65 shape has one context: skipped
    assert f.loc["native", ["us_per_1k_keys", "fixed_us"]].tolist() == pytest.approx([6.8, 60])
    assert f.loc["flashmla", ["us_per_1k_keys", "fixed_us"]].tolist() == pytest.approx([6.5, 7])
    assert f.loc["native", "contexts"] == 3 and f.loc["flashmla", "contexts"] == 2


def test_peers_native_rows_are_what_auto_runs_now():
    import pandas as pd

    base = dict(heads=8, nodes=9, page_size=1)
    rows = [
        dict(impl="native", context=185000, ms=1.10, kernel="wgmma_seesaw", splits=66, **base),
        dict(impl="native:wgmma_wide", context=185000, ms=1.02, kernel="wgmma_wide", splits=127, **base),
        dict(impl="native", context=8192, ms=0.40, kernel="wgmma", splits=66, **base),
        dict(impl="native:wgmma_wide", context=8192, ms=0.45, kernel="wgmma_wide", splits=64, **base),
        dict(impl="flashmla", context=185000, ms=1.00, **base),
    ]
    df = pd.DataFrame(rows)
    out = analysis.native_as_auto_now(df).set_index(["impl", "context"])
    assert out.loc[("native", 185000), ["ms", "kernel", "splits", "measured_as"]].tolist() == [
        1.02,
        "wgmma_wide",
        127,
        "native:wgmma_wide",
    ]  # auto picks the wide kernel at 72 rows from 32k: its own row of the run
    assert out.loc[("native", 8192), ["ms", "measured_as"]].tolist() == [0.40, "native"]  # as recorded
    assert out.loc[("flashmla", 185000), "ms"] == 1.00 and len(out) == len(df)
    assert analysis.native_as_auto_now(df, capability="12.0").equals(df)  # another GPU's recording
    with pytest.raises(ValueError, match=r"lacks .*native:wgmma_wide at 185000 x 8 heads x 9 nodes$"):
        analysis.native_as_auto_now(df[df.impl != "native:wgmma_wide"])


def test_recorded_peers_give_the_wide_kernel_at_the_deployments_shape():
    doc = data.load_json("peers_h200.json")
    df = analysis.peers_frame(doc)
    at = df[(df.context == 185000) & (df.heads == 8) & (df.nodes == 9)].set_index("impl")
    assert at.loc["native", "kernel"] == at.loc["native:wgmma_wide", "kernel"] == "wgmma_wide"
    raw = data.sweep_frame(doc)  # what auto ran when recorded, kept in the file
    assert set(raw[raw.impl == "native"].kernel) >= {"wgmma_seesaw"}


def test_every_peers_recording_stands_on_the_same_targets():
    docs = {name: data.load_json(name) for name in ("peers_h200.json", "peers_h100.json")}
    t = analysis.targets_by_recording(docs).set_index("recording")
    goals = [
        g["target"] for g in analysis.peer_targets(analysis.peer_table(analysis.peers_frame(docs["peers_h200.json"])))
    ]
    assert list(t.columns) == ["gpu", "recorded", "sources", *goals] and len(goals) == 3
    assert t.loc["peers_h200.json", "gpu"] == "NVIDIA H200" and "H100" in t.loc["peers_h100.json", "gpu"]
    for name, doc in docs.items():
        assert t.loc[name, "sources"] == doc["machine"]["native_digest"]
    for name, doc in docs.items():  # the deployment's shape: our time in that recording
        tab = analysis.peer_table(analysis.peers_frame(doc))
        us = tab[(tab.context == 185000) & (tab.heads == 8) & (tab.nodes == 9)].native.iloc[0] * 1e3
        assert t.loc[name, goals[1]].removeprefix("met: ").startswith(f"{us:.1f} us (floor")
    doc = dict(docs["peers_h100.json"], machine=dict(docs["peers_h100.json"]["machine"], native_digest="0123456789ab"))
    assert analysis.targets_by_recording({"x": doc}).sources.tolist() == ["0123456789ab"]
    doc["machine"].pop("native_digest")  # (recordings older than it)
    assert analysis.targets_by_recording({"x": doc}).sources.tolist() == ["not recorded"]


def test_pair_copies_takes_the_frees_before_the_top_from_the_pair_before():
    """analysis.pair_copies: three of the four groups are freed by an event of the pair before (its
    offset less a pair's cycles), the fourth by one of the same pair; idle runs from the last group
    landed to the first freed of the next pair; a trace without the copies' events is refused."""
    med = {"period": 1000.0, "w0.pv_done": 1500.0, "w1.pv_b_done": 1700.0, "w1.pv_done": 2100.0}
    med |= {"w0.prev_pv_done": 300.0, "w0.early_in": 50.0, "w1.early_in": 400.0, "w0.late_in": 600.0}
    med |= {"w1.late_in": 1200.0, "ld.issued_e0": -400.0, "ld.issued_e1": -250.0, "ld.issued_l0": 150.0}
    med["ld.issued_l1"] = 350.0
    copies, idle, pair = analysis.pair_copies({"median_cycles": med})
    assert pair == 2000 and copies.freed.tolist() == [-500, -300, 100, 300]
    assert copies.issued_to_landed.tolist() == [450, 650, 450, 850]
    assert idle == -500 + 2000 - 1200
    del med["ld.issued_l1"]
    with pytest.raises(ValueError, match="missing ld.issued_l1"):
        analysis.pair_copies({"median_cycles": med})
