"""Arithmetic behind notebooks 03 and 05: floors, gaps, speed-ups, what ``auto`` delivers."""

from __future__ import annotations

from .attention.registry import KERNELS, hopper_auto
from .cost import LAYERS, bandwidth_gap, floor_ms, kv_bytes_per_step

__all__ = [
    "INCIDENT",
    "kv_bytes_per_step",
    "floor_ms",
    "bandwidth_gap",
    "add_roofline",
    "speedup_table",
    "speedup_range",
    "with_auto",
    "native_as_auto_now",
    "peers_frame",
    "PEER_TARGETS",
    "peer_table",
    "peer_targets",
    "slower_than_longer",
    "context_fits",
    "targets_by_recording",
    "results_markdown",
    "variant_table",
    "variant_summary",
    "default_spread",
    "trace_table",
    "wide_trace_table",
    "NCU_FIELDS",
    "ncu_table",
    "stall_table",
    "split_length_table",
]

# Figures as reported by the deployment's postmortem (not measured by this workbook).
INCIDENT = {
    "model": "Kimi-K2-style MLA, 61 layers, latent KV 576 bf16 / token / layer",
    "step_ms": {32768: 159.0, 65536: 327.0, 185000: 1430.0},
    "tok_s_at_185k": 0.7,
    "kv_gb_at_64k": 4.5,
    "floor_ms_at_64k_quoted": 2.5,
    "gap_quoted": 130,
    "nvidia_smi_util_pct": 99.8,
    "mem_controller_busy_pct": 1.2,
    "power_pct_tdp": 22,
    "tensor_pipe_decode_pct": 3,
    "tensor_pipe_prefill_pct": (50, 90),
}


def add_roofline(df, ceilings: dict, layers: int = LAYERS):
    """Columns: floor_ms (per layer), bound, x_floor (measured / floor), step_ms (x layers)."""
    df = df.copy()
    bw, rate = ceilings["copy_tb_s"], ceilings["gemm_tflop_s"]
    df["floor_ms"] = [floor_ms(b, f, bw, rate) for b, f in zip(df["bytes"], df["flops"])]
    df["bound"] = ["memory" if b / bw > f / rate else "compute" for b, f in zip(df["bytes"], df["flops"])]
    df["x_floor"] = df["ms"] / df["floor_ms"]
    df["step_ms"] = df["ms"] * layers
    return df


def speedup_table(df, base: str = "triton", new: str = "native"):
    """One row per (context, heads, nodes): base and new per-layer ms and the ratio."""
    keys = ["context", "heads", "nodes"]
    a = df[df.impl == base].set_index(keys)["ms"].rename(f"{base}_ms")
    b = df[df.impl == new].set_index(keys)["ms"].rename(f"{new}_ms")
    out = a.to_frame().join(b, how="inner")
    out["speedup"] = out[f"{base}_ms"] / out[f"{new}_ms"]
    return out.reset_index()


def speedup_range(df, base: str, new: str, what: str, min_context: int = 32768) -> str:
    """One line: the range of base / new time at >= ``min_context`` and over all contexts, or a
    note that one of the two was not measured."""
    t = speedup_table(df, base=base, new=new)
    if t.empty:
        return f"{what}: not measured here ({base} or {new} missing)"
    long = t[t.context >= min_context]
    part = (
        f"{long.speedup.min():.2f}x to {long.speedup.max():.2f}x at >= {min_context // 1024}k"
        if len(long)
        else f"no contexts >= {min_context // 1024}k"
    )
    return f"{what}: {part} (all contexts: {t.speedup.min():.2f}x to {t.speedup.max():.2f}x)"


def with_auto(df, name: str = "native_auto"):
    """``df`` plus rows ``name`` where it has none: per (context, heads, nodes), the measurement of
    the kernel ``impl="auto"`` picks on sm_90 (``registry.hopper_auto``), where that kernel was
    measured at page size 64; what the library's default delivers at each shape. A recording that
    measured some native kernels but not the one picked at a shape is an error (its auto rows would
    leave that shape out); one with no native kernel at all is returned as it is."""
    import pandas as pd

    if name in set(df.impl):
        return df
    labels = {k.name: k.label for k in KERNELS.values()}
    if not set(labels.values()) & set(df.impl):
        return df
    picks, missing = [], []
    for (ctx, h, t), g in df.groupby(["context", "heads", "nodes"]):
        kernel = hopper_auto(h * t, ctx)
        row = g[g.impl == labels[kernel]]
        if not len(row):
            missing.append(f"{labels[kernel]} at {ctx} x {h} heads x {t} nodes")
            continue
        picks.append(row.iloc[0].copy())
        picks[-1]["kernel"] = kernel
        picks[-1]["impl"] = name
    if missing:
        raise ValueError(_lacks("the recording lacks the kernel impl='auto' picks", missing))
    return pd.concat([df, pd.DataFrame(picks)], ignore_index=True)


def native_as_auto_now(df, capability: str | None = "9.0"):
    """A peers recording's rows (``data.sweep_frame``) with its ``native`` rows, ``impl="auto"`` as
    it picked when the run was recorded, replaced at each shape where ``registry.hopper_auto`` now
    picks another kernel by that kernel's own rows of the same run (``native:KERNEL``, measured beside
    them); a shape lacking those is an error. Recordings of other GPUs (``capability``, the
    machine's) are returned as they are. Column ``measured_as``: the rows each ``native`` row is."""
    df = df.copy()
    if "native" not in set(df.impl) or capability != "9.0":
        return df
    native = df.impl == "native"
    df.loc[native, "measured_as"] = "native"
    missing = []
    for i in df.index[native]:
        r = df.loc[i]
        kernel = hopper_auto(int(r.heads * r.nodes), int(r.context))
        if r.get("kernel") == kernel:
            continue
        same = (df.context == r.context) & (df.heads == r.heads) & (df.nodes == r.nodes)
        src = df[same & (df.impl == f"native:{kernel}")]
        if src.empty:
            missing.append(f"native:{kernel} at {r.context} x {r.heads} heads x {r.nodes} nodes")
            continue
        for col in ("ms", "kernel", "splits", "tb_s", "tflop_s"):
            if col in src:
                df.at[i, col] = src[col].iloc[0]
        df.at[i, "measured_as"] = f"native:{kernel}"
    if missing:
        raise ValueError(_lacks("the peers recording lacks the kernel impl='auto' picks now", missing))
    return df


def _lacks(what: str, missing: list[str]) -> str:
    """One line: ``what``, the first three shapes missing, and how many more."""
    more = f" and {len(missing) - 3} more shapes" if len(missing) > 3 else ""
    return f"{what}: {', '.join(missing[:3])}{more}"


def peers_frame(doc: dict, layers: int = LAYERS):
    """A peers recording as rows with ``add_roofline``'s columns, ``native`` being what
    ``impl="auto"`` runs now (``native_as_auto_now``)."""
    from .data import sweep_frame

    cap = doc.get("machine", {}).get("capability", "9.0")
    return add_roofline(native_as_auto_now(sweep_frame(doc), cap), doc["ceilings"], layers)


# The kernel's targets beside the real peers (data/peers_h200.json), measured in one run:
# our whole verify <= FlashMLA's prefix call from 32k; the deployment's shape <= 65 us; at >= 2000
# query rows <= 1.1x the floor.
PEER_TARGETS = dict(
    min_context=32768, vs_flashmla=1.00, deployment=(185000, 8, 9), deployment_us=65.0, rows=2000, vs_floor=1.10
)


def peer_table(df):
    """Per (context, heads, nodes): each impl's ms, and ours against the peers and the floor
    (``df``: a peers recording's rows with ``add_roofline``'s columns)."""
    keys = ["context", "heads", "nodes"]
    t = df.pivot_table(index=keys, columns="impl", values="ms")
    floor = df[df.impl == "native"].set_index(keys)["floor_ms"]
    t["floor"] = floor
    if "flashmla" in t:
        t["native / flashmla"] = t["native"] / t["flashmla"]
        t["flashmla / floor"] = t["flashmla"] / t["floor"]  # its floor: the whole verify's
    if "flashmla_sparse" in t:  # the whole verify at page size 1 through FlashMLA's token gather
        t["native / flashmla_sparse"] = t["native"] / t["flashmla_sparse"]
    if "sglang" in t:
        t["sglang / native"] = t["sglang"] / t["native"]
    t["native / floor"] = t["native"] / t["floor"]
    t["rows"] = [h * n for _, h, n in t.index]
    return t.reset_index()


def slower_than_longer(table, impl: str = "flashmla") -> list[tuple[int, int, int]]:
    """(context, heads, nodes) where ``impl`` took longer than at the next longer context recorded
    for the same heads and nodes: the longer context reads more keys in less time, so the shorter
    one's time, and any ratio against it, is suspect."""
    out = []
    if impl not in table:
        return out
    for (h, n), g in table.sort_values("context").groupby(["heads", "nodes"]):
        ms, ctx = g[impl].tolist(), g.context.tolist()
        out += [(ctx[i], h, n) for i in range(len(ms) - 1) if ms[i] > ms[i + 1]]
    return sorted(out)


def context_fits(table, impls=("native", "flashmla"), min_context: int = 32768):
    """Per (heads, nodes) and impl: a least-squares line through its times against the context from
    ``min_context`` on, as microseconds per 1,024 keys (the per-key cost) and at zero keys (the
    fixed cost: launches, first and last tiles, the tree block, the merge), leaving out the shapes
    ``slower_than_longer`` names for that impl. A shape with fewer than two contexts left is skipped.
    A negative fixed cost says the time grows faster than the context (on long compute-bound calls
    the clock falls)."""
    import numpy as np
    import pandas as pd

    rows = []
    for impl in (i for i in impls if i in table):
        odd = set(slower_than_longer(table, impl))
        for (h, n), g in table[table.context >= min_context].groupby(["heads", "nodes"]):
            g = g[np.array([(c, h, n) not in odd for c in g.context], dtype=bool) & g[impl].notna().to_numpy()]
            if g.context.nunique() < 2:
                continue
            slope, fixed = np.polyfit(g.context / 1024, g[impl] * 1e3, 1)
            rows.append(dict(heads=h, nodes=n, impl=impl, us_per_1k_keys=slope, fixed_us=fixed, contexts=len(g)))
    return pd.DataFrame(rows)


def peer_targets(table, targets: dict = PEER_TARGETS) -> list[dict]:
    """Each target: what it asks, what the recording gives, met or not."""
    out = []
    long = table[table.context >= targets["min_context"]]
    if "native / flashmla" in long:
        r = long["native / flashmla"]
        k = targets["min_context"] // 1024
        within = int((r <= targets["vs_flashmla"]).sum())
        odd = [x for x in slower_than_longer(table) if x[0] >= targets["min_context"]]
        note = ""
        if odd:
            shapes = ", ".join(f"{c // 1024}k x {h} x {n}" for c, h, n in odd)
            note = f"; FlashMLA slower than at a longer context at {shapes} (suspect)"
        out.append(
            dict(
                target=f"ours <= {targets['vs_flashmla']:.2f}x FlashMLA's prefix call, every shape >= {k}k",
                measured=f"{within} of {len(r)} shapes; median {r.median():.2f}x, worst {r.max():.2f}x{note}",
                met=bool((r <= targets["vs_flashmla"]).all()),
            )
        )
    ctx, h, n = targets["deployment"]
    dep = table[(table.context == ctx) & (table.heads == h) & (table.nodes == n)]
    if len(dep):
        us = float(dep.native.iloc[0]) * 1e3
        peer = f", FlashMLA's prefix call {float(dep.flashmla.iloc[0]) * 1e3:.1f} us" if "flashmla" in dep else ""
        out.append(
            dict(
                target=f"{ctx:,} x {h} heads x {n} nodes <= {targets['deployment_us']:.0f} us",
                measured=f"{us:.1f} us (floor {float(dep.floor.iloc[0]) * 1e3:.1f} us{peer})",
                met=us <= targets["deployment_us"],
            )
        )
    many = long[long.rows >= targets["rows"]]
    if len(many):
        x = many["native / floor"]
        peer = ""
        if "flashmla / floor" in many:
            f = many["flashmla / floor"]
            within = int((f <= targets["vs_floor"]).sum())
            peer = f"; FlashMLA's prefix call {f.min():.2f}x to {f.max():.2f}x, within at {within}"
        out.append(
            dict(
                target=f">= {targets['rows']} query rows: <= {targets['vs_floor']:.1f}x the floor",
                measured=f"{x.min():.2f}x to {x.max():.2f}x over {len(x)} shapes{peer}",
                met=bool((x <= targets["vs_floor"]).all()),
            )
        )
    return out


def targets_by_recording(docs: dict, targets: dict = PEER_TARGETS):
    """One row per peers recording (``docs``: name -> document): its GPU, date and sources
    (``machine.native_digest``; "not recorded" in recordings older than it), then where it stands on each
    target (a column per ``peer_targets`` text, "met: " in front where it is met)."""
    import pandas as pd

    rows = []
    for name, doc in docs.items():
        m = doc.get("machine", {})
        row = dict(
            recording=name,
            gpu=m.get("gpu", "?"),
            recorded=(m.get("recorded_utc") or "?")[:10],
            sources=m.get("native_digest") or "not recorded",
        )
        for t in peer_targets(peer_table(peers_frame(doc)), targets):
            row[t["target"]] = ("met: " if t["met"] else "") + t["measured"]
        rows.append(row)
    return pd.DataFrame(rows)


def results_markdown(peers_doc: dict, shape=PEER_TARGETS["deployment"], layers: int = LAYERS) -> str:
    """The README's results table at the deployment's shape, from a peers recording and the
    postmortem's reported step (tests/test_readme.py keeps the README equal to it)."""
    from .data import provenance

    ctx, h, n = shape
    df = peers_frame(peers_doc, layers)
    at = df[(df.context == ctx) & (df.heads == h) & (df.nodes == n)].set_index("impl")
    fix = at.loc["native", "ms"]

    def fmt(ms: float) -> str:
        return f"{ms * 1e3:,.1f} us" if ms < 1 else f"{ms:,.1f} ms" if ms < 1000 else f"{ms / 1e3:,.2f} s"

    rows = [("the deployment's whole step (reported, its own GPUs)", None, INCIDENT["step_ms"].get(ctx), None)]
    names = {
        "sglang": "sglang 0.5.23's Triton kernel, page_size=1 (what the deployment ran)",
        "triton": "this workbook's imitation of it",
        "flashmla": "FlashMLA's prefix call alone (no tree block, page size 64)",
        "native": '**the fix**: `impl="auto"`, page_size=1',
    }
    for impl, what in names.items():
        if impl in at.index:
            ms = float(at.loc[impl, "ms"])
            rows.append((what, ms, ms * layers, ms / fix))
    floor = float(at.loc["native", "floor_ms"])
    rows.append(("floor: max(bytes / copy BW, FLOPs / GEMM), same run", floor, floor * layers, floor / fix))
    lines = [
        f"At {ctx:,} tokens of context, {h} heads, a {n}-node tree ({provenance(peers_doc)}):",
        "",
        f"| | one layer | {layers} layers | time / the fix |",
        "|---|---|---|---|",
    ]
    for what, one, all_, ratio in rows:
        cells = [fmt(one) if one else "", fmt(all_) if all_ else "", f"{ratio:.2f}x" if ratio else ""]
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _build(defines: dict, default: str = "default") -> str:
    """A build's name from its -D switches: 'A=1,B=2', or ``default`` for none."""
    return ",".join(f"{k}={v}" for k, v in sorted(defines.items())) or default


# the peers a variants recording times beside our builds -> the page size of our rows each is
# set against (None: every row)
VARIANT_PEERS = {"flashmla": None, "flashmla_sparse": 1}


def variant_table(doc: dict):
    """A variants recording (``python -m specdiag.bench variants``) as one row per shape and page
    size: the default build's time, each variant's time over it, FlashMLA's prefix call (page
    size 64, the same shape) over it, and where recorded FlashMLA's sparse prefill (the whole
    verify at page size 1: page-size-1 rows only) over it."""
    import pandas as pd

    rows = pd.DataFrame(doc["rows"])
    peer = rows.impl.isin(VARIANT_PEERS)
    rows["build"] = [_build(d, "default") for d in rows.defines]
    keys = ["context", "heads", "nodes"]
    ours = rows[~peer].pivot_table(index=[*keys, "page_size"], columns="build", values="ms")
    out = pd.DataFrame({"default_us": ours["default"] * 1e3})
    for b in ours.columns:
        if b != "default":
            out[b] = ours[b] / ours["default"]
    for impl, page_size in VARIANT_PEERS.items():
        if impl == "flashmla" or (rows.impl == impl).any():
            ms = rows[rows.impl == impl].set_index(keys).ms
            out[f"{impl}/default"] = [
                ms.get(k[:3], float("nan")) / ours["default"][k] if page_size in (None, k[3]) else float("nan")
                for k in ours.index
            ]
    return out


def variant_summary(doc: dict) -> list[str]:
    """One line per variant: its time over the default build's, range and median per page size,
    and whether every held-out case was bit-identical."""
    import pandas as pd

    table = variant_table(doc)
    ident = pd.DataFrame(doc.get("identity", []))
    lines = []
    for build in [c for c in table.columns if c != "default_us" and not c.endswith("/default")]:
        parts = []
        for ps, g in table.groupby(level="page_size"):
            r = g[build]
            parts.append(f"page size {ps}: {r.min():.2f}x to {r.max():.2f}x (median {r.median():.2f}x)")
        same = ""
        if len(ident):
            mine = ident[[_build(d) == build for d in ident.defines]]
            same = f"; bit-identical in {int(mine.bit_identical.sum())} of {len(mine)} cases"
        lines.append(f"{build} / default: " + ", ".join(parts) + same)
    return lines


def default_spread(docs: dict):
    """The default build's time in several variants recordings (``docs``: name -> recording), one
    row per shape and page size measured in at least two: each run's us, and max / min. A variant
    whose ratio to the default stays inside that spread is not told apart from it by one run."""
    import pandas as pd

    cols = {name: variant_table(doc)["default_us"] for name, doc in docs.items()}
    t = pd.DataFrame(cols)
    t = t[t.notna().sum(axis=1) >= 2]
    t["max / min"] = t.max(axis=1) / t.min(axis=1)
    return t


def trace_table(doc: dict):
    """A trace recording (``python -m specdiag.bench trace``): the median cycles of each interval,
    one row per shape, page size and build, and the whole-kernel phases where the recording has
    them (``bench.trace.phases``; missing in recordings from before they were traced)."""
    import math

    import pandas as pd

    rows = []
    for r in doc["runs"]:
        build = _build({k: v for k, v in r["defines"].items() if k != "TV_TRACE"})
        rows.append(
            dict(context=r["context"], heads=r["heads"], nodes=r["nodes"], page_size=r["page_size"], build=build)
            | {k: round(v) for k, v in r["median_cycles"].items()}
            | {k: round(v) if math.isfinite(v) else v for k, v in r.get("phases", {}).items()}
        )
    return pd.DataFrame(rows).set_index(["context", "heads", "nodes", "page_size", "build"])


# The pair schedule's four groups of copies a pair (kernels/tree_verify_seesaw.cu): the median
# event that frees each (from the pair before when True), the loader's issue and the math's landing
PAIR_GROUPS = (
    ("a's early (blocks 0-3)", "warpgroup 0's P V (a - 2) done", "w0.pv_done", True, "ld.issued_e0", "w0.early_in"),
    ("b's early (blocks 4-8)", "warpgroup 1's P V (b - 2) done", "w1.pv_b_done", True, "ld.issued_e1", "w1.early_in"),
    ("a's late (blocks 4-8)", "warpgroup 1's P V (a - 2) done", "w1.pv_done", True, "ld.issued_l0", "w0.late_in"),
    ("b's late (blocks 0-3)", "warpgroup 0's P V (b - 2) done", "w0.prev_pv_done", False, "ld.issued_l1", "w1.late_in"),
)


def pair_copies(run: dict) -> tuple:
    """One pair-schedule trace (a run of ``bench.trace.trace_pairs``): each group of a pair's copies
    freed, issued and landed, in cycles after warpgroup 0's loop top (medians), and ``idle``: the
    cycles from the last group landed to the next pair's first group freed, with no copy in flight.
    Returns (DataFrame by group, idle, the pair's cycles)."""
    import pandas as pd

    med = run["median_cycles"]
    missing = [e for _, _, f, _, i, ld in PAIR_GROUPS for e in (f, i, ld) if e not in med]
    if missing:
        raise ValueError(f"not a pair trace with the copies' events (missing {', '.join(missing)})")
    pair = 2 * round(med["period"])
    rows = [
        dict(
            group=name,
            freed_by=by,
            freed=round(med[f]) - (pair if prev else 0),
            issued=round(med[i]),
            landed=round(med[ld]),
        )
        for name, by, f, prev, i, ld in PAIR_GROUPS
    ]
    df = pd.DataFrame(rows).set_index("group")
    df["issued_to_landed"] = df.landed - df.issued
    return df, int(df.freed.min() + pair - df.landed.max()), pair


def wide_trace_table(doc: dict):
    """A wide-kernel trace recording (``bench trace --impl wgmma_wide``): the median cycles of each
    interval per shape and build, computed again from the recorded events (so recordings older
    than an interval have it too), and the SM clock."""
    import numpy as np
    import pandas as pd

    from .bench.trace import summarize, wide_intervals

    rows = []
    for r in doc["runs"]:
        ev = np.asarray(r["events"], dtype=np.uint64)
        build = _build({k: v for k, v in r["defines"].items() if k not in ("TV_TRACE", "TV_TRACE_SPLIT")})
        med = summarize(wide_intervals(ev, r["tiles"]))
        rows.append(
            dict(context=r["context"], heads=r["heads"], nodes=r["nodes"], splits=r["splits"], build=build)
            | {k: round(v) if np.isfinite(v) else v for k, v in med.items()}
            | {"sm_clock_ghz": round(r["clock"]["sm_clock_ghz"], 3)}
        )
    return pd.DataFrame(rows).set_index(["context", "heads", "nodes", "splits", "build"])


NCU_FIELDS = {  # column -> ncu metric (a value, or [value, unit])
    "cycles": "Elapsed Cycles",
    "us": "Duration",
    "registers": "Registers Per Thread",
    "instructions": "smsp__inst_executed.sum",
    "smem_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "smem_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "issue_slots_busy_pct": "Issue Slots Busy",
    "busiest_pipe_pct": "highest-utilized pipeline",
}


def ncu_table(doc: dict):
    """An ncu comparison recording (data/history/ncu_seesaw_flashmla_h200.json): one row per kernel
    and shape, the fields of ``NCU_FIELDS`` plus the busiest pipeline's name."""
    import pandas as pd

    rows = []
    for r in doc["runs"]:
        m = r["metrics"]
        row = dict(kernel=r["kernel"], shape=r["shape"], grid="x".join(map(str, r["grid"])))
        for col, name in NCU_FIELDS.items():
            v = m.get(name)
            row[col] = v[0] if isinstance(v, list) else v
        pipe = m.get("highest-utilized pipeline")
        row["busiest_pipe"] = pipe[1] if pipe else None
        rows.append(row)
    return pd.DataFrame(rows).set_index(["shape", "kernel"])


def stall_table(doc: dict, reasons=("barrier", "long_sb", "wait", "selected", "no_inst")):
    """A stall-sampling recording (``python -m specdiag.bench stalls``): one row per shape and warp
    role, its samples and the share of them (%) each of ``reasons`` holds, the rest as ``other``."""
    import pandas as pd

    rows = []
    for r in doc["runs"]:
        for role, v in r["roles"].items():
            total = v["samples"] or 1
            row = dict(shape=r["shape"], role=role, samples=v["samples"])
            for k in reasons:
                row[k] = 100.0 * v["stalls"].get(k, 0) / total
            row["other"] = 100.0 - sum(row[k] for k in reasons)
            rows.append(row)
    return pd.DataFrame(rows).set_index(["shape", "role"]).round(1)


def split_length_table(rows: list[dict]):
    """A ``tools/split_counts/splits.py`` recording that alternated the plan (asked None or pT) with
    N even splits (asked N): one row per shape, both split lengths, how many timings each side has,
    their medians (us) and plan / even."""
    import statistics

    import pandas as pd

    sides = {}
    for r in rows:
        key = (r["context"], r["heads"], r["nodes"])
        sides.setdefault(key, {"plan": [], "even": []})["even" if isinstance(r["asked"], int) else "plan"].append(r)
    out = []
    for (ctx, heads, nodes), s in sides.items():
        if not (s["plan"] and s["even"]):
            raise ValueError(
                f"split_length_table: {ctx} x {heads} x {nodes} lacks the plan's or an even split's timings"
            )
        med = {k: 1e3 * statistics.median(r["ms"] for r in v) for k, v in s.items()}
        out.append(
            dict(
                context=ctx,
                heads=heads,
                nodes=nodes,
                splits=s["even"][0]["prefix_splits"],
                even_per=s["even"][0]["per"],
                plan_per=s["plan"][0]["per"],
                timings=min(len(s["plan"]), len(s["even"])),
                even_us=med["even"],
                plan_us=med["plan"],
                plan_over_even=med["plan"] / med["even"],
            )
        )
    return pd.DataFrame(out).set_index(["context", "heads", "nodes"])
