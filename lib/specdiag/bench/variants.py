"""Compile-time variants of a kernel (``-D`` switches of its source) beside its default build and
FlashMLA's prefix call, in one process: first whether each variant's output is bit-identical to
the default build's on held-out inputs (a schedule or load-path change must not change a single
bit), then their times on rotated inputs."""

from __future__ import annotations

import torch

from ..attention import peers
from ..attention.registry import KERNELS
from ..cost import SOFTMAX_SCALE, attention_cost, rates

__all__ = [
    "parse_variants",
    "parse_shapes",
    "check_switches",
    "IDENTITY_CASES",
    "VARIANT_SHAPES",
    "identity",
    "time_variants",
]

# (prefix lengths, nodes, heads, page size): ragged batches, empty and partial tiles, odd pages
IDENTITY_CASES = (
    ([4097, 0, 70000], 65, 16, 1),
    ([32768], 9, 8, 1),
    ([1000, 3000], 257, 8, 7),
    ([185000], 9, 8, 1),
    ([20000], 65, 128, 64),
    ([5000, 777], 9, 16, 12),
    ([9000], 65, 8, 96),
)
VARIANT_SHAPES = ((185000, 8, 9), (185000, 8, 65), (32768, 64, 65), (131072, 128, 65), (65536, 16, 65), (32768, 128, 9))


def parse_variants(text: str) -> list[dict[str, int]]:
    """'A=1;A=2,B=3' -> [{'A': 1}, {'A': 2, 'B': 3}]; one line of error for anything else."""
    out = []
    for chunk in filter(None, (c.strip() for c in text.split(";"))):
        d = {}
        for kv in chunk.split(","):
            name, sep, value = kv.strip().partition("=")
            if not sep or not name.isidentifier() or not value.strip().lstrip("-").isdigit():
                raise ValueError(f"a variant is NAME=INT[,NAME=INT...], got {chunk!r}")
            d[name] = int(value)
        out.append(d)
    if not out:
        raise ValueError("no variants given (e.g. 'TV_SKIP=1;TV_SKIP=2')")
    return out


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'32768x8x257,185000x128x65' -> [(32768, 8, 257), (185000, 128, 65)]; one line of error
    for anything else."""
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 3 for s in shapes):
        raise ValueError(f"each shape is CONTEXTxHEADSxNODES, e.g. 185000x8x9, got {text!r}")
    return shapes


def check_switches(impl: str, variants: list[dict]) -> None:
    """Refuse a define the kernel's source (its headers pasted in) never names: nvcc would accept
    it, and the "variant" would silently be the default build."""
    import re

    from .. import kernels

    if impl not in KERNELS:
        raise ValueError(f"impl must be one of {tuple(KERNELS)}, got {impl!r}")
    src = KERNELS[impl].source
    text = kernels.kernel_source(src)
    for v in variants:
        for name in v:
            if not re.search(rf"\b{re.escape(name)}\b", text):
                raise ValueError(f"{name} is not a switch of kernels/{src}.cu or its headers")
            # (the stage switches live in the Hopper header; only the kernels built on them obey)
            if name == "TV_SKIP" and not KERNELS[impl].ablations:
                raise ValueError(f"TV_SKIP is not a switch of kernels/{src}.cu: it has no stage ablations")


def identity(
    impl: str, variants: list[dict], cases=IDENTITY_CASES, progress=print, base: dict | None = None
) -> list[dict]:
    """For each variant and case: whether out and lse equal the default build's (or the ``base``
    switches' build's) bit for bit."""
    from ..attention.inputs import make_verify_inputs
    from ..attention.native import NativeTreeVerify

    rows = []
    for lens, nodes, heads, ps in cases:
        x, _ = make_verify_inputs(lens, nodes, heads, page_size=ps, device="cuda", seed=len(lens) + nodes)
        ref = [t.clone() for t in NativeTreeVerify(**x, scale=SOFTMAX_SCALE, impl=impl, defines=base).run()]
        for v in variants:
            out, lse = NativeTreeVerify(**x, scale=SOFTMAX_SCALE, impl=impl, defines=v).run()
            same = bool(torch.equal(out, ref[0]) and torch.equal(lse, ref[1]))
            diff = float((out.float() - ref[0].float()).abs().max())
            rows.append(
                dict(
                    impl=impl,
                    defines=v,
                    prefix_lens=lens,
                    nodes=nodes,
                    heads=heads,
                    page_size=ps,
                    bit_identical=same,
                    max_abs_diff=diff,
                )
            )
            verdict = "bit-identical" if same else f"differs by {diff:.3g}"
            progress(f"{impl} {v} {lens} T={nodes} H={heads} ps={ps}: {verdict}")
    return rows


def time_variants(
    impl: str, variants: list[dict], shapes=VARIANT_SHAPES, page_sizes=(1, 64), rep_ms: float = 25.0, progress=print
) -> list[dict]:
    """Rows of ``impl, defines, context, heads, nodes, page_size, ms`` for the default build and each
    variant, FlashMLA's prefix call (page size 64) on the same shapes where it is installed, and
    at page size 1 its sparse prefill (the whole verify, 64-head blocks only)."""
    from .peers import PEER_IMPLS, peer_calls, shape_unsupported
    from .timing import Rotation, time_rotating

    check_switches(impl, variants)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size

    def timed(name, defines, page_size, calls, shape, cost, **extra) -> dict:  # one row of the recording
        ctx, heads, nodes = shape
        ms = time_rotating(calls, rep_ms)
        progress(f"{name} {defines or ''} ctx={ctx} H={heads} T={nodes} ps={page_size}: {ms * 1e3:.1f} us")
        row = dict(impl=name, defines=defines, context=ctx, heads=heads, nodes=nodes, page_size=page_size, ms=ms)
        return row | extra | cost | rates(cost, ms)

    rows = []
    for shape in shapes:
        ctx, heads, nodes = shape
        cost = attention_cost(ctx, nodes, heads)
        for ps in sorted(set(page_sizes) | {64}):
            rot = Rotation(ctx, ps, nodes, heads, l2, seed=ctx + heads + nodes)
            if ps in page_sizes:
                for v in [{}, *variants]:
                    ops = rot.native_ops(impl=impl, defines=v)
                    rows.append(timed(impl, v, ps, [op.run for op in ops], shape, cost, splits=ops[0].plan.splits))
                    del ops
            # FlashMLA beside them where installed: its sparse prefill at page size 1, its prefix call at 64
            peer = {1: "flashmla_sparse", 64: "flashmla"}.get(ps)
            if peer and not peers.flashmla_missing() and not shape_unsupported(peer, heads, nodes):
                calls, _ = peer_calls(peer, rot)
                rows.append(timed(peer, {}, PEER_IMPLS[peer], calls, shape, cost))
                del calls
            del rot
            torch.cuda.empty_cache()
    return rows
