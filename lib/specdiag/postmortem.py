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
* The native kernel is bandwidth-limited, so its H200 time is carried over by the ratio of the
  H200's copy bandwidth (measured in the recording's run) to the deployment GPU's (an assumed
  figure, a parameter of the notebook).
* A step commits ``commit`` tokens: 1 on free prose, 7-8 on predictable text (notebook 01).
"""

from __future__ import annotations

import pandas as pd

from .analysis import INCIDENT
from .cost import LAYERS

__all__ = ["split_steps", "fixed_steps"]


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


def fixed_steps(
    split: pd.DataFrame,
    native_ms_per_layer: dict,
    h200_copy_tb_s: float,
    deployment_copy_tb_s: float,
    per_step_overhead_ms: float = 0.0,
    commits=(1, 7, 8),
    layers: int = LAYERS,
):
    """The same steps with the native kernel: rest + native attention carried over by bandwidth
    (+ the adapter's per-step overhead, measured on the H200, carried over unchanged); tokens per
    second now and after at each commit length."""
    t = split.copy()
    scale = h200_copy_tb_s / deployment_copy_tb_s
    t["native_attention_ms"] = [native_ms_per_layer[c] * layers * scale + per_step_overhead_ms for c in t.context]
    t["fixed_step_ms"] = t.rest_ms + t.native_attention_ms
    t["speedup"] = t.step_ms / t.fixed_step_ms
    for n in commits:
        t[f"tok_s_now_commit{n}"] = n * 1e3 / t.step_ms
        t[f"tok_s_fixed_commit{n}"] = n * 1e3 / t.fixed_step_ms
    return t
