"""python -m specdiag.bench MODE --out FILE: record a measurement on this GPU (with its metadata)."""

from __future__ import annotations

import argparse
import sys

from ..attention.registry import KERNELS
from ..cost import LAYERS, SOFTMAX_SCALE
from ..data import save
from ..machine import gpu_available

MODES = {
    "check": "one kernel against the float64 reference",
    "sweep": "time implementations per context x heads x tree",
    "ceilings": "copy bandwidth and bf16 GEMM rate",
    "tune": "one kernel at 1, 2, 4 waves of split CTAs",
    "ablate": "a kernel with each stage left out",
    "peers": "ours beside FlashMLA and the real sglang kernel (data/peers_h200.json)",
    "sanitize": "compute-sanitizer memcheck, racecheck, synccheck over every kernel",
    "engine": "the adapter on the engine's tensors against the real sglang kernel, and the step's time",
    "variants": "compile-time variants of a kernel (--defines): bit-identity, then time beside FlashMLA",
    "trace": "per-tile timeline (clock64 events of one CTA) of the seesaw kernel (tiles in turns; its pair "
    "schedule with --defines TV_PAIR=1) or --impl wgmma_wide, per shape",
    "stalls": "where the warps wait: ncu's stall sampling per warp role, seesaw or --impl wgmma_wide (--shapes)",
}


def trace_impl(impl: str) -> str:
    """The kernel ``trace`` records: the wide kernel when named, else the seesaw kernel."""
    return "wgmma_wide" if impl == "wgmma_wide" else "wgmma_seesaw"


def main(argv=None) -> int:
    from . import timing

    ap = argparse.ArgumentParser(
        prog="python -m specdiag.bench",
        description=__doc__,
        epilog="modes: " + "; ".join(f"{k}: {v}" for k, v in MODES.items()),
    )
    ap.add_argument("mode", choices=list(MODES))
    ap.add_argument("--out", required=True, help="the result file (JSON)")
    ap.add_argument(
        "--impl", default="auto", choices=["auto", *KERNELS], help="check, tune, ablate, stalls: which kernel"
    )
    ap.add_argument(
        "--impls",
        default="native_auto,native_auto_ps1,triton,torch",
        help=f"sweep: any of {', '.join(timing.SWEEP_IMPLS)}",
    )
    ap.add_argument(
        "--peers", default=None, help="peers: comma-separated impls, native:KERNEL for one kernel (default: all)"
    )
    ap.add_argument("--contexts", default=None, help="sweep: comma-separated prefix lengths (default: the full sweep)")
    ap.add_argument("--heads", default=None, help="sweep, peers: comma-separated head counts")
    ap.add_argument("--trees", default=None, help="sweep, peers: comma-separated tree sizes (nodes, root included)")
    ap.add_argument("--quick", action="store_true", help="sweep: a few contexts only")
    ap.add_argument("--rep-ms", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=2, help="peers: timings of each impl a shape (the fastest kept)")
    ap.add_argument(
        "--defines",
        default="",
        help="variants, trace, check: 'NAME=INT[,NAME=INT];...' (trace, check: '' is the default build)",
    )
    ap.add_argument("--page-sizes", default="1,64", help="variants, trace, ablate: comma-separated KV page sizes")
    ap.add_argument("--prefix-splits", type=int, default=None, help="trace: force the prefix split count")
    ap.add_argument("--tree-split", action="store_true", help="trace --impl wgmma_wide: trace the tree split's CTA")
    ap.add_argument(
        "--shapes",
        default=None,
        help="variants, trace, stalls, ablate: CONTEXTxHEADSxNODES,... (default: the mode's own)",
    )
    a = ap.parse_args(argv)
    # the one kernel variants, trace, stalls, ablate and check --defines work on (auto: the seesaw's)
    kernel = trace_impl(a.impl) if a.mode == "trace" else "wgmma_seesaw" if a.impl == "auto" else a.impl
    variants = []
    if a.mode in ("variants", "trace", "stalls", "ablate") or (a.mode == "check" and a.defines.strip()):
        from .variants import parse_shapes, parse_variants

        try:
            variants = parse_variants(a.defines) if a.mode == "variants" or a.defines.strip() else []
            page_sizes = tuple(int(x) for x in a.page_sizes.split(","))
        except ValueError as e:
            print(f"bad --defines or --page-sizes: {e}", file=sys.stderr)
            return 2
        try:
            shapes = tuple(parse_shapes(a.shapes)) if a.shapes else None
        except ValueError as e:
            print(f"bad --shapes: {e}", file=sys.stderr)
            return 2
        if a.mode == "ablate" and not KERNELS[kernel].ablations:
            print(
                f"bad --impl: {a.impl} has no stage switches (TV_SKIP); ablate takes "
                f"{', '.join(k for k, s in KERNELS.items() if s.ablations)}",
                file=sys.stderr,
            )
            return 2
        if a.mode in ("trace", "stalls"):
            from .stalls import STALL_IMPLS
            from .trace import TRACE_IMPLS

            takes = TRACE_IMPLS if a.mode == "trace" else tuple(STALL_IMPLS)
            if a.impl not in ("auto", *takes):
                print(
                    f"bad --impl: {a.mode} takes {' or '.join(takes)} (auto: wgmma_seesaw), got {a.impl}",
                    file=sys.stderr,
                )
                return 2
        if a.mode == "trace" and a.tree_split and a.prefix_splits is not None:
            print("bad --prefix-splits: --tree-split traces the plan's own tree split", file=sys.stderr)
            return 2
        if a.mode == "trace" and a.tree_split and kernel != "wgmma_wide":
            print("bad --tree-split: only the wide kernel's trace picks its CTA", file=sys.stderr)
            return 2
        from .variants import check_switches

        try:
            if a.mode == "check" and a.impl == "auto":
                raise ValueError("check --defines needs --impl: the kernel whose source they switch")
            if a.mode == "stalls" and variants:
                raise ValueError("stalls samples the default build only")
            check_switches(kernel, variants)
        except ValueError as e:
            print(f"bad --defines: {e}", file=sys.stderr)
            return 2
    ints = lambda v, d: tuple(int(x) for x in v.split(",")) if v else d  # noqa: E731
    try:
        ints(a.contexts, None), ints(a.heads, None), ints(a.trees, None)
    except ValueError:
        print(
            f"bad --contexts, --heads or --trees: comma-separated integers, got {a.contexts}, {a.heads}, {a.trees}",
            file=sys.stderr,
        )
        return 2
    if a.rounds < 1:
        print(f"bad --rounds: at least 1, got {a.rounds}", file=sys.stderr)
        return 2
    if a.mode == "peers":
        from .peers import PEER_SHAPES, peer_page_size

        try:
            for impl in a.peers.split(",") if a.peers else ():
                peer_page_size(impl)
        except ValueError as e:
            print(f"bad --peers: {e}", file=sys.stderr)
            return 2

        heads, trees = ints(a.heads, None), ints(a.trees, None)
        shapes = [s for s in PEER_SHAPES if (heads is None or s[0] in heads) and (trees is None or s[1] in trees)]
        if not shapes:
            print(f"no peers shape has those --heads / --trees; (heads, nodes): {PEER_SHAPES}", file=sys.stderr)
            return 2
    if not gpu_available():
        print("no CUDA GPU: the benchmarks need one (notebooks fall back to the recordings in data/)", file=sys.stderr)
        return 2
    if a.mode == "check":
        from .checks import check_native, passed

        res = [r for v in variants or [None] for r in check_native(impl=a.impl, defines=v)]
        for r in res:
            print(r)
        save(a.out, "native_check", {"results": res})
        bad = [r for r in res if not passed(r)]
        print(f"{len(res) - len(bad)} passed, {len(bad)} failed")
        return 1 if bad else 0
    if a.mode == "tune":
        save(a.out, "native_tune", {"rows": timing.tune(impl="mma" if a.impl == "auto" else a.impl, rep_ms=a.rep_ms)})
        return 0
    if a.mode == "ablate":
        from .ablation import ablate

        save(a.out, "native_ablation", {"rows": ablate(shapes, impl=kernel, page_sizes=page_sizes)})
        return 0
    if a.mode == "sanitize":
        from .sanitize import WORKLOAD, WORKLOAD_FIELDS, probe, sanitize

        rows = sanitize([*KERNELS] if a.impl == "auto" else [a.impl])
        probes = probe()
        workload = [dict(zip(WORKLOAD_FIELDS, c)) for c in WORKLOAD]
        save(a.out, "sanitizer", {"rows": rows, "probe": probes, "workload": workload})
        bad = [r for r in rows if r["findings"] != 0 or r["exit_code"] != 0]
        print(f"{len(rows) - len(bad)} clean, {len(bad)} not")
        return 1 if bad else 0
    if a.mode == "stalls":
        import gzip
        from pathlib import Path

        from .stalls import STALL_IMPLS, parse_source_csv, profile, summarize

        _, roles, default_shapes = STALL_IMPLS[kernel]
        shapes = shapes or default_shapes
        text = profile(shapes, impl=kernel)
        runs = summarize(parse_source_csv(text), shapes, roles=roles)
        out = save(a.out, "stalls", {"impl": kernel, "shapes": [list(s) for s in shapes], "runs": runs})
        raw = Path(out).with_suffix(".source.csv.gz")
        raw.write_bytes(gzip.compress(text.encode()))
        print(f"ncu's source page: {raw}")
        return 0
    if a.mode == "engine":
        from ..attention.peers import sglang_provenance
        from .engine import engine_checks, engine_step_times

        checks = engine_checks()
        steps = engine_step_times()
        save(a.out, "engine", {"sglang": sglang_provenance(), "checks": checks, "steps": steps, "layers": LAYERS})
        return 0
    if a.mode == "variants":
        from .variants import VARIANT_SHAPES, identity, time_variants

        ident = identity(kernel, variants)
        ceilings = timing.measure_ceilings()
        rows = time_variants(kernel, variants, shapes or VARIANT_SHAPES, page_sizes, rep_ms=min(a.rep_ms, 25.0))
        save(a.out, "variants", {"ceilings": ceilings, "identity": ident, "rows": rows})
        return 0 if all(r["bit_identical"] for r in ident) else 1
    if a.mode == "trace":
        from .trace import TRACE_SHAPES, trace_pairs, trace_seesaw, trace_wide

        runs = []
        for ctx, heads, nodes in shapes or TRACE_SHAPES:
            for ps in page_sizes:
                for v in [{}, *variants]:
                    if kernel == "wgmma_wide":
                        r = trace_wide(
                            ctx, heads, nodes, page_size=ps, defines=v, tree=a.tree_split, prefix_splits=a.prefix_splits
                        )
                        ph = {"tops": [round(x) for x in r["top_cycles"][:4]], **r["clock"]}
                    else:  # tiles in turns unless TV_PAIR=1 is asked
                        how = trace_pairs if v.get("TV_PAIR", 0) else trace_seesaw
                        r = how(ctx, heads, nodes, page_size=ps, defines=v, prefix_splits=a.prefix_splits)
                        ph = {k: round(x) if x == x else x for k, x in r["phases"].items()}
                    runs.append(r)
                    med = {k: round(x) if x == x else x for k, x in r["median_cycles"].items()}
                    print(f"ctx={ctx} H={heads} T={nodes} ps={ps} {v}: {med} {ph}")
                    if "ctas" in r:
                        print("  CTAs (us):", r["ctas"]["summary"], "CTA 0's clock:", r["ctas"]["clock"])
        save(a.out, "trace", {"runs": runs})
        return 0
    ceilings = timing.measure_ceilings()
    print(ceilings)
    if a.mode == "peers":
        from ..attention.peers import sglang_provenance
        from .peers import PEER_CONTEXTS, PEER_IMPLS, peer_sweep

        impls = tuple(a.peers.split(",")) if a.peers else tuple(PEER_IMPLS)
        meta = {}
        try:
            import flash_mla

            meta["flash_mla"] = flash_mla.__version__
        except ImportError:
            pass

        said = set()  # a missing peer is named once, not once per context

        def once(line):
            if line not in said:
                said.add(line)
                print(line)

        sglang = {}  # its provenance (files hashed) once, after the first context it ran in

        def run_peers(ctx):
            rows, missing = peer_sweep(
                contexts=(ctx,), shapes=shapes, impls=impls, rep_ms=a.rep_ms, progress=once, rounds=a.rounds
            )
            if not sglang and "sglang" in impls and "sglang" not in missing:  # (it ran: its files are here)
                sglang["sglang"] = sglang_provenance()
            return rows, {"missing": missing, **sglang}

        head = {"ceilings": ceilings, "softmax_scale": SOFTMAX_SCALE, "rounds": a.rounds, **meta}
        by_context(a.out, "peers", ints(a.contexts, PEER_CONTEXTS), run_peers, head)
        return 0
    if a.mode == "ceilings":
        save(a.out, "ceilings", {"ceilings": ceilings})
        return 0
    contexts = ints(a.contexts, (4096, 32768, 131072) if a.quick else timing.SWEEP_CONTEXTS)

    heads, trees, impls = ints(a.heads, timing.SWEEP_HEADS), ints(a.trees, timing.SWEEP_TREES), a.impls.split(",")

    def run_sweep(ctx):
        return timing.context_sweep(contexts=(ctx,), heads=heads, trees=trees, impls=tuple(impls), rep_ms=a.rep_ms), {}

    head = {"ceilings": ceilings, "layers": LAYERS, "softmax_scale": SOFTMAX_SCALE}
    by_context(a.out, "context_sweep", contexts, run_sweep, head)
    return 0


def by_context(out: str, kind: str, contexts, run, head: dict) -> None:
    """``run(context) -> (rows, extra)`` context by context, the recording saved after each, marked
    ``partial`` (the contexts done, of which) until the last is in: a run cut off keeps what it
    measured, and says so."""
    rows, extra = [], {}
    for i, ctx in enumerate(contexts):
        got, more = run(ctx)
        rows += got
        extra.update(more)
        done = list(contexts[: i + 1])
        partial = {} if i + 1 == len(contexts) else {"partial": {"contexts_done": done, "contexts": list(contexts)}}
        save(out, kind, {**head, **extra, **partial, "rows": rows})
        print(f"saved {out}: {len(done)} of {len(contexts)} contexts", flush=True)


if __name__ == "__main__":
    sys.exit(main())
