"""The cost model: how many bytes and FLOPs a verify step must move, and the floor they set."""

from __future__ import annotations

import math

from .attention.inputs import KV_BYTES_PER_TOKEN, MLA_HEAD_DIM, MLA_V_DIM

__all__ = ["LAYERS", "SOFTMAX_SCALE", "attention_cost", "kv_bytes_per_step", "floor_ms", "bandwidth_gap", "rates"]

LAYERS = 61  # Kimi-K2
SOFTMAX_SCALE = 1.0 / math.sqrt(192.0)  # MLA: qk_nope 128 + qk_rope 64


def attention_cost(prefix: int, nodes: int, heads: int, batch: int = 1) -> dict:
    """Minimum bytes and FLOPs of one layer's verify attention.

    Bytes: each prefix/tree latent read once, q read once, out written once (bf16).
    FLOPs: 2 * rows * keys * (576 + 512), keys = prefix + nodes (the tree block counted dense).
    """
    rows = nodes * heads * batch
    keys = prefix + nodes
    bytes_ = batch * (prefix + nodes) * KV_BYTES_PER_TOKEN + rows * MLA_HEAD_DIM * 2 + rows * MLA_V_DIM * 2
    flops = 2.0 * rows * keys * (MLA_HEAD_DIM + MLA_V_DIM)
    return {"bytes": bytes_, "flops": flops, "kv_bytes": batch * prefix * KV_BYTES_PER_TOKEN}


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
    return {
        "context": context,
        "kv_gb": b / 1e9,
        "floor_ms": t,
        "observed_ms": observed_step_ms,
        "gap": observed_step_ms / t,
    }


def rates(cost: dict, ms: float) -> dict:
    """Achieved TB/s and TFLOP/s of one timing against an ``attention_cost``."""
    return {"tb_s": cost["bytes"] / (ms * 1e-3) / 1e12, "tflop_s": cost["flops"] / (ms * 1e-3) / 1e12}
