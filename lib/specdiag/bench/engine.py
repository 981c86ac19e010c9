"""A decode step's attention as the engine would run it, on the engine's own tensors: the real
sglang kernel vs ours through ``specdiag.engine``, per step (the step's mask building and
metadata included) for 1 layer and for all layers, each layer its own KV buffer.

Paths: ``sglang`` (the engine builds its flat [T, prefix + T] mask, then the real kernel per
layer), ``native_mask`` (the same mask, read by the adapter), ``native_parents`` (the tree's
parent indices: no prefix-wide mask). Wall time per step (CPU launch costs included, as an eager
engine pays them), median of ``reps`` after one warm-up step.
"""

from __future__ import annotations

import statistics
import time

import torch

from .. import engine
from ..cost import LAYERS

__all__ = ["ENGINE_PATHS", "engine_step_times"]

ENGINE_PATHS = ("sglang", "native_mask", "native_parents")


def _step(path: str, bt: engine.EngineBatch, qs, buffers):
    meta = bt.step
    seq, tree = bt.seq_lens, engine.ancestor_mask_from_parents(bt.parents)

    def run():
        if path == "native_parents":
            op = engine.EngineVerify(*meta, parents=bt.parents, check=False)
        else:
            mask, indptr = engine.custom_mask_from_tree(seq, tree)  # the engine's per-step mask
            if path == "sglang":
                op = engine.SglangVerify(*meta, custom_mask=mask, mask_indptr=indptr)
            else:
                op = engine.EngineVerify(*meta, custom_mask=mask, mask_indptr=indptr, check=False)
        for q, kv in zip(qs, buffers):
            op.forward(q, kv)

    return run


def engine_step_times(
    prefix: int = 185000, heads: int = 8, nodes: int = 9, layers=(1, LAYERS), reps: int = 3, progress=print
) -> list[dict]:
    """Rows of path, layers, ms (median step), ms_per_layer."""
    bt = engine.make_engine_batch([prefix], nodes, heads, device="cuda", seed=prefix)
    most = max(layers)
    buffers = [bt.kv_buffer] + [torch.empty_like(bt.kv_buffer).normal_() for _ in range(most - 1)]
    qs = [bt.q] + [torch.empty_like(bt.q).normal_() for _ in range(most - 1)]
    rows = []
    for n in layers:
        for path in ENGINE_PATHS:
            run = _step(path, bt, qs[:n], buffers[:n])
            run()  # warm-up: compiles, loads, plans
            times = []
            for _ in range(reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                run()
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
            ms = statistics.median(times)
            rows.append(
                dict(
                    path=path,
                    context=prefix,
                    heads=heads,
                    nodes=nodes,
                    layers=n,
                    ms=ms,
                    ms_per_layer=ms / n,
                    reps=reps,
                    spread_ms=max(times) - min(times),
                )
            )
            progress(f"{path:>15} layers={n:>3}: {ms:9.3f} ms per step ({ms / n:.4f} ms per layer)")
    return rows


CHECK_BATCHES = ([4096], [32768], [131072], [185000], [185000, 0, 4097, 65536])


def engine_checks(batches=CHECK_BATCHES, heads: int = 8, nodes: int = 9, progress=print) -> list[dict]:
    """Ours through the adapter (from the mask and from parents) and the real kernel on the same
    engine tensors, each against the float64 reference of the adapter's mapping and each other."""
    from ..attention import relative_error, tree_verify_attention_ref

    rows = []
    for lens in batches:
        bt = engine.make_engine_batch(lens, nodes, heads, device="cuda", seed=sum(lens) + len(lens))
        meta = bt.step
        real = engine.sglang_verify(bt).float()
        by_mask = engine.EngineVerify(*meta, custom_mask=bt.custom_mask, mask_indptr=bt.mask_indptr).forward(
            bt.q, bt.kv_buffer
        )
        by_parents = engine.EngineVerify(*meta, parents=bt.parents).forward(bt.q, bt.kv_buffer)
        x = {k: v.cpu() for k, v in engine.to_verify_inputs(bt).items()}
        ref, _ = tree_verify_attention_ref(**x, scale=bt.sm_scale)
        ref = ref.reshape(real.shape)
        row = dict(
            prefix_lens=lens,
            heads=heads,
            nodes=nodes,
            sglang_vs_float64=relative_error(real, ref),
            native_mask_vs_float64=relative_error(by_mask, ref),
            native_parents_vs_float64=relative_error(by_parents, ref),
            native_mask_vs_sglang=relative_error(by_mask, real),
        )
        rows.append(row)
        progress(row)
    return rows
