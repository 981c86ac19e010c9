"""Nsight Compute under Python: run a workload, parse the CSV, compute the tensor-pipe fraction.

    df = run_ncu(["-m", "specdiag.probes.workloads", "native"], kernel_regex="tree_verify")
    df["tensor_pipe_frac"]     # sm__pipe_tensor_cycles_active.avg / gr__cycles_elapsed.max

Clocks are left alone (``--clock-control none``). Only the profiler range that the workload
opens (cudaProfilerStart/Stop) is profiled, so set-up kernels stay out.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys

__all__ = [
    "DEFAULT_METRICS",
    "TENSOR_METRIC_CANDIDATES",
    "ncu_command",
    "parse_ncu_csv",
    "run_ncu",
    "available_metrics",
    "pick_tensor_metric",
    "add_fractions",
    "slim",
]

TENSOR_METRIC_CANDIDATES = (
    "sm__pipe_tensor_cycles_active.avg",
    "sm__pipe_tensor_op_hmma_cycles_active.avg",
    "sm__pipe_tensor_op_gmma_cycles_active.avg",
)
DEFAULT_METRICS = (
    TENSOR_METRIC_CANDIDATES[0],
    "gr__cycles_elapsed.max",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
)
_ID_COLUMNS = (
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
)


def find_ncu() -> str:
    exe = shutil.which("ncu")
    if exe is None:
        raise FileNotFoundError("ncu (Nsight Compute) is not on PATH")
    return exe


def ncu_command(
    argv: list[str],
    kernel_regex: str | None = None,
    metrics=DEFAULT_METRICS,
    ncu: str | None = None,
    python: str | None = None,
) -> list[str]:
    cmd = [
        ncu or find_ncu(),
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--metrics",
        ",".join(metrics),
    ]
    if kernel_regex:
        cmd += ["-k", f"regex:{kernel_regex}"]
    return cmd + [python or sys.executable, *argv]


def _number(text: str):
    t = text.strip().replace(",", "")
    if t in ("", "n/a"):
        return float("nan")
    try:
        return float(t)
    except ValueError:
        return text


def parse_ncu_csv(text: str):
    """ncu ``--csv --page raw`` output -> DataFrame (one row per profiled kernel launch).

    Lines before the CSV header (``==PROF==`` and the program's own output) are skipped; the
    units row is dropped and recorded in ``df.attrs['units']``; numbers lose thousands separators.
    """
    import pandas as pd

    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        errs = [l for l in lines if "==ERROR==" in l]
        raise ValueError("no ncu CSV table in the output" + (": " + " | ".join(errs) if errs else ""))
    rows = list(csv.reader(io.StringIO("\n".join(l for l in lines[start:] if not l.startswith("==")))))
    header, rest = rows[0], rows[1:]
    units = {}
    if rest and rest[0] and rest[0][0] == "":
        units = dict(zip(header, rest[0]))
        rest = rest[1:]
    recs = []
    for r in rest:
        if len(r) != len(header):
            continue
        recs.append({h: (v if h in _ID_COLUMNS else _number(v)) for h, v in zip(header, r)})
    df = pd.DataFrame(recs, columns=header)
    df.attrs["units"] = units
    return df


def add_fractions(df, tensor_metric: str | None = None):
    """Adds ``tensor_pipe_frac`` = tensor-pipe active cycles (per-SM average) / elapsed cycles.

    This is the postmortem's formula. On Hopper the raw ratio can exceed 1 (a busy GEMM read
    3.6 on an H200): the counter adds up the SM's sub-partition tensor pipes, so compare it
    with ``sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed`` (collected by
    default), which ncu normalises to the pipes' peak.
    """
    df = df.copy()
    metric = tensor_metric or next((m for m in TENSOR_METRIC_CANDIDATES if m in df.columns), None)
    if metric and "gr__cycles_elapsed.max" in df.columns:
        df["tensor_pipe_frac"] = df[metric].astype(float) / df["gr__cycles_elapsed.max"].astype(float)
        df.attrs["tensor_metric"] = metric
    return df


def slim(df):
    """Only the launch identity, the requested metrics' roll-ups, duration and the fractions
    (``--page raw`` also lists every device attribute)."""
    keep = [
        c
        for c in df.columns
        if c in _ID_COLUMNS or c.startswith(("sm__", "gr__", "dram__", "gpu__time_duration")) or c == "tensor_pipe_frac"
    ]
    return df[keep]


def available_metrics(ncu: str | None = None) -> set[str]:
    """Base metric names ncu knows for the attached GPU (``ncu --query-metrics``)."""
    res = subprocess.run([ncu or find_ncu(), "--query-metrics"], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"ncu --query-metrics failed: {res.stderr.strip()[-500:]}")
    return {
        line.split()[0] for line in res.stdout.splitlines() if line and not line.startswith(("-", "Device", "Metric"))
    }


def pick_tensor_metric(known: set[str]) -> str:
    for m in TENSOR_METRIC_CANDIDATES:
        if m.rsplit(".", 1)[0] in known:
            return m
    raise RuntimeError(f"none of the tensor-pipe metrics {TENSOR_METRIC_CANDIDATES} is known to this ncu/GPU")


def run_ncu(
    argv: list[str], kernel_regex: str | None = None, metrics=None, ncu: str | None = None, timeout: int = 600, env=None
):
    """Profile ``python argv...`` and return (DataFrame with fractions, raw stdout)."""
    if metrics is None:
        metrics = list(DEFAULT_METRICS)
        try:
            metrics[0] = pick_tensor_metric(available_metrics(ncu))
        except (RuntimeError, FileNotFoundError):
            pass
    cmd = ncu_command(argv, kernel_regex, metrics, ncu)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"ncu exited {res.returncode}: {(res.stderr or res.stdout).strip()[-1500:]}")
    return add_fractions(parse_ncu_csv(res.stdout)), res.stdout
