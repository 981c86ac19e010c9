"""Notebook 02's measurement: the three workloads under the NVML sampler and under ncu.

python -m specdiag.probes.study --out data/probes_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .nvml import NvmlSampler, summarize
from .workloads import KERNEL_REGEX, WORKLOADS, make_workload, run_for

__all__ = ["collect"]


def collect(
    seconds: float = 3.0, period_s: float = 0.05, context: int = 131072, ncu: bool = True, progress=print
) -> dict:
    """Idle, then each workload for ``seconds`` under the sampler; then one ncu pass each."""
    import torch

    from ..machine import machine_metadata

    fns = {name: make_workload(name, context=context) for name in WORKLOADS}
    for fn in fns.values():  # compile / warm up outside the sampled window
        fn()
    torch.cuda.synchronize()
    launches = {}
    with NvmlSampler(period_s=period_s) as s:
        s.mark("idle")
        time.sleep(min(seconds, 1.5))
        for name, fn in fns.items():
            s.mark(name)
            launches[name] = run_for(fn, seconds)
            progress(f"{name}: {launches[name]} launches in {seconds} s")
        s.mark("idle-after")
        time.sleep(0.5)
    frame = s.frame()
    doc = {
        "kind": "probes",
        "machine": machine_metadata(),
        "context": context,
        "period_s": period_s,
        "seconds_per_workload": seconds,
        "launches": launches,
        "unsupported": s.unsupported_messages(),
        "samples": json.loads(frame.to_json(orient="records")),
        "summary": json.loads(summarize(frame).to_json(orient="records")),
    }
    if ncu:
        from . import ncu as ncu_mod

        doc["ncu"], doc["ncu_raw"] = {}, {}
        for name in WORKLOADS:
            try:
                df, raw = ncu_mod.run_ncu(
                    ["-m", "specdiag.probes.workloads", name, "--iters", "1", "--context", str(context)],
                    kernel_regex=KERNEL_REGEX[name],
                )
                doc["ncu"][name] = json.loads(ncu_mod.slim(df).to_json(orient="records"))
                doc["ncu_raw"][name] = raw[-20000:]
                progress(
                    f"ncu {name}: {len(df)} kernel(s), tensor-pipe fraction "
                    f"{df['tensor_pipe_frac'].round(4).tolist() if 'tensor_pipe_frac' in df else 'n/a'}"
                )
            except Exception as e:  # record why, keep the sampler data
                doc["ncu"][name] = {"error": str(e)[-2000:]}
                progress(f"ncu {name} failed: {e}")
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.probes.study")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--period", type=float, default=0.05)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--no-ncu", action="store_true")
    a = ap.parse_args(argv)
    from ..machine import gpu_available

    if not gpu_available():
        print(f"{ap.prog}: needs a CUDA GPU (the notebooks show the recordings in data/ without one)", file=sys.stderr)
        return 2
    doc = collect(a.seconds, a.period, a.context, ncu=not a.no_ncu)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1, default=float))
    print(json.dumps(doc["summary"], indent=1)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
