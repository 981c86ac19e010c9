"""Background NVML sampler: what nvidia-smi reports next to what the GPU is really doing.

``utilization.gpu`` is a duty cycle: the fraction of the sample period in which *any* kernel
was resident. One CTA on one SM for the whole period reads 100%. The GPM counters (Hopper and
later) say how much of the chip worked: SM busy, warp occupancy, tensor pipes, DRAM bandwidth.

    with NvmlSampler(period_s=0.02) as s:
        run_workload()
    df = s.frame()            # one row per (sample, GPU), columns in COLUMNS

Works without root. A metric the GPU or driver does not support is recorded as NaN and
explained once in ``sampler.unsupported`` ({(gpu, metric): reason}).
"""

from __future__ import annotations

import math
import threading
import time

__all__ = [
    "COLUMNS",
    "GPM_METRICS",
    "NvmlBackend",
    "NvmlSampler",
    "ReplayBackend",
    "clocked",
    "mask_stale_gpm",
    "summarize",
]

# NVML GPM metric ids (nvml.h: NVML_GPM_METRIC_*)
GPM_METRICS = {
    "gpm_sm_util": 2,  # % of SMs busy
    "gpm_sm_occupancy": 3,  # % of warps active vs theoretical max
    "gpm_any_tensor_util": 5,  # % of time SMs did any tensor op
    "gpm_dram_bw_util": 10,  # % of peak DRAM bandwidth
}
_FI_POWER_AVERAGE = 185  # NVML_FI_DEV_POWER_AVERAGE (mW, 1 s average)
_FI_POWER_INSTANT = 186  # NVML_FI_DEV_POWER_INSTANT (mW)

COLUMNS = [
    "t_s",
    "gpu",
    "util_gpu_pct",
    "util_mem_pct",
    "power_w",
    "power_avg_w",
    "power_limit_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    *GPM_METRICS,
]


class NvmlBackend:
    """Reads the real driver through nvidia-ml-py (``import pynvml``)."""

    def __init__(self):
        try:
            import pynvml
        except ImportError as e:
            raise RuntimeError("nvidia-ml-py is not installed: pip install 'specdiag[gpu]'") from e
        self.nv = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def device_count(self) -> int:
        return len(self.handles)

    def read(self, i: int, skip: set) -> tuple[dict, dict]:
        """Instant fields of GPU i; returns (values, {field: reason} for newly unsupported ones)."""
        nv, h = self.nv, self.handles[i]
        vals, bad = {}, {}

        def get(name, fn):
            if name in skip:
                return
            try:
                vals.update(fn())
            except nv.NVMLError as e:
                bad[name] = str(e)

        def util():
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return {"util_gpu_pct": float(u.gpu), "util_mem_pct": float(u.memory)}

        def power():
            fv = nv.nvmlDeviceGetFieldValues(h, [_FI_POWER_INSTANT, _FI_POWER_AVERAGE])
            out = {}
            for key, v in zip(("power_w", "power_avg_w"), fv):
                out[key] = v.value.uiVal / 1000.0 if v.nvmlReturn == 0 else math.nan
            if math.isnan(out["power_w"]):
                out["power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
            return out

        get("util", util)
        get("power", power)
        get("power_limit_w", lambda: {"power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0})
        get(
            "clocks",
            lambda: {
                "sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                "mem_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            },
        )
        return vals, bad

    def gpm_supported(self, i: int) -> tuple[bool, str]:
        try:
            ok = bool(self.nv.nvmlGpmQueryDeviceSupport(self.handles[i]).isSupportedDevice)
            return ok, "" if ok else "GPM is not supported on this GPU (needs Hopper or newer)"
        except (self.nv.NVMLError, AttributeError) as e:
            return False, f"GPM query failed: {e}"

    def gpm_sample(self, i: int):
        s = self.nv.nvmlGpmSampleAlloc()
        self.nv.nvmlGpmSampleGet(self.handles[i], s)
        return s

    def gpm_metrics(self, s1, s2) -> dict:
        nv = self.nv
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(GPM_METRICS)
        req.sample1, req.sample2 = s1, s2
        for k, mid in enumerate(GPM_METRICS.values()):
            req.metrics[k].metricId = mid
        nv.nvmlGpmMetricsGet(req)
        return {
            name: (req.metrics[k].value if req.metrics[k].nvmlReturn == 0 else math.nan)
            for k, name in enumerate(GPM_METRICS)
        }

    def gpm_free(self, s) -> None:
        self.nv.nvmlGpmSampleFree(s)


class ReplayBackend:
    """Replays recorded rows (the sampler's own output): for tests and for machines without a GPU."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        self.gpus = sorted({r["gpu"] for r in rows})
        self._at = {g: 0 for g in self.gpus}
        self._last = {g: next(r for r in rows if r["gpu"] == g) for g in self.gpus}

    def device_count(self) -> int:
        return len(self.gpus)

    def _next(self, i):
        gpu = self.gpus[i]
        mine = [r for r in self.rows if r["gpu"] == gpu]
        r = mine[self._at[gpu] % len(mine)]
        self._at[gpu] += 1
        self._last[gpu] = r
        return r

    def read(self, i, skip):
        r = self._next(i)
        return {k: r[k] for k in COLUMNS[2:9] if k in r}, {}

    def gpm_supported(self, i):
        return True, ""

    def gpm_sample(self, i):
        return self._last[self.gpus[i]]  # the row just read for this GPU carries its GPM values

    def gpm_metrics(self, s1, s2):
        return {k: s2.get(k, math.nan) for k in GPM_METRICS}

    def gpm_free(self, s):
        pass


class NvmlSampler:
    """Samples every GPU present every ``period_s`` seconds in a background thread."""

    def __init__(self, period_s: float = 0.05, backend=None, gpm: bool = True):
        if not 0.005 <= period_s <= 60:
            raise ValueError(f"period_s must be between 0.005 and 60 s, got {period_s}")
        self.period_s = period_s
        self.backend = backend if backend is not None else NvmlBackend()
        self.gpm = gpm
        self.rows: list[dict] = []
        self.unsupported: dict[tuple[int, str], str] = {}
        self.marks: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = None
        self._t0 = None

    def mark(self, label: str) -> None:
        """Label the time from now on (e.g. the name of the workload starting)."""
        self.marks.append((time.perf_counter() - self._t0 if self._t0 else 0.0, label))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> None:
        n = self.backend.device_count()
        if n == 0:
            raise RuntimeError("NVML sees no GPU")
        self._gpm_ok = {}
        self._prev = {}
        for i in range(n):
            ok, why = self.backend.gpm_supported(i) if self.gpm else (False, "GPM disabled")
            self._gpm_ok[i] = ok
            if not ok:
                for m in GPM_METRICS:
                    self.unsupported[(i, m)] = why
            else:
                self._prev[i] = self.backend.gpm_sample(i)
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        for s in self._prev.values():
            self.backend.gpm_free(s)
        self._prev.clear()

    def _loop(self) -> None:
        nxt = time.perf_counter()
        while not self._stop.is_set():
            self.sample_once()
            nxt += self.period_s
            self._stop.wait(max(0.0, nxt - time.perf_counter()))

    def sample_once(self) -> None:
        t = time.perf_counter() - (self._t0 or time.perf_counter())
        label = self.marks[-1][1] if self.marks else ""
        for i in range(self.backend.device_count()):
            skip = {f for (g, f) in self.unsupported if g == i}
            vals, bad = self.backend.read(i, skip)
            for f, why in bad.items():
                self.unsupported[(i, f)] = why
            row = {c: math.nan for c in COLUMNS}
            row.update(vals)
            row.update(t_s=t, gpu=i, phase=label)
            if self._gpm_ok.get(i):
                try:
                    cur = self.backend.gpm_sample(i)
                    m = self.backend.gpm_metrics(self._prev[i], cur)
                    if any(math.isnan(v) for v in m.values()):
                        # the driver's GPM sample had not advanced (it updates about every
                        # 100 ms): no reading this time; keep the older sample as the base
                        self.backend.gpm_free(cur)
                    else:
                        row.update(m)
                        self.backend.gpm_free(self._prev[i])
                        self._prev[i] = cur
                except Exception as e:  # driver refused: record once, stop asking
                    self._gpm_ok[i] = False
                    for m in GPM_METRICS:
                        self.unsupported[(i, m)] = f"GPM sampling failed: {e}"
            self.rows.append(row)

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows, columns=[*COLUMNS, "phase"])

    def unsupported_messages(self) -> list[str]:
        return [f"GPU {g}: {m} unavailable ({why})" for (g, m), why in sorted(self.unsupported.items())]


def mask_stale_gpm(df):
    """GPM readings whose sample had not advanced are blanked.

    NVML's GPM samples update about every 100 ms: a pair of samples closer than that spans
    no time, so its rate (DRAM bandwidth) is NaN and its utilizations read 0. Samplers before
    this check recorded such rows; they must not count as idle.
    """
    df = df.copy()
    stale = df["gpm_dram_bw_util"].isna()
    df.loc[stale, list(GPM_METRICS)] = math.nan
    return df


def summarize(df, by: str = "phase", skip_first: int = 2):
    """Mean of every metric per phase (first ``skip_first`` samples of each phase dropped;
    samples taken before the first ``mark`` carry no phase and are left out; stale GPM
    readings are blanked first, see ``mask_stale_gpm``)."""
    import pandas as pd

    parts = []
    df = mask_stale_gpm(df)
    for key, g in df[df[by].astype(bool)].groupby([by, "gpu"], sort=False):
        g = g.iloc[skip_first:] if len(g) > skip_first else g
        row = g[COLUMNS[2:]].mean(numeric_only=True).to_dict()
        row.update({by: key[0], "gpu": key[1], "samples": len(g)})
        parts.append(row)
    out = pd.DataFrame(parts)
    if "power_w" in out and "power_limit_w" in out:
        out["power_pct_limit"] = 100 * out["power_w"] / out["power_limit_w"]
    return out


def clocked(fn, gpu: int = 0, period_s: float = 0.01, backend=None):
    """``fn()``, and the medians of GPU ``gpu``'s SM clock (MHz) and power (W) that NVML read while
    it ran: ``(result, {"sm_clock_mhz": ..., "power_w": ...})``, or ``(result, None)`` where NVML
    cannot be read (no nvidia-ml-py, no GPU). A timing's clock says whether a slow run was a
    slower clock."""
    import statistics

    try:
        sampler = NvmlSampler(period_s=period_s, backend=backend, gpm=False)
        sampler.start()
    except Exception:  # no nvidia-ml-py, no driver, no GPU: the result without its clock
        return fn(), None
    try:
        result = fn()
    finally:
        sampler.stop()
    seen = {}
    for key in ("sm_clock_mhz", "power_w"):
        vals = [r[key] for r in sampler.rows if r["gpu"] == gpu and not math.isnan(r[key])]
        seen[key] = statistics.median(vals) if vals else math.nan
    return result, seen
