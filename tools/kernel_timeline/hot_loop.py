"""Each verify in a hot loop (about 0.4 s of calls back to back, a synchronize every 20, rotated
inputs, no flush): its time a call from events, and meanwhile NVML's SM clock, power and
clock-event reasons (their OR: 4 is the software power cap). For ours a traced build's loop as well
(``traced``, TV_TRACE=1 with the pair schedule), whose last call gives the effective clock: CTA
(0, 0, 0)'s clock64 cycles over its global-timer ns, beside what NVML reports. Impls run in the
order native, flashmla, traced, native, flashmla at each shape.

Usage (on the GPU, FlashMLA's wheel and nvidia-ml-py importable):
  python tools/kernel_timeline/hot_loop.py OUT.json CTXxHEADSxNODES[,...]
Recorded: data/history/session43_h100.json, run4_clock_loop (its code before it was committed);
data/history/session44_h100.json, run1_hot_loop (docs/kernel_notes.md, forty-third and forty-fourth sessions).
"""

import json
import statistics
import sys
import threading
import time

IMPLS = ("native", "flashmla", "traced", "native", "flashmla")
TRACED = {"TV_TRACE": 1, "TV_PAIR": 1}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    from specdiag.bench import variants

    try:
        return variants.parse_shapes(text)
    except ValueError:
        raise SystemExit(f"hot_loop: SHAPES is CTXxHEADSxNODES,..., e.g. 32768x8x65, got {text!r}") from None


def _sample(nv, h, stop: threading.Event, rows: list) -> None:
    """NVML's SM clock (MHz), power (W) and clock-event reasons (-1: not readable) every 5 ms until ``stop``."""
    reasons = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    while not stop.is_set():
        try:
            why = reasons(h)
        except nv.NVMLError:
            why = -1
        rows.append(
            {
                "mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "w": nv.nvmlDeviceGetPowerUsage(h) / 1e3,
                "reasons": why,
            }
        )
        time.sleep(0.005)


def hot_loop(calls: list, nv, h, seconds: float = 0.4) -> dict:
    """``calls`` in turn for about ``seconds`` after three rounds of warm-up: us a call, NVML's readings."""
    import torch

    for c in calls * 3:
        c()
    torch.cuda.synchronize()
    rows, stop = [], threading.Event()
    sampler = threading.Thread(target=_sample, args=(nv, h, stop, rows))
    sampler.start()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, t0 = 0, time.perf_counter()
    start.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            calls[n % len(calls)]()
            n += 1
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    stop.set()
    sampler.join()
    reasons = 0
    for r in rows:
        reasons |= max(0, r["reasons"])
    return {
        "calls": n,
        "us_per_call": start.elapsed_time(end) * 1e3 / n,
        "mhz_median": statistics.median(r["mhz"] for r in rows),
        "mhz_min": min(r["mhz"] for r in rows),
        "w_median": statistics.median(r["w"] for r in rows),
        "reasons_or": reasons,
        "samples": len(rows),
    }


def effective_clock(op) -> dict:
    """``bench.trace.cta0_clock`` of the traced build's last call (``op``: one of its NativeTreeVerify)."""
    from specdiag.bench.trace import cta0_clock, read_stamps

    return cta0_clock(*read_stamps(op))


def main(path: str, shapes) -> None:
    import pynvml as nv
    import torch

    from specdiag.bench.peers import peer_calls, peer_page_size
    from specdiag.bench.timing import Rotation

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = []
    for ctx, heads, nodes in shapes:
        for impl in IMPLS:
            rot = Rotation(
                ctx, peer_page_size("native" if impl == "traced" else impl), nodes, heads, l2, seed=ctx + heads + nodes
            )
            if impl == "traced":
                ops = rot.native_ops(impl="wgmma_seesaw", defines=TRACED)
                r = hot_loop([op.run for op in ops], nv, h)
                r.update(effective_clock(ops[0]))
            else:
                r = hot_loop(peer_calls(impl, rot)[0], nv, h)
            r.update(impl=impl, shape=f"{ctx}x{heads}x{nodes}")
            out.append(r)
            print(r["shape"], impl, {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}, flush=True)
            del rot
            torch.cuda.empty_cache()
    json.dump(out, open(path, "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    main(sys.argv[1], parse_shapes(sys.argv[2]))
