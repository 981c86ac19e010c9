"""Nsight Compute counters of one launch of each named verify's main kernel (ours: the partial
kernel; FlashMLA: its split or sparse kernel, not the combine), L2 warm after two warm-up calls,
clocks free, page size as the peers bench gives each (ours 1, FlashMLA's dense decode 64).

Usage (on the GPU, ncu on PATH, FlashMLA's wheel importable for its peers):
  python tools/ncu_counters/counters.py OUT.json CTXxHEADSxNODES[,...] IMPL[,...]
IMPL: the peers bench's names (native:KERNEL, flashmla, flashmla_sparse); a native one may carry
the kernel's -D switches after "+": native:wgmma_seesaw+TV_PAIR=1+TV_SKIP=8.
Its forerunner's recordings: data/history/session32_h100.json runs 5, 6 and 8 (docs/kernel_notes.md,
thirty-second session).
"""

import json
import sys
from pathlib import Path

KERNELS = "partial|splitkv_mla|sparse_attn_fwd"
METRICS = (
    "gpc__cycles_elapsed.max",
    "gpu__time_duration.sum",
    "smsp__inst_executed.sum",
    "smsp__inst_executed_op_ldgsts.sum",
    "sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm__issue_active.avg.pct_of_peak_sustained_elapsed",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "lts__t_bytes.sum",
    "launch__registers_per_thread",
    # how evenly the SMs are busy over the launch, and at what clock
    "sm__cycles_active.avg",
    "sm__cycles_active.min",
    "sm__cycles_active.max",
    "gpc__cycles_elapsed.avg.per_second",
    "lts__t_sector_hit_rate.pct",
    "dram__bytes_read.sum",
)
SHOWN = METRICS[:6] + METRICS[-6:]


def parse_impl(text: str) -> tuple[str, dict[str, int]]:
    """'native:wgmma_seesaw+TV_PAIR=1' -> ('native:wgmma_seesaw', {'TV_PAIR': 1}); a one-line error otherwise."""
    from specdiag.bench.variants import check_switches, parse_variants

    impl, _, switches = text.partition("+")
    if not (impl.startswith("native:") or impl in ("native", "flashmla", "flashmla_sparse")):
        raise SystemExit(f"counters: IMPL is native[:KERNEL][+NAME=INT...], flashmla or flashmla_sparse, got {text!r}")
    if not switches:
        return impl, {}
    if not impl.startswith("native:"):
        raise SystemExit(f"counters: -D switches are ours only, for one kernel (native:KERNEL), got {text!r}")
    try:  # (a switch the kernel never names would silently time its default build)
        defines = parse_variants(switches.replace("+", ","))[0]
        check_switches(impl.partition(":")[2], [defines])
    except ValueError as e:
        raise SystemExit(f"counters: {e}") from None
    return impl, defines


def parse_shape(text: str) -> tuple[int, int, int]:
    from specdiag.bench.variants import parse_shapes

    try:
        (shape,) = parse_shapes(text)
    except ValueError:
        raise SystemExit(f"counters: a shape is CTXxHEADSxNODES, e.g. 32768x128x65, got {text!r}") from None
    return shape


def launch(shape: str, impl_text: str) -> None:
    """One profiled call (between cudaProfilerStart and Stop) after two warm-up calls."""
    import torch

    from specdiag.bench.peers import peer_calls, peer_page_size
    from specdiag.bench.timing import Rotation

    (ctx, heads, nodes), (impl, defines) = parse_shape(shape), parse_impl(impl_text)
    rot = Rotation(
        ctx,
        peer_page_size(impl),
        nodes,
        heads,
        torch.cuda.get_device_properties(0).L2_cache_size,
        seed=ctx + heads + nodes,
    )
    if defines:
        calls = [op.run for op in rot.native_ops(impl=impl.partition(":")[2] or "auto", defines=defines)]
    else:
        calls, _ = peer_calls(impl, rot)
    for c in calls[:2]:
        c()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    calls[2 % len(calls)]()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def preflight(impls: str, tool: str) -> list[str]:
    """The IMPL list, each name checked, once ncu is found; a one-line error (``tool: ...``) otherwise."""
    from specdiag.probes.ncu import find_ncu

    impl_list = impls.split(",")
    for i in impl_list:
        parse_impl(i)
    try:
        find_ncu()
    except FileNotFoundError as e:
        raise SystemExit(f"{tool}: {e}") from None
    return impl_list


def main(out: str, shapes: str, impls: str) -> None:
    from specdiag.machine import machine_metadata
    from specdiag.probes.ncu import run_ncu

    shape_list = shapes.split(",")
    for s in shape_list:
        parse_shape(s)
    impl_list = preflight(impls, "counters")
    rows = []
    for s in shape_list:
        for i in impl_list:
            df, _ = run_ncu([__file__, "--launch", s, i], kernel_regex=KERNELS, metrics=list(METRICS))
            for _, r in df.iterrows():
                rows.append(
                    dict(shape=s, impl=i, kernel=r["Kernel Name"], metrics={m: r[m] for m in METRICS if m in r})
                )
                print(s, i, {m: r[m] for m in SHOWN if m in r}, flush=True)
    Path(out).write_text(
        json.dumps({"kind": "ncu_counters", "machine": machine_metadata(), "rows": rows}, indent=1, default=float)
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--launch":
        launch(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4:
        main(*sys.argv[1:])
    else:
        raise SystemExit(__doc__.split("\n\n")[1])
