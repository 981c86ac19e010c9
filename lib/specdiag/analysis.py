"""Arithmetic behind notebooks 03 and 05: floors, gaps, per-step times."""

from __future__ import annotations

from .attention.inputs import KV_BYTES_PER_TOKEN
from . import bench
from .bench import LAYERS

__all__ = ["kv_bytes_per_step", "floor_ms", "bandwidth_gap", "add_roofline", "speedup_table", "INCIDENT"]

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


def kv_bytes_per_step(context: int, layers: int = LAYERS) -> int:
    """Latent KV bytes one decode step must read: every layer's prefix once."""
    if context < 0 or layers < 1:
        raise ValueError("context must be >= 0 and layers >= 1")
    return context * KV_BYTES_PER_TOKEN * layers


def floor_ms(bytes_: float, flops: float, copy_tb_s: float, gemm_tflop_s: float) -> float:
    """max(bytes / bandwidth, FLOPs / matrix rate) in milliseconds."""
    if copy_tb_s <= 0 or gemm_tflop_s <= 0:
        raise ValueError("ceilings must be positive")
    return max(bytes_ / (copy_tb_s * 1e12), flops / (gemm_tflop_s * 1e12)) * 1e3


def bandwidth_gap(context: int, observed_step_ms: float, copy_tb_s: float, layers: int = LAYERS) -> dict:
    """How far an observed step time is above the time to stream the step's KV once."""
    b = kv_bytes_per_step(context, layers)
    t = b / (copy_tb_s * 1e12) * 1e3
    return {"context": context, "kv_gb": b / 1e9, "floor_ms": t, "observed_ms": observed_step_ms, "gap": observed_step_ms / t}


def add_roofline(df, ceilings: dict, layers: int = LAYERS):
    """Columns: floor_ms (per layer), x_floor (measured / floor), step_ms (x layers)."""
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
    """One line: the range of base / new time at >= ``min_context`` and over all contexts
    (``speedup_table`` rows), or a note that one of the two was not measured."""
    t = speedup_table(df, base=base, new=new)
    if t.empty:
        return f"{what}: not measured here ({base} or {new} missing)"
    long = t[t.context >= min_context]
    part = f"{long.speedup.min():.2f}x to {long.speedup.max():.2f}x at >= {min_context // 1024}k" if len(long) else f"no contexts >= {min_context // 1024}k"
    return f"{what}: {part} (all contexts: {t.speedup.min():.2f}x to {t.speedup.max():.2f}x)"


def kernel_step(df, base: str, new: str, what: str, context: int):
    """One kernel version against the one before it, as notebook 05 shows each step: lines with
    the range of base / new time (``speedup_range``) and, where ``new + "_ps1"`` was measured,
    new's page_size=1 / page_size=64 time; and the ``speedup_table`` rows at ``context``
    (None, with a line saying so, when ``new`` was not measured)."""
    if new not in set(df.impl):
        return [f"no {new} measurements here (not an sm_90 GPU, or an older recording)"], None
    lines = [speedup_range(df, base, new, what)]
    if f"{new}_ps1" in set(df.impl):
        lines.append(speedup_range(df, f"{new}_ps1", new, f"{new}, page_size=1 / page_size=64 time"))
    t = speedup_table(df, base=base, new=new)
    return lines, t[t.context == context].round(3)


def lookahead_labels(frame, column: str = "impl"):
    """``frame[column]`` with ``_la1`` / ``_la2`` appended where a row has a ``lookahead`` (the
    wgmma_ws kernel's entry points), so each entry point gets a label of its own."""
    out = frame[column].astype(str).copy()
    if "lookahead" in frame:
        out[:] = [bench.entry_label(k, la) for k, la in zip(out, frame.lookahead)]
    return out


# sweep implementation of each Hopper kernel "auto" may pick (page size 64)
AUTO_SWEEP_IMPLS = {"wgmma": "native_wgmma", "wgmma_ws": "native_ws", "wgmma_ws64": "native_ws64", "wgmma_seesaw": "native_seesaw", "wgmma_t": "native_t"}


def with_auto(df, name: str = "native_auto"):
    """``df`` plus rows ``name``: per (context, heads, nodes), the measurement of the kernel
    ``impl="auto"`` picks on sm_90 (``native.hopper_auto``: by query rows and prefix), where that
    kernel was measured; what the library's default delivers at each shape."""
    import pandas as pd

    from .attention.native import hopper_auto

    picks = []
    for (ctx, h, t), g in df.groupby(["context", "heads", "nodes"]):
        impl = AUTO_SWEEP_IMPLS[hopper_auto(h * t, ctx)]
        row = g[g.impl == impl]
        if len(row):
            picks.append(row.iloc[0].copy())
            picks[-1]["impl"] = name
            picks[-1]["auto_kernel"] = impl
    return pd.concat([df, pd.DataFrame(picks)], ignore_index=True) if picks else df
