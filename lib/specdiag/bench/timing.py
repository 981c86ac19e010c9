"""Timing: ceilings measured in the same process, calls timed with L2-missing rotated inputs, the
context sweep of notebooks 03 and 05, and split-count tuning.

CUDA events through ``triton.testing.do_bench`` (median, L2 flushed before each call), inputs
rotated over page sets whose total exceeds twice the L2.
"""

from __future__ import annotations

import math
import time

import torch

from ..attention.inputs import KV_BYTES_PER_TOKEN, MLA_HEAD_DIM, make_verify_inputs
from ..attention.registry import KERNELS
from ..cost import SOFTMAX_SCALE, attention_cost, rates

__all__ = [
    "SWEEP_CONTEXTS",
    "SWEEP_HEADS",
    "SWEEP_TREES",
    "SWEEP_IMPLS",
    "measure_ceilings",
    "Rotation",
    "time_rotating",
    "context_sweep",
    "portable_sweep",
    "tune",
]

SWEEP_CONTEXTS = (1024, 4096, 16384, 32768, 65536, 131072, 185000)
SWEEP_HEADS = (8, 64)
SWEEP_TREES = (9, 65, 257)
# sweep name -> (kernel, KV page size): every registry kernel at page size 64 and 1, "native_auto"
# what impl="auto" runs, the Triton baseline and the naive torch path (page size 1)
SWEEP_IMPLS = {
    **{k.label: (k.name, 64) for k in KERNELS.values()},
    **{f"{k.label}_ps1": (k.name, 1) for k in KERNELS.values()},
    "native_auto": ("auto", 64),
    "native_auto_ps1": ("auto", 1),
    "triton": (None, 1),
    "torch": (None, 1),
}


def do_bench(fn, rep_ms: float = 60.0) -> float:
    from triton.testing import do_bench as _do_bench

    return float(_do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


def measure_ceilings(copy_bytes: int = 2 << 30, gemm: int = 8192) -> dict:
    """Device-to-device copy bandwidth (read + write bytes) and bf16 GEMM rate on random data."""
    src = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    t_copy = do_bench(lambda: dst.copy_(src))
    x = torch.randn(gemm, gemm, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(gemm, gemm, device="cuda", dtype=torch.bfloat16)
    t_gemm = do_bench(lambda: x @ y)
    # the verify attention's own GEMM shape: QK^T of 576 rows x 65536 keys x 576
    qa = torch.randn(576, 576, device="cuda", dtype=torch.bfloat16)
    kb = torch.randn(65536, 576, device="cuda", dtype=torch.bfloat16)
    t_qk = do_bench(lambda: qa @ kb.T)
    return {
        "copy_bytes": copy_bytes,
        "copy_ms": t_copy,
        "copy_tb_s": 2 * copy_bytes / (t_copy * 1e-3) / 1e12,
        "gemm_n": gemm,
        "gemm_ms": t_gemm,
        "gemm_tflop_s": 2 * gemm**3 / (t_gemm * 1e-3) / 1e12,
        "qk_gemm_tflop_s": 2 * 576 * 65536 * 576 / (t_qk * 1e-3) / 1e12,
    }


class Rotation:
    """Page tables over disjoint page ranges of one pool, so consecutive calls miss in L2."""

    def __init__(
        self, prefix: int, page_size: int, nodes: int, heads: int, l2_bytes: int, seed: int = 0, max_sets: int = 16
    ):
        per_set = max(1, prefix) * KV_BYTES_PER_TOKEN
        self.n = max(1, min(max_sets, math.ceil(2 * l2_bytes / per_set)))
        pages = math.ceil(prefix / page_size)
        g = torch.Generator().manual_seed(seed)
        total = max(1, pages * self.n)
        self.pool = torch.empty(total, page_size, MLA_HEAD_DIM, dtype=torch.bfloat16, device="cuda").normal_()
        perm = torch.randperm(total, generator=g).to(torch.int32)
        self.page_tables = [
            perm[i * pages : (i + 1) * pages].view(1, -1).cuda()
            if pages
            else torch.zeros(1, 1, dtype=torch.int32, device="cuda")
            for i in range(self.n)
        ]
        x, _ = make_verify_inputs([0], nodes, heads, page_size=page_size, seed=seed, device="cuda")
        self.q, self.tree_kv, self.tree_mask = x["q"], x["tree_kv"], x["tree_mask"]
        self.prefix_lens = torch.tensor([prefix], dtype=torch.int32, device="cuda")

    def inputs(self, i: int) -> dict:
        return dict(
            q=self.q,
            kv_pool=self.pool,
            page_table=self.page_tables[i % self.n],
            prefix_lens=self.prefix_lens,
            tree_kv=self.tree_kv,
            tree_mask=self.tree_mask,
        )

    def native_ops(self, **options) -> list:
        """One ``NativeTreeVerify`` per input set."""
        from ..attention.native import NativeTreeVerify

        return [NativeTreeVerify(**self.inputs(i), scale=SOFTMAX_SCALE, check=False, **options) for i in range(self.n)]


def time_rotating(calls, rep_ms: float) -> float:
    """Median ms of ``calls`` taken in turn (each its own inputs)."""
    state = {"i": 0}

    def fn():
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    return do_bench(fn, rep_ms)


def context_sweep(
    contexts=SWEEP_CONTEXTS,
    heads=SWEEP_HEADS,
    trees=SWEEP_TREES,
    impls=("native_auto", "native_auto_ps1", "triton", "torch"),
    rep_ms: float = 60.0,
    naive_limit_bytes: float = 4e9,
    progress=print,
) -> list[dict]:
    """Time each implementation per (context, heads, tree); one row per measurement."""
    from ..attention.reference import tree_verify_attention_ref
    from ..attention.triton_extend import extend_attention_fwd, prepare_extend_inputs

    unknown = [i for i in impls if i not in SWEEP_IMPLS]
    if unknown:
        raise ValueError(f"unknown implementation(s) {unknown}; choose from {list(SWEEP_IMPLS)}")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for ctx in contexts:
        for h in heads:
            for t in trees:
                cost = attention_cost(ctx, t, h)
                for impl in impls:
                    kernel, ps = SWEEP_IMPLS[impl]
                    if impl == "torch" and t * h * (ctx + t) * 4 > naive_limit_bytes:
                        rows.append(
                            dict(
                                impl=impl,
                                context=ctx,
                                heads=h,
                                nodes=t,
                                ms=None,
                                skipped="score matrix too large for the naive path",
                                **cost,
                            )
                        )
                        continue
                    rot = Rotation(ctx, ps, t, h, l2, seed=ctx + h + t)
                    t0 = time.time()
                    extra = {}
                    if kernel is not None:
                        ops = rot.native_ops(impl=kernel)
                        calls = [op.run for op in ops]
                        extra = dict(
                            kernel=ops[0].impl, splits=ops[0].plan.splits, ctas=ops[0].plan.m_tiles * ops[0].plan.splits
                        )
                    elif impl == "triton":
                        preps = [prepare_extend_inputs(**rot.inputs(i)) for i in range(rot.n)]
                        calls = [(lambda p=p: extend_attention_fwd(p, SOFTMAX_SCALE)) for p in preps]
                        extra = dict(ctas=h * math.ceil(t / (16 if t <= 16 else 32)))
                    else:  # torch
                        calls = [
                            (
                                lambda i=i: tree_verify_attention_ref(
                                    **rot.inputs(i), scale=SOFTMAX_SCALE, dtype=torch.bfloat16
                                )
                            )
                            for i in range(min(rot.n, 4))
                        ]
                    ms = time_rotating(calls, rep_ms)
                    row = dict(
                        impl=impl,
                        context=ctx,
                        heads=h,
                        nodes=t,
                        page_size=ps,
                        ms=ms,
                        rotation_sets=rot.n,
                        **cost,
                        **extra,
                        **rates(cost, ms),
                    )
                    rows.append(row)
                    progress(
                        f"{impl:>16} ctx={ctx:>6} H={h:>3} T={t:>4}: {ms:9.3f} ms  {row['tb_s']:.2f} "
                        f"TB/s  {row['tflop_s']:.1f} TFLOP/s  ({time.time() - t0:.1f}s)"
                    )
    return rows


def portable_sweep(contexts, heads: int, nodes: int, rep_ms: float = 20.0) -> dict:
    """The kernel ``auto`` runs on sm_120 beside this GPU's own pick, page size 1: the sweep
    ``postmortem.portable_table`` reads (notebooks 05 and 06)."""
    from ..attention.registry import auto_kernel

    label = KERNELS[auto_kernel((12, 0), heads * nodes)].label + "_ps1"
    rows = context_sweep(
        contexts=tuple(contexts), heads=(heads,), trees=(nodes,), impls=(label, "native_auto_ps1"), rep_ms=rep_ms
    )
    return {"ceilings": measure_ceilings(), "rows": rows}


def tune(
    configs=((131072, 8, 9), (131072, 64, 65), (32768, 8, 257)), impl: str = "mma", rep_ms: float = 40.0, progress=print
) -> list[dict]:
    """One kernel at 1, 2 and 4 whole waves of split CTAs on a few shapes: the data
    ``plan.CTA_OVERHEAD_TILES`` is fitted to."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    spec = KERNELS[impl]
    rows = []
    for ctx, h, t in configs:
        rot = Rotation(ctx, 64, t, h, l2, seed=ctx + h)
        cost = attention_cost(ctx, t, h)
        for waves in (1, 2, 4):
            splits = max(1, math.ceil(waves * sms / math.ceil(t * h / spec.rows_per_cta)))
            ops = rot.native_ops(impl=impl, prefix_splits=splits)
            ms = time_rotating([op.run for op in ops], rep_ms)
            row = dict(
                impl=impl,
                context=ctx,
                heads=h,
                nodes=t,
                rows_per_cta=spec.rows_per_cta,
                waves=waves,
                splits=ops[0].plan.splits,
                ms=ms,
                **rates(cost, ms),
            )
            rows.append(row)
            progress(
                f"ctx={ctx} H={h} T={t} waves={waves} splits={row['splits']}: "
                f"{ms:.3f} ms {row['tb_s']:.2f} TB/s {row['tflop_s']:.1f} TFLOP/s"
            )
            del ops
        del rot
        torch.cuda.empty_cache()
    return rows
