"""Benchmarks: ceilings, correctness on the GPU, and the context sweep of notebooks 03 and 05.

Run on a GPU machine::

    python -m specdiag.bench check  --out data/native_check.json
    python -m specdiag.bench sweep  --out data/context_sweep_h200.json [--quick]

Every result file carries ``machine_metadata()`` so a notebook can say where numbers came from.
Timing follows the project's method: CUDA events through ``triton.testing.do_bench`` (median,
L2 flushed before each call), inputs rotated over page sets whose total exceeds twice the L2,
ceilings (copy bandwidth, bf16 GEMM rate) measured in the same process.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from .attention.inputs import KV_BYTES_PER_TOKEN, MLA_HEAD_DIM, MLA_V_DIM, make_verify_inputs, relative_error
from .attention.native import HOPPER_IMPLS, IMPLS

__all__ = [
    "attention_cost",
    "machine_metadata",
    "measure_ceilings",
    "check_native",
    "poison_unused_slots",
    "context_sweep",
    "SWEEP_CONTEXTS",
    "SWEEP_HEADS",
    "SWEEP_TREES",
    "SWEEP_IMPLS",
    "LAYERS",
]

SWEEP_CONTEXTS = (1024, 4096, 16384, 32768, 65536, 131072, 185000)
SWEEP_HEADS = (8, 64)
SWEEP_TREES = (9, 65, 257)
LAYERS = 61  # Kimi-K2
# sweep implementation -> (native kernel or None, KV page size); "wgmma_tma" is the wgmma
# kernel with its contiguous tiles loaded by TMA instead of cp.async, to measure what TMA buys;
# "native_ws" the warp-specialised wgmma kernel with its default lookahead, "native_ws_la1" /
# "native_ws_la2" with Q K^T one / two tiles ahead of P V, "native_ws64" the warp-specialised
# kernel on 64-key tiles, "native_seesaw" two math warpgroups taking turns on 64-key tiles,
# "native_t" the transposed kernel (query rows in the wgmma's N)
SWEEP_IMPLS = {
    "native": ("mma", 64), "native_ps1": ("mma", 1), "native_wgmma": ("wgmma", 64), "native_wgmma_ps1": ("wgmma", 1),
    "native_wgmma_tma": ("wgmma_tma", 64), "native_ws": ("wgmma_ws", 64), "native_ws_ps1": ("wgmma_ws", 1),
    "native_ws_la1": ("wgmma_ws_la1", 64), "native_ws_la2": ("wgmma_ws_la2", 64),
    "native_ws64": ("wgmma_ws64", 64), "native_ws64_ps1": ("wgmma_ws64", 1),
    "native_seesaw": ("wgmma_seesaw", 64), "native_seesaw_ps1": ("wgmma_seesaw", 1),
    "native_t": ("wgmma_t", 64), "native_t_ps1": ("wgmma_t", 1),
    "triton": (None, 1), "torch": (None, 1),
}


def _native_options(kernel: str) -> dict:
    """NativeTreeVerify keywords of a SWEEP_IMPLS kernel name."""
    if kernel == "wgmma_tma":
        return {"impl": "wgmma", "tma": True}
    if kernel.startswith("wgmma_ws_la"):
        return {"impl": "wgmma_ws", "lookahead": int(kernel[-1])}
    return {"impl": kernel}


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


def machine_metadata() -> dict:
    meta = {
        "recorded_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": platform.node(),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    try:
        import pycuda

        meta["pycuda"] = getattr(pycuda, "VERSION_TEXT", None)
    except ImportError:
        meta["pycuda"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta.update(
            gpu=p.name,
            sm_count=p.multi_processor_count,
            l2_bytes=getattr(p, "L2_cache_size", None),
            memory_bytes=p.total_memory,
            capability=f"{p.major}.{p.minor}",
            cuda_runtime=torch.version.cuda,
        )
        try:
            import pynvml

            pynvml.nvmlInit()
            meta["driver"] = pynvml.nvmlSystemGetDriverVersion()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            meta["power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
        except Exception as e:  # pragma: no cover - machine dependent
            meta["driver"] = f"unavailable ({type(e).__name__})"
    return meta


def _do_bench(fn, rep_ms: float = 60.0) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


def _copy_ms(nbytes: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    return _do_bench(lambda: dst.copy_(src))


def measure_ceilings(copy_bytes: int = 2 << 30, gemm: int = 8192) -> dict:
    """Device-to-device copy bandwidth (read + write bytes) and bf16 GEMM rate on random data."""
    t_copy = _copy_ms(copy_bytes)
    x = torch.randn(gemm, gemm, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(gemm, gemm, device="cuda", dtype=torch.bfloat16)
    t_gemm = _do_bench(lambda: x @ y)
    # the verify attention's own GEMM shape: QK^T of 576 rows x 65536 keys x 576
    qa = torch.randn(576, 576, device="cuda", dtype=torch.bfloat16)
    kb = torch.randn(65536, 576, device="cuda", dtype=torch.bfloat16)
    t_qk = _do_bench(lambda: qa @ kb.T)
    return {
        "copy_bytes": copy_bytes,
        "copy_ms": t_copy,
        "copy_tb_s": 2 * copy_bytes / (t_copy * 1e-3) / 1e12,
        "gemm_n": gemm,
        "gemm_ms": t_gemm,
        "gemm_tflop_s": 2 * gemm**3 / (t_gemm * 1e-3) / 1e12,
        "qk_gemm_tflop_s": 2 * 576 * 65536 * 576 / (t_qk * 1e-3) / 1e12,
    }


def poison_unused_slots(kv_pool: torch.Tensor, page_table: torch.Tensor, prefix_lens: torch.Tensor) -> int:
    """Fill every pool slot that no request's prefix uses with NaN (in place); returns how many.

    A kernel that reads a whole tile past the end of a prefix (TMA does) must not let those
    values reach the output: masked scores give P = 0, but 0 * NaN is NaN."""
    ps = kv_pool.shape[1]
    used = torch.zeros(kv_pool.shape[0] * ps, dtype=torch.bool)
    pt, lens = page_table.cpu().long(), prefix_lens.cpu().long()
    for i in range(pt.shape[0]):
        tok = torch.arange(int(lens[i]))
        used[pt[i, tok // ps] * ps + tok % ps] = True
    unused = (~used).view(kv_pool.shape[0], ps).to(kv_pool.device)
    kv_pool[unused] = float("nan")
    return int(unused.sum())


def check_native(cases=None, seed: int = 1234, impl: str = "mma", tma: bool = False, lookahead: int | None = None) -> list[dict]:
    """Native kernel vs float64 reference on fresh random inputs, outputs and every unused pool
    slot poisoned with NaN first (``poison_unused_slots``).

    With ``impl="wgmma"`` or ``"wgmma_ws"`` (always 64 rows per CTA) the cases that pin ``rg``
    to 1 or 2 are left out; ``tma=True`` checks its TMA load path, ``lookahead`` picks the
    wgmma_ws kernel's entry point. Each result names the parts TMA loaded."""
    from .attention.native import NativeTreeVerify
    from .attention.reference import tree_verify_attention_ref

    if cases is None:
        cases = [
            # (prefix_lens, nodes, heads, page_size, tree_shape, rg)
            ([1000], 9, 8, 64, "random", None),
            ([0], 9, 8, 64, "chain", None),
            ([1], 1, 1, 1, "chain", None),
            ([4097, 33, 2000], 65, 8, 16, "random", None),
            ([3000], 257, 8, 1, "fan", None),
            ([5000], 65, 64, 128, "random", None),
            ([70000], 9, 8, 64, "random", None),
            ([777, 3001], 1024, 2, 64, "random", None),
            ([2500], 17, 8, 64, "random", 1),
            ([2500], 17, 8, 64, "random", 2),
            ([2500], 17, 8, 64, "random", 4),
            ([123], 3, 128, 1, "chain", None),
            ([0, 5000, 31], 33, 4, 64, "random", None),  # ragged, one request with no prefix
            ([64, 129, 1], 10, 8, 1, "random", None),  # 80 rows (two 40-row CTAs of wgmma_t), prefixes at 64-key tile edges
        ]
    results = []
    for i, (lens, nodes, heads, ps, shape, rg) in enumerate(cases):
        if impl in HOPPER_IMPLS and rg not in (None, 4):
            continue
        x, _ = make_verify_inputs(lens, nodes, heads, page_size=ps, tree_shape=shape, seed=seed + i, device="cuda", q_scale=1.0)
        poisoned = poison_unused_slots(x["kv_pool"], x["page_table"], x["prefix_lens"])
        op = NativeTreeVerify(**x, scale=SOFTMAX_SCALE, rg=rg, impl=impl, tma=tma, lookahead=lookahead)
        op.out.fill_(float("nan"))
        op.lse.fill_(float("nan"))
        op.o_part.fill_(float("nan"))
        out, lse = op.run()
        torch.cuda.synchronize()
        written = bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
        cpu = {k: v.cpu() for k, v in x.items()}
        ref_o, ref_l = tree_verify_attention_ref(**cpu, scale=SOFTMAX_SCALE)
        results.append(
            dict(
                impl=impl, prefix_lens=lens, nodes=nodes, heads=heads, page_size=ps, tree=shape, rg=op.plan.rg,
                splits=op.plan.splits, tma_parts=list(op.tma_parts), lookahead=op.lookahead, poisoned_slots=poisoned, all_written=written,
                rel_err_out=relative_error(out, ref_o), rel_err_lse=relative_error(lse, ref_l),
            )
        )
    return results


class _Rotation:
    """Page tables over disjoint page ranges of one pool, so consecutive calls miss in L2."""

    def __init__(self, prefix: int, page_size: int, nodes: int, heads: int, l2_bytes: int, seed: int = 0, max_sets: int = 16):
        per_set = max(1, prefix) * KV_BYTES_PER_TOKEN
        self.n = max(1, min(max_sets, math.ceil(2 * l2_bytes / per_set)))
        pages = math.ceil(prefix / page_size)
        g = torch.Generator().manual_seed(seed)
        total = max(1, pages * self.n)
        self.pool = torch.empty(total, page_size, MLA_HEAD_DIM, dtype=torch.bfloat16, device="cuda").normal_()
        perm = torch.randperm(total, generator=g).to(torch.int32)
        self.page_tables = [perm[i * pages : (i + 1) * pages].view(1, -1).cuda() if pages else torch.zeros(1, 1, dtype=torch.int32, device="cuda") for i in range(self.n)]
        x, _ = make_verify_inputs([0], nodes, heads, page_size=page_size, seed=seed, device="cuda")
        self.q, self.tree_kv, self.tree_mask = x["q"], x["tree_kv"], x["tree_mask"]
        self.prefix_lens = torch.tensor([prefix], dtype=torch.int32, device="cuda")

    def inputs(self, i: int) -> dict:
        return dict(q=self.q, kv_pool=self.pool, page_table=self.page_tables[i % self.n], prefix_lens=self.prefix_lens, tree_kv=self.tree_kv, tree_mask=self.tree_mask)


def _rates(cost: dict, ms: float) -> dict:
    """Achieved TB/s and TFLOP/s of one timing against an ``attention_cost``."""
    return {"tb_s": cost["bytes"] / (ms * 1e-3) / 1e12, "tflop_s": cost["flops"] / (ms * 1e-3) / 1e12}


def _time_rotating(calls, rep_ms: float) -> float:
    state = {"i": 0}

    def fn():
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    return _do_bench(fn, rep_ms)


def context_sweep(contexts=SWEEP_CONTEXTS, heads=SWEEP_HEADS, trees=SWEEP_TREES, impls=("native", "native_ps1", "triton", "torch"), rep_ms: float = 60.0, naive_limit_bytes: float = 4e9, progress=print) -> list[dict]:
    """Time each implementation per (context, heads, tree); returns one row per measurement."""
    from .attention.native import NativeTreeVerify
    from .attention.reference import tree_verify_attention_ref
    from .attention.triton_extend import extend_attention_fwd, prepare_extend_inputs

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
                        rows.append(dict(impl=impl, context=ctx, heads=h, nodes=t, ms=None, skipped="score matrix too large for the naive path", **cost))
                        continue
                    rot = _Rotation(ctx, ps, t, h, l2, seed=ctx + h + t)
                    t0 = time.time()
                    extra = {}
                    if kernel is not None:
                        ops = [NativeTreeVerify(**rot.inputs(i), scale=SOFTMAX_SCALE, check=False, **_native_options(kernel)) for i in range(rot.n)]
                        calls = [op.run for op in ops]
                        extra = dict(rg=ops[0].plan.rg, splits=ops[0].plan.splits, ctas=ops[0].plan.m_tiles * ops[0].plan.splits)
                    elif impl == "triton":
                        preps = [prepare_extend_inputs(**rot.inputs(i)) for i in range(rot.n)]
                        calls = [(lambda p=p: extend_attention_fwd(p, SOFTMAX_SCALE)) for p in preps]
                        extra = dict(ctas=h * math.ceil(t / (16 if t <= 16 else 32)))
                    else:  # torch
                        calls = [(lambda i=i: tree_verify_attention_ref(**rot.inputs(i), scale=SOFTMAX_SCALE, dtype=torch.bfloat16)) for i in range(min(rot.n, 4))]
                    ms = _time_rotating(calls, rep_ms)
                    row = dict(impl=impl, context=ctx, heads=h, nodes=t, page_size=ps, ms=ms, rotation_sets=rot.n, **cost, **extra, **_rates(cost, ms))
                    rows.append(row)
                    progress(f"{impl:>10} ctx={ctx:>6} H={h:>3} T={t:>4}: {ms:9.3f} ms  {row['tb_s']:.2f} TB/s  {row['tflop_s']:.1f} TFLOP/s  ({time.time() - t0:.1f}s)")
    return rows


def tune(configs=((131072, 8, 9), (131072, 64, 65), (32768, 8, 257)), rep_ms: float = 40.0, progress=print) -> list[dict]:
    """mma.sync kernel launch variants (rows per CTA, split count) on a few configurations."""
    from .attention.native import NativeTreeVerify

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for ctx, h, t in configs:
        rot = _Rotation(ctx, 64, t, h, l2, seed=ctx + h)
        cost = attention_cost(ctx, t, h)
        for rg in (1, 2, 4):
            for waves in (1, 2, 4):
                m_tiles = math.ceil(t * h / (16 * rg))
                splits = max(1, math.ceil(waves * sms / m_tiles))
                ops = [NativeTreeVerify(**rot.inputs(i), scale=SOFTMAX_SCALE, rg=rg, prefix_splits=splits, check=False, impl="mma") for i in range(rot.n)]
                ms = _time_rotating([op.run for op in ops], rep_ms)
                row = dict(context=ctx, heads=h, nodes=t, rg=rg, waves=waves, splits=ops[0].plan.splits, ms=ms, **_rates(cost, ms))
                rows.append(row)
                progress(f"ctx={ctx} H={h} T={t} rg={rg} waves={waves} splits={row['splits']}: {ms:.3f} ms {row['tb_s']:.2f} TB/s {row['tflop_s']:.1f} TFLOP/s")
                del ops
        del rot
        torch.cuda.empty_cache()
    return rows


# Stage ablation of the Hopper kernels: each variant deletes (or stubs) one stage of the main
# loop in the source text. Results are wrong by design; only the time means something.
# kernel -> stage -> source edits (old text, new text) that leave that stage out
_ABLATIONS = {
    "tree_verify_mla_wgmma": {
        "qk": [("issue_qk(s, stage(0));", ""), ("issue_qk(s, stage(j + 1));", "")],
        "pv": [("issue_pv(a, stage(j));", ""), ("issue_pv(a, stage(w.n_tiles - 1));", "")],
        "softmax": [("tvc::online_softmax<BN>(s, m_r, l_r, alpha);", "alpha[0] = alpha[1] = 1.f;"),
                    ("tvc::combine_and_mask<BN>(s, sS + ((half ^ 1) * BM + wr) * SS, g, t4, tile, w, row0 + wr, R, H, T, b, tree_mask, scale_log2);", "")],
        "exchange": [("tvc::store_partial_s<BN>(sS + (half * BM + wr) * SS, s, g, t4);\n      __syncthreads();", "")],
        # the loop's tile loads, and its wait for a TMA tile that would now never arrive
        "loads": [("if (j + 2 < w.n_tiles) load_tile(j + 2, (j + 2) % STAGES, coord_next);", ""), ("if (tma) wait_tma_tile(j + 1);", "")],
    },
    "tree_verify_mla_ws": {
        "qk": [("for (int ks = 0; ks < KSTEPS; ++ks) wgmma_qk(s, kstep_desc(sQ, BM, ks), kstep_desc(stage(tile), BN, ks), ks > 0);", "")],
        "pv": [("for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv_ss(o, p_desc(sP + (tile & 1) * P_BUF, kk), v_desc(stage(tile), 0, kk));", ""),
               ("for (int kk = 0; kk < BN / 16; ++kk) wgmma_pv_ss(o, p_desc(sP + (j & 1) * P_BUF, kk), v_desc(stage(j), 1, kk));", "")],
        "softmax": [("rescale = tvc::online_softmax_lazy<BN>(s, m_r, l_r, alpha, RESCALE_SLACK);", "alpha[0] = alpha[1] = 1.f;"),
                    ("tvc::mask_scores<BN>(s, g, t4, tile, w, row0 + wr, R, H, T, b, tree_mask, scale_log2);", "")],
        "rescale": [("if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) tvc::rescale_rows(o, alpha);", ""),
                    ("if (rescale) tvc::rescale_rows(o, alpha);", "")],
        # the loop's tile loads (the first three, before the loop, stay)
        "loads": [("          load_tile(j + STAGES - 1, pg);\n", "")],
        # not a stage: every tile rescales (the reference max follows the running max exactly)
        "eager": [("constexpr float RESCALE_SLACK = 8.f;", "constexpr float RESCALE_SLACK = 0.f;"),
                  ("if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) tvc::rescale_rows(o, alpha);", "tvc::rescale_rows(o, alpha);"),
                  ("if (rescale) tvc::rescale_rows(o, alpha);", "tvc::rescale_rows(o, alpha);")],
    },
    "tree_verify_mla_seesaw": {
        # S zeroed instead of computed (the k-step loop needs a body)
        "qk": [("wgmma_qk64(s, kstep_desc(sQ, BM, ks), kstep_desc(stage(t), BN, ks), ks > 0);",
                "if (ks == 0) { for (int i_ = 0; i_ < SN; ++i_) s[i_] = 0.f; }")],
        "pv": [("wgmma_pv_ss(o, p_desc(p_buf(stage(u)), kk), v_desc(stage(u), C, kk));", ";"),
               ("wgmma_pv(o, a[kk], v_desc(stage(t), C, kk));", "(void)a;")],
        "softmax": [("const bool rescale = tvc::online_softmax_lazy<BN>(s, m_r, l_r, alpha, RESCALE_SLACK);", "const bool rescale = false;\n      alpha[0] = alpha[1] = 1.f;"),
                    ("tvc::mask_scores<BN>(s, g, t4, t, w, row0 + wr, R, H, T, b, tree_mask, scale_log2);", "")],
        # (no "rescale": without its branch ptxas serialises every wgmma, C7520, and the rescales
        # are rare anyway with the lazy 2^8 slack)
        # every tile's cp.async (the loader still arrives on each part's mbarrier; Q is loaded)
        "loads": [("cp_async16(stage(tile) + tile_offset(BN, load_row<WG>(t, i), chunk), src[i] + chunk * 8, bytes[i]);", "(void)chunk;")],
    },
}
ABLATION_KERNELS = {"wgmma": "tree_verify_mla_wgmma", "wgmma_ws": "tree_verify_mla_ws", "wgmma_seesaw": "tree_verify_mla_seesaw"}  # impl -> source


def _partial_function(kernel: str, lookahead: int = 1) -> str:
    """The partial kernel's entry point in an ablation source (the ws kernel has one per lookahead)."""
    if kernel == "tree_verify_mla_wgmma":
        return "tree_verify_partial_wgmma"
    if kernel == "tree_verify_mla_seesaw":
        return "tree_verify_partial_seesaw"
    return "tree_verify_partial_ws" if lookahead == 1 else "tree_verify_partial_ws_la2"


def ablation_variants(kernel: str = "tree_verify_mla_wgmma") -> dict[str, str]:
    """Sources of a Hopper kernel with one stage left out ("no_qk", ...), plus "no_mma"
    (neither matrix multiply), "loads_only" (tile loads and barriers only), "full", and the ws
    kernel's "eager" (rescale on every tile)."""
    from . import kernels

    if kernel not in _ABLATIONS:
        raise ValueError(f"no ablations for {kernel!r}; choose from {list(_ABLATIONS)}")
    edits = _ABLATIONS[kernel]
    src = kernels.kernel_source(kernel)
    stages = [k for k in edits if k != "eager"]
    plans = {"full": []} | {f"no_{k}": edits[k] for k in stages}
    plans["no_mma"] = edits["qk"] + edits["pv"]
    plans["loads_only"] = [e for k in stages if k != "loads" for e in edits[k]]
    if "eager" in edits:
        plans["eager"] = edits["eager"]
    out = {}
    for name, plan in plans.items():
        s = src
        for old, new in plan:
            if s.count(old) != 1:
                raise RuntimeError(f"ablation {name}: expected one {old!r} in {kernel}.cu; update bench._ABLATIONS")
            s = s.replace(old, new)
        out[name] = s
    return out


def ablate(shapes=((65536, 64, 257), (185000, 8, 65), (185000, 8, 9)), rep_ms: float = 30.0, tma: bool = False, impl: str = "wgmma", lookahead: int = 1, progress=print) -> list[dict]:
    """Time every ``ablation_variants`` source of the ``impl`` kernel (``ABLATION_KERNELS``) on
    the same launches (sm_90 only); ``tma=True`` takes the wgmma kernel's TMA load path apart
    instead of the default cp.async one; ``lookahead`` the ws kernel's entry point (1 or 2)."""
    from pycuda.compiler import SourceModule

    from . import kernels
    from .attention.native import NativeTreeVerify

    if impl not in ABLATION_KERNELS:
        raise ValueError(f"impl must be one of {list(ABLATION_KERNELS)}, got {impl!r}")
    if torch.cuda.get_device_capability() != (9, 0):
        raise RuntimeError(f"the ablation runs the {impl} kernel: it needs an sm_90 GPU")
    kernel = ABLATION_KERNELS[impl]
    kernels.load_module("tree_verify_mla")  # joins torch's context before pycuda compiles
    funcs = {name: SourceModule(src, arch="compute_90a", code="sm_90a", no_extern_c=True, options=["-O3", "-std=c++17", "-diag-suppress=177"]).get_function(_partial_function(kernel, lookahead)) for name, src in ablation_variants(kernel).items()}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for ctx, h, t in shapes:
        rot = _Rotation(ctx, 64, t, h, l2, seed=ctx + h + t)
        la = lookahead if impl == "wgmma_ws" else None
        ops = [NativeTreeVerify(**rot.inputs(i), scale=SOFTMAX_SCALE, check=False, impl=impl, tma=tma, lookahead=la) for i in range(rot.n)]
        full = None
        for name, f in funcs.items():
            for op in ops:
                op._partial = f
            ms = _time_rotating([op.run for op in ops], rep_ms)
            full = full or ms
            rows.append(dict(impl=impl, lookahead=la, context=ctx, heads=h, nodes=t, tma=tma, variant=name, ms=ms, vs_full=ms / full))
            progress(f"{impl} ctx={ctx} H={h} T={t} tma={tma} {name:>10}: {ms:.3f} ms ({ms / full:.2f} of full)")
        del ops, rot
        torch.cuda.empty_cache()
    return rows


def entry_label(kernel: str, lookahead=None) -> str:
    """A kernel's name with ``_la1`` / ``_la2`` appended where it has a lookahead (the wgmma_ws
    kernel's two entry points); None or NaN (a pandas gap) is no lookahead."""
    return kernel if lookahead is None or lookahead != lookahead else f"{kernel}_la{int(lookahead)}"


def _ablation_label(row: dict) -> str:
    """The kernel (and ws entry point) an ablation row belongs to: "wgmma", "wgmma_ws_la2", ..."""
    return entry_label(row.get("impl") or "wgmma", row.get("lookahead"))


def merge_ablation(doc: dict | None, rows: list[dict], machine: dict) -> dict:
    """An ablation document holding ``rows`` (one kernel's run) and, from ``doc`` (an earlier
    ``native_ablation`` document or None), every other kernel's rows; ``runs`` maps each kernel
    to the machine its rows were recorded on."""
    labels = {_ablation_label(r) for r in rows}
    if len(labels) != 1:
        raise ValueError(f"one kernel's rows at a time, got {sorted(labels)}")
    label = labels.pop()
    if doc is None:
        return {"kind": "native_ablation", "machine": machine, "runs": {label: machine}, "rows": list(rows)}
    if doc.get("kind") != "native_ablation":
        raise ValueError(f"not an ablation document (kind {doc.get('kind')!r})")
    runs = dict(doc.get("runs") or {"wgmma": doc["machine"]})  # (the first recordings: v4 only)
    runs[label] = machine
    kept = [r for r in doc["rows"] if _ablation_label(r) != label]
    return {"kind": "native_ablation", "machine": machine, "runs": runs, "rows": kept + list(rows)}


def save(path: str | Path, kind: str, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"kind": kind, "machine": machine_metadata(), **payload}
    path.write_text(json.dumps(doc, indent=1, default=float))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.bench", description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["check", "sweep", "ceilings", "tune", "ablate"], help="ablate: time a Hopper kernel (--impl) with each stage left out (one shape under ncu: python -m specdiag.probes.workloads native)")
    ap.add_argument("--contexts", default=None, help="comma-separated prefix lengths (default: the full sweep)")
    ap.add_argument("--heads", default=None, help="comma-separated head counts")
    ap.add_argument("--trees", default=None, help="comma-separated tree sizes (nodes, root included)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="a few contexts only")
    ap.add_argument("--rep-ms", type=float, default=60.0)
    ap.add_argument("--impls", default="native,native_ps1,triton,torch", help=f"sweep: any of {', '.join(SWEEP_IMPLS)}")
    ap.add_argument("--impl", default="mma", choices=list(IMPLS), help="check, ablate: which native kernel (ablate: wgmma, wgmma_ws or wgmma_seesaw; the default mma means wgmma there)")
    ap.add_argument("--tma", action="store_true", help="check, ablate: the wgmma kernel with contiguous tiles loaded by TMA")
    ap.add_argument("--lookahead", type=int, choices=[1, 2], default=None, help="check, ablate: the wgmma_ws kernel's Q K^T lookahead")
    ap.add_argument("--append", action="store_true", help="ablate: merge into an existing --out file (this kernel's rows replace its earlier ones)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: the benchmarks need one (notebooks fall back to recorded data in data/)", file=sys.stderr)
        return 2
    if a.mode == "check":
        res = check_native(impl=a.impl, tma=a.tma, lookahead=a.lookahead)
        for r in res:
            print(r)
        save(a.out, "native_check", {"results": res})
        bad = [r for r in res if not r["all_written"] or r["rel_err_out"] > 1e-2 or r["rel_err_lse"] > 1e-3]
        print(f"{len(res) - len(bad)} passed, {len(bad)} failed")
        return 1 if bad else 0
    if a.mode == "tune":
        save(a.out, "native_tune", {"rows": tune(rep_ms=a.rep_ms)})
        return 0
    if a.mode == "ablate":
        rows = ablate(tma=a.tma, impl="wgmma" if a.impl == "mma" else a.impl, lookahead=a.lookahead or 1)
        out = Path(a.out)
        if a.append and out.is_file():  # this kernel's rows replace its earlier ones; the others stay
            out.write_text(json.dumps(merge_ablation(json.loads(out.read_text()), rows, machine_metadata()), indent=1, default=float))
        else:
            save(out, "native_ablation", {"runs": {_ablation_label(rows[0]): machine_metadata()}, "rows": rows})
        return 0
    ceilings = measure_ceilings()
    print(ceilings)
    if a.mode == "ceilings":
        save(a.out, "ceilings", {"ceilings": ceilings})
        return 0
    ints = lambda v, d: tuple(int(x) for x in v.split(",")) if v else d  # noqa: E731
    contexts = ints(a.contexts, (4096, 32768, 131072) if a.quick else SWEEP_CONTEXTS)
    rows = context_sweep(contexts=contexts, heads=ints(a.heads, SWEEP_HEADS), trees=ints(a.trees, SWEEP_TREES), impls=tuple(a.impls.split(",")), rep_ms=a.rep_ms)
    save(a.out, "context_sweep", {"ceilings": ceilings, "layers": LAYERS, "softmax_scale": SOFTMAX_SCALE, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
