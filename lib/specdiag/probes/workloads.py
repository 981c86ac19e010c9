"""The three workloads notebook 02 puts side by side.

* ``baseline``: the page_size=1 Triton extend kernel at long context (latency-bound gathers,
  a handful of CTAs): the kernel the deployment was running;
* ``native``: the native split-KV tree-verify kernel on the same inputs (``impl`` picks the
  kernel, as in ``NativeTreeVerify``);
* ``gemm``: an 8192^3 bf16 matrix product (the tensor cores at full tilt).

``python -m specdiag.probes.workloads NAME --iters N`` builds the inputs, warms up, then runs
N iterations inside a CUDA profiler range (what ``probes.ncu`` profiles, or ncu by hand:
``ncu --kernel-name regex:tree_verify_partial python -m specdiag.probes.workloads native --impl mma``).
"""

from __future__ import annotations

import argparse
import sys

from ..cost import SOFTMAX_SCALE

__all__ = ["WORKLOADS", "make_workload", "KERNEL_REGEX"]

WORKLOADS = ("baseline", "native", "gemm")
KERNEL_REGEX = {"baseline": "_extend_fwd_kernel", "native": "tree_verify_partial", "gemm": "."}


def make_workload(name: str, context: int = 131072, heads: int = 8, nodes: int = 9, seed: int = 0, impl: str = "auto"):
    """Build inputs on the GPU and return a zero-argument callable that launches one step."""
    import torch

    from ..attention.inputs import make_verify_inputs

    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {WORKLOADS}")
    if not torch.cuda.is_available():
        raise RuntimeError("workloads need a CUDA GPU")
    if name == "gemm":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        return lambda: a @ b
    x, _ = make_verify_inputs(
        [context], nodes, heads, page_size=1 if name == "baseline" else 64, seed=seed, device="cuda"
    )
    if name == "baseline":
        from ..attention.triton_extend import extend_attention_fwd, prepare_extend_inputs

        prep = prepare_extend_inputs(**x)
        return lambda: extend_attention_fwd(prep, SOFTMAX_SCALE)
    from ..attention.native import NativeTreeVerify

    op = NativeTreeVerify(**x, scale=SOFTMAX_SCALE, impl=impl)
    return op.run


def run_for(fn, seconds: float) -> int:
    """Launch ``fn`` back to back for about ``seconds`` (synchronising every few launches)."""
    import time

    import torch

    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(4):
            fn()
        n += 4
        torch.cuda.synchronize()
    return n


def main(argv=None) -> int:
    from ..attention.registry import KERNELS

    ap = argparse.ArgumentParser(prog="python -m specdiag.probes.workloads")
    ap.add_argument("name", choices=WORKLOADS)
    ap.add_argument("--iters", type=int, default=1)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=9)
    ap.add_argument("--impl", default="auto", choices=["auto", *KERNELS], help="native: which kernel")
    a = ap.parse_args(argv)
    from ..machine import gpu_available

    if not gpu_available():
        print(f"{ap.prog}: needs a CUDA GPU (the notebooks show the recordings in data/ without one)", file=sys.stderr)
        return 2
    import torch

    fn = make_workload(a.name, a.context, a.heads, a.nodes, impl=a.impl)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(a.iters):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
