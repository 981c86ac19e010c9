"""Correctness on the GPU: each native kernel against the float64 reference, on fresh random
inputs, with outputs and every unused pool slot poisoned first."""

from __future__ import annotations

import torch

from ..attention.inputs import make_verify_inputs, relative_error
from ..cost import SOFTMAX_SCALE

__all__ = ["CHECK_CASES", "OUT_TOLERANCE", "LSE_TOLERANCE", "poison_unused_slots", "check_native", "passed"]

OUT_TOLERANCE = 1e-2  # bf16 output
LSE_TOLERANCE = 1e-3  # float32 lse
CHECK_CASES = (
    # (prefix_lens, nodes, heads, page_size, tree_shape)
    ([1000], 9, 8, 64, "random"),
    ([0], 9, 8, 64, "chain"),
    ([1], 1, 1, 1, "chain"),
    ([4097, 33, 2000], 65, 8, 16, "random"),
    ([3000], 257, 8, 1, "fan"),
    ([5000], 65, 64, 128, "random"),
    ([70000], 9, 8, 64, "random"),
    ([777, 3001], 1024, 2, 64, "random"),
    ([2500], 17, 8, 64, "random"),
    ([123], 3, 128, 1, "chain"),
    ([0, 5000, 31], 33, 4, 64, "random"),  # ragged, one request with no prefix
    ([64, 129, 1], 10, 8, 1, "random"),  # 80 rows, prefixes at 64-key tile edges
    ([8192], 257, 8, 1, "random"),  # 64-key tiles: 4 splits of 35, the last of 23 (a short last split)
)


def poison_unused_slots(kv_pool: torch.Tensor, page_table: torch.Tensor, prefix_lens: torch.Tensor) -> int:
    """Fill every pool slot that no request's prefix uses with NaN (in place); returns how many.

    A kernel that reads a whole tile past the end of a prefix must not let those values reach
    the output: masked scores give P = 0, but 0 * NaN is NaN."""
    ps = kv_pool.shape[1]
    used = torch.zeros(kv_pool.shape[0] * ps, dtype=torch.bool)
    pt, lens = page_table.cpu().long(), prefix_lens.cpu().long()
    for i in range(pt.shape[0]):
        tok = torch.arange(int(lens[i]))
        used[pt[i, tok // ps] * ps + tok % ps] = True
    unused = (~used).view(kv_pool.shape[0], ps).to(kv_pool.device)
    kv_pool[unused] = float("nan")
    return int(unused.sum())


def passed(result: dict) -> bool:
    """A ``check_native`` result within the bf16 tolerances, every output written."""
    return bool(
        result["all_written"] and result["rel_err_out"] < OUT_TOLERANCE and result["rel_err_lse"] < LSE_TOLERANCE
    )


def check_native(cases=CHECK_CASES, seed: int = 1234, impl: str = "auto", defines: dict | None = None) -> list[dict]:
    """``impl`` (built with the compile-time switches ``defines``) against the float64 reference,
    one result per case."""
    from ..attention.native import NativeTreeVerify
    from ..attention.reference import tree_verify_attention_ref

    results = []
    for i, (lens, nodes, heads, ps, shape) in enumerate(cases):
        x, _ = make_verify_inputs(
            lens, nodes, heads, page_size=ps, tree_shape=shape, seed=seed + i, device="cuda", q_scale=1.0
        )
        poisoned = poison_unused_slots(x["kv_pool"], x["page_table"], x["prefix_lens"])
        op = NativeTreeVerify(**x, scale=SOFTMAX_SCALE, impl=impl, defines=defines)
        for buf in (op.out, op.lse, op.o_part):
            buf.fill_(float("nan"))
        out, lse = op.run()
        torch.cuda.synchronize()
        written = bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
        ref_o, ref_l = tree_verify_attention_ref(**{k: v.cpu() for k, v in x.items()}, scale=SOFTMAX_SCALE)
        results.append(
            dict(
                impl=op.impl,
                **({"defines": defines} if defines else {}),
                build=op.defines,  # what the partial kernel was built with (its page-size build too)
                prefix_lens=lens,
                nodes=nodes,
                heads=heads,
                page_size=ps,
                tree=shape,
                splits=op.plan.splits,
                poisoned_slots=poisoned,
                all_written=written,
                rel_err_out=relative_error(out, ref_o),
                rel_err_lse=relative_error(lse, ref_l),
            )
        )
    return results
