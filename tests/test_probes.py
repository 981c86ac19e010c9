"""Probes on CPU: ncu CSV parsing, the sampler's schema with a replay backend, recorded data."""

import math
import time

import pandas as pd
import pytest

from specdiag import data
from specdiag.probes import ncu, nvml

NCU_OUT = """==PROF== Connected to process 4242 (/usr/bin/python3.12)
some program output
==PROF== Profiling "tree_verify_partial_rg4": 0%....50%....100% - 9 passes
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","dram__throughput.avg.pct_of_peak_sustained_elapsed","gr__cycles_elapsed.max","sm__pipe_tensor_cycles_active.avg","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","","","","%","cycle","cycle","%"
"0","4242","python3.12","127.0.0.1","tree_verify_partial_rg4","1","7","(256, 1, 1)","(2, 67, 1)","0","9.0","14.25","1,234,000","456,580.5","12.48"
"1","4242","python3.12","127.0.0.1","tree_verify_merge","1","7","(128, 1, 1)","(72, 1, 1)","0","9.0","0.5","10,000","0","3"
"""


def test_parse_ncu_csv():
    df = ncu.parse_ncu_csv(NCU_OUT)
    assert list(df["Kernel Name"]) == ["tree_verify_partial_rg4", "tree_verify_merge"]
    assert df["gr__cycles_elapsed.max"].tolist() == [1234000.0, 10000.0]
    assert df.attrs["units"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == "%"
    assert df["Grid Size"].iloc[0] == "(2, 67, 1)"  # id columns stay text
    f = ncu.add_fractions(df)
    assert f["tensor_pipe_frac"].iloc[0] == pytest.approx(456580.5 / 1234000)
    assert f["tensor_pipe_frac"].iloc[1] == 0
    assert f.attrs["tensor_metric"] == "sm__pipe_tensor_cycles_active.avg"


def test_parse_ncu_reports_errors():
    with pytest.raises(ValueError, match="Failed to find metric"):
        ncu.parse_ncu_csv("==ERROR== Failed to find metric sm__bogus\n")


def test_ncu_command_leaves_clocks_alone():
    cmd = ncu.ncu_command(["-m", "x"], kernel_regex="tree_verify", ncu="ncu", python="py")
    assert cmd[:3] == ["ncu", "--clock-control", "none"]
    assert "regex:tree_verify" in cmd and cmd[-3:] == ["py", "-m", "x"]
    assert ",".join(ncu.DEFAULT_METRICS) in cmd


def test_pick_tensor_metric():
    assert (
        ncu.pick_tensor_metric({"sm__pipe_tensor_op_hmma_cycles_active", "x"})
        == "sm__pipe_tensor_op_hmma_cycles_active.avg"
    )
    with pytest.raises(RuntimeError):
        ncu.pick_tensor_metric({"x"})


ROW = dict(
    gpu=0,
    util_gpu_pct=99.8,
    util_mem_pct=1.2,
    power_w=154.0,
    power_avg_w=150.0,
    power_limit_w=700.0,
    sm_clock_mhz=1980.0,
    mem_clock_mhz=3201.0,
    gpm_sm_util=6.0,
    gpm_sm_occupancy=2.5,
    gpm_any_tensor_util=0.8,
    gpm_dram_bw_util=1.2,
)


def test_sampler_schema_and_phases():
    s = nvml.NvmlSampler(
        period_s=0.01, backend=nvml.ReplayBackend([ROW, dict(ROW, gpu=1, util_gpu_pct=0.0, gpm_sm_util=3.0)])
    )
    with s:
        s.mark("work")
        time.sleep(0.08)
    df = s.frame()
    assert list(df.columns) == nvml.COLUMNS + ["phase"]
    assert set(df.gpu) == {0, 1}
    assert (df.t_s.diff().dropna() >= 0).all()
    summ = nvml.summarize(df)
    w0 = summ[(summ.phase == "work") & (summ.gpu == 0)].iloc[0]
    assert w0.util_gpu_pct == pytest.approx(99.8)
    assert w0.power_pct_limit == pytest.approx(22.0)
    # each GPU's GPM values come from its own rows
    assert set(df[df.gpu == 1].gpm_sm_util.dropna()) == {3.0}


def test_clocked_gives_the_result_and_the_clock_it_ran_at():
    """nvml.clocked (time_shapes.py's timings): fn's result with the median SM clock and power of
    the GPU asked for while it ran; without NVML the result alone."""
    rows = [dict(ROW, sm_clock_mhz=mhz, power_w=w) for mhz, w in ((1980.0, 600.0), (1755.0, 700.0), (1980.0, 650.0))]
    backend = nvml.ReplayBackend(rows + [dict(ROW, gpu=1, sm_clock_mhz=1000.0)])

    def work():
        time.sleep(0.06)
        return 42

    result, seen = nvml.clocked(work, gpu=0, period_s=0.005, backend=backend)
    assert result == 42 and seen["sm_clock_mhz"] in (1980.0, 1755.0) and 600.0 <= seen["power_w"] <= 700.0

    class NoGpu(nvml.ReplayBackend):
        def device_count(self):
            return 0

    assert nvml.clocked(lambda: 7, backend=NoGpu([ROW])) == (7, None)


class NoPowerBackend(nvml.ReplayBackend):
    def read(self, i, skip):
        vals, _ = super().read(i, skip)
        vals.pop("power_w"), vals.pop("power_avg_w")
        return vals, ({} if "power" in skip else {"power": "Not Supported"})

    def gpm_supported(self, i):
        return False, "GPM is not supported on this GPU (needs Hopper or newer)"


def test_unsupported_metrics_are_nan_and_explained():
    s = nvml.NvmlSampler(period_s=0.01, backend=NoPowerBackend([ROW]))
    with s:
        time.sleep(0.05)
    df = s.frame()
    assert df.power_w.isna().all() and df.gpm_sm_util.isna().all()
    assert df.util_gpu_pct.notna().all()
    msgs = s.unsupported_messages()
    assert any("power" in m and "Not Supported" in m for m in msgs)
    assert any("gpm_sm_util" in m and "Hopper" in m for m in msgs)


class StaleGpmBackend(nvml.ReplayBackend):
    """Every other GPM reading has not advanced: utilizations 0, the rate NaN."""

    def __init__(self, rows):
        super().__init__(rows)
        self.calls = 0

    def gpm_metrics(self, s1, s2):
        self.calls += 1
        if self.calls % 2 == 0:
            return {
                "gpm_sm_util": 0.0,
                "gpm_sm_occupancy": 0.0,
                "gpm_any_tensor_util": 0.0,
                "gpm_dram_bw_util": math.nan,
            }
        return super().gpm_metrics(s1, s2)


def test_stale_gpm_readings_are_blank_not_zero():
    s = nvml.NvmlSampler(period_s=0.01, backend=StaleGpmBackend([ROW]))
    with s:
        s.mark("work")
        time.sleep(0.1)
    df = s.frame()
    assert df.gpm_sm_util.isna().any() and not (df.gpm_sm_util == 0).any()
    # recorded data from a sampler without the check: zeros with a NaN rate are masked
    old = pd.DataFrame(
        [
            dict(ROW, t_s=0.0, phase="w"),
            dict(
                ROW,
                t_s=0.05,
                phase="w",
                gpm_sm_util=0.0,
                gpm_sm_occupancy=0.0,
                gpm_any_tensor_util=0.0,
                gpm_dram_bw_util=math.nan,
            ),
        ]
    )
    summ = nvml.summarize(old, skip_first=0)
    assert summ.gpm_sm_util.iloc[0] == pytest.approx(6.0)


def test_sampler_rejects_bad_period():
    with pytest.raises(ValueError):
        nvml.NvmlSampler(period_s=0, backend=nvml.ReplayBackend([ROW]))


def test_recorded_probe_data_parses_and_tells_the_story():
    doc = data.load_json("probes_h200.json")
    assert doc["machine"]["gpu"].startswith("NVIDIA") and doc["machine"].get("driver")
    samples = pd.DataFrame(doc["samples"])
    assert list(samples.columns) == nvml.COLUMNS + ["phase"]
    summ = nvml.summarize(samples).set_index("phase")
    base, gemm = summ.loc["baseline"], summ.loc["gemm"]
    assert (
        base.util_gpu_pct > 90 and base.gpm_sm_util < 10 and base.gpm_dram_bw_util < 2
    )  # busy by duty cycle, idle by GPM
    assert gemm.gpm_any_tensor_util > 10 * base.gpm_any_tensor_util
    # the raw ncu output stored with the data parses to the same rows
    for name, raw in doc["ncu_raw"].items():
        df = ncu.slim(ncu.add_fractions(ncu.parse_ncu_csv(raw)))
        rec = doc["ncu"][name]
        assert len(df) == len(rec)
        assert df["tensor_pipe_frac"].tolist() == pytest.approx([r["tensor_pipe_frac"] for r in rec])
    assert doc["ncu"]["baseline"][0]["Grid Size"] == "(1, 8, 1)"  # 8 CTAs on 132 SMs
