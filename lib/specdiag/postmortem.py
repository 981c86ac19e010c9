"""The postmortem's bottom line (notebook 06): the deployment's reported step times split into the
baseline attention and the rest, and the same step with the native kernel, as an estimate.

The carry-over from the H200 to the deployment's GPUs, and what it assumes:

* The baseline kernel's time is linear in context on the H200 (notebook 03). Reading 1: on the
  deployment's GPUs it is ``k`` times the H200's, one factor ``k`` for every context. The rest of
  the step must be >= 0 at every reported context, so ``k <= min(step / H200 attention)``;
  ``split_steps`` takes that largest ``k`` (the most of each step attention can be), which makes
  the rest the least it can be: a lower bound. Reading 2 (``k`` given): the baseline grows faster
  than linearly there (e.g. once a layer's KV outgrows that GPU's cache), so that at the longest
  context attention is the whole step.
* The rest is at least ``rest_floor_ms`` (an assumption; 0 when none is made), so every step
  time here is a lower bound and every tokens-per-second figure an upper bound.
* The fix on the deployment's GPUs is the kernel ``auto`` runs there (on sm_120 the portable
  mma.sync variant, ``registry.auto_kernel``), timed on the H200 (``deployment_layer_ms``). On the
  H200 that kernel reads far less than the copy bandwidth: its time is set by the SMs' mma.sync
  issue, so it is carried over by the ratio of SM counts times an assumed per-SM rate (1: the same
  per-SM throughput), and never below the deployment's bandwidth floor (the KV bytes over its
  copy bandwidth: an assumed figure, a parameter of the notebook).
* A step commits ``commit`` tokens: 1 on free prose, 7-8 on predictable text (notebook 01).
"""

from __future__ import annotations

import pandas as pd

from .analysis import INCIDENT
from .cost import LAYERS

__all__ = ["split_steps", "deployment_layer_ms", "portable_table", "fixed_steps"]


def split_steps(
    baseline_ms_per_layer: dict,
    incident_steps: dict = INCIDENT["step_ms"],
    layers: int = LAYERS,
    k: float | None = None,
    rest_floor_ms: float = 0.0,
):
    """Per reported context: the step, the H200 baseline attention (x layers), the deployment's
    attention (k x H200, capped so that the rest is at least ``rest_floor_ms``) and the rest.
    ``k``: the carry-over factor; by default the largest that leaves no rest below the floor at
    any context (reading 1). Returns (table, k)."""
    ctx = [c for c in sorted(incident_steps) if c in baseline_ms_per_layer]
    if not ctx:
        raise ValueError(f"no baseline measurement at the reported contexts {sorted(incident_steps)}")
    t = pd.DataFrame(
        dict(
            context=ctx,
            step_ms=[incident_steps[c] for c in ctx],
            h200_attention_ms=[baseline_ms_per_layer[c] * layers for c in ctx],
        )
    )
    if k is None:
        k = float(((t.step_ms - rest_floor_ms) / t.h200_attention_ms).min())
    if k <= 0:
        raise ValueError(f"rest_floor_ms={rest_floor_ms} leaves no time for attention in some reported step")
    t["attention_ms"] = (k * t.h200_attention_ms).clip(upper=t.step_ms - rest_floor_ms)
    t["rest_ms"] = t.step_ms - t.attention_ms
    t["attention_share"] = t.attention_ms / t.step_ms
    return t, k


def deployment_layer_ms(
    h200_ms: float,
    kv_bytes: float,
    h200_sms: int,
    deployment_sms: int,
    deployment_copy_tb_s: float,
    sm_rate: float = 1.0,
) -> float:
    """One layer of an SM-bound kernel on the deployment's GPUs, from its H200 time: scaled by the
    SM counts and ``sm_rate`` (the deployment SM's throughput over an H200 SM's, assumed), and at
    least ``kv_bytes`` over the deployment's copy bandwidth."""
    if min(h200_ms, h200_sms, deployment_sms, deployment_copy_tb_s, sm_rate) <= 0:
        raise ValueError("times, SM counts, bandwidth and rate must be > 0")
    return max(h200_ms * h200_sms / (deployment_sms * sm_rate), kv_bytes / (deployment_copy_tb_s * 1e12) * 1e3)


def portable_table(
    doc: dict, heads: int, nodes: int, deployment_sms: int, deployment_copy_tb_s: float, sm_rate: float = 1.0
) -> pd.DataFrame:
    """The kernel ``auto`` runs on sm_120, from a sweep recorded on an H200 beside the Hopper kernel
    (``bench.timing.portable_sweep``): per context its H200 ms per layer, ``x_hopper`` (over the
    Hopper kernel's, same run) and ``deployment_est`` (``deployment_layer_ms``)."""
    from .attention.registry import KERNELS, auto_kernel
    from .cost import attention_cost
    from .data import sweep_frame

    name = KERNELS[auto_kernel((12, 0), heads * nodes)]
    rows = sweep_frame(doc)
    rows = rows[(rows.heads == heads) & (rows.nodes == nodes)]
    t = rows.pivot_table(index="context", columns="impl", values="ms")
    t = t.rename(columns={name.label + "_ps1": name.name, "native_auto_ps1": "hopper_auto"})[[name.name, "hopper_auto"]]
    t["x_hopper"] = t[name.name] / t["hopper_auto"]
    sms = doc["machine"]["sm_count"]
    t["deployment_est"] = [
        deployment_layer_ms(
            ms, attention_cost(int(c), nodes, heads)["kv_bytes"], sms, deployment_sms, deployment_copy_tb_s, sm_rate
        )
        for c, ms in t[name.name].items()
    ]
    return t


def fixed_steps(
    split: pd.DataFrame,
    fix_ms_per_layer: dict,
    per_step_overhead_ms: float = 0.0,
    commits=(1, 7, 8),
    layers: int = LAYERS,
):
    """The same steps with the fix: rest + ``fix_ms_per_layer`` (on the deployment's GPUs, per
    context: ``deployment_layer_ms``) x layers (+ the adapter's per-step overhead); tokens per
    second now and after at each commit length."""
    t = split.copy()
    missing = [c for c in t.context if c not in fix_ms_per_layer]
    if missing:
        raise ValueError(f"no time for the fix at contexts {missing}")
    t["native_attention_ms"] = [fix_ms_per_layer[c] * layers + per_step_overhead_ms for c in t.context]
    t["fixed_step_ms"] = t.rest_ms + t.native_attention_ms
    t["speedup"] = t.step_ms / t.fixed_step_ms
    for n in commits:
        t[f"tok_s_now_commit{n}"] = n * 1e3 / t.step_ms
        t[f"tok_s_fixed_commit{n}"] = n * 1e3 / t.fixed_step_ms
    return t
