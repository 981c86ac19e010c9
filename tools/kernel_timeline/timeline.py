"""Each kernel of one verify call, as CUPTI records it (torch.profiler): ours (impl="auto", page
size 1: partial kernel, then merge) and FlashMLA's prefix call (page size 64: split kernel, then
its combine). 12 calls per shape, a 256 MB L2 flush before each, rotated inputs.

Usage (on the GPU, FlashMLA's wheel importable): python tools/kernel_timeline/timeline.py OUT.json
[IMPLS [SHAPES]], IMPLS the peers bench's names, comma-separated (default native,flashmla;
native:KERNEL for one kernel, e.g. native:wgmma_wide), SHAPES "CTXxHEADSxNODES,..." (default SHAPES below).
Recorded: data/history/kernel_timeline_h200.json (docs/kernel_notes.md, nineteenth session).
"""

import json
import os
import sys
import tempfile

import torch

from specdiag.bench import variants
from specdiag.bench.peers import peer_calls, peer_page_size
from specdiag.bench.timing import Rotation

SHAPES = [(185000, 8, 9), (32768, 8, 9), (65536, 16, 9), (131072, 8, 9), (32768, 128, 9), (32768, 64, 65)]
CALLS = 12


def timeline(calls, flush):
    """[[kernel name, start us from the call's first kernel, duration us], ...] per call."""
    for c in calls[:3]:
        c()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            flush.zero_()
            calls[i % len(calls)]()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    out, cur = [], None
    for e in kernels:
        if "fill" in e["name"].lower():  # the flush: a new call starts
            cur = []
            out.append(cur)
        elif cur is not None:
            cur.append(e)
    return [[[e["name"][:60], round(e["ts"] - c[0]["ts"], 2), round(e["dur"], 2)] for e in c] for c in out if c]


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    try:
        return variants.parse_shapes(text)
    except ValueError:
        raise SystemExit(f"timeline: SHAPES is CTXxHEADSxNODES,..., e.g. 32768x8x257, got {text!r}") from None


def main(path, impls=("native", "flashmla"), shapes=SHAPES):
    for impl in impls:
        peer_page_size(impl)  # an unknown name fails here, before any GPU work
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    res = {}
    for ctx, h, t in shapes:
        row = {}
        for impl in impls:  # the peers bench's calls, at its page sizes
            rot = Rotation(ctx, peer_page_size(impl), t, h, l2, seed=ctx + h + t)
            row[impl] = timeline(peer_calls(impl, rot)[0], flush)
            del rot
        res[f"{ctx}x{h}x{t}"] = row
        torch.cuda.empty_cache()
        print(ctx, h, t, "done", flush=True)
    json.dump(res, open(path, "w"))


if __name__ == "__main__":
    if not 2 <= len(sys.argv) <= 4:
        raise SystemExit(__doc__.split("\n\n")[1])
    impls = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("native", "flashmla")
    main(sys.argv[1], impls, parse_shapes(sys.argv[3]) if len(sys.argv) > 3 else SHAPES)
