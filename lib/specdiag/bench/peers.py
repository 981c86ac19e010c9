"""Our kernel beside the real peers, one process, one GPU, the same rotated inputs: the data of
``data/peers_h200.json`` (notebooks 03 and 05).

impl names: ``native`` (``auto``, page size 1, as DDTree forces), ``native_ps64``, ``flashmla``
(FlashMLA's prefix call alone: no tree block), ``flashmla_cascade`` (FlashMLA + the tree block +
merge in torch), ``flashmla_sparse`` (the whole verify through FlashMLA's token-gathering sparse
prefill, page size 1; 64 or 128 heads only), ``sglang`` (the deployment's own Triton kernel),
``triton`` (our imitation of it), and ``native:<kernel>`` (one registry kernel, page size 1, in
place of ``auto``'s choice).
"""

from __future__ import annotations

import time

import torch

from ..attention import peers, relative_error
from ..attention.registry import KERNELS
from ..cost import SOFTMAX_SCALE, attention_cost, rates
from .timing import Rotation, time_rotating

__all__ = [
    "PEER_IMPLS",
    "peer_page_size",
    "PEER_CONTEXTS",
    "PEER_SHAPES",
    "missing_peers",
    "shape_unsupported",
    "peer_calls",
    "peer_sweep",
]

PEER_IMPLS = {  # name -> KV page size
    "native": 1,
    "native_ps64": 64,
    "flashmla": 64,
    "flashmla_cascade": 64,
    "flashmla_sparse": 1,
    "sglang": 1,
    "triton": 1,
}
PEER_CONTEXTS = (4096, 16384, 32768, 65536, 131072, 185000)
# (heads, nodes): 8/16/64/128 heads x 9/65 nodes, and 257 nodes at 8 heads
PEER_SHAPES = tuple((h, t) for h in (8, 16, 64, 128) for t in (9, 65)) + ((8, 257),)


def peer_page_size(impl: str) -> int:
    """The KV page size ``impl`` runs at; ValueError for a name that is no peer."""
    if impl in PEER_IMPLS:
        return PEER_IMPLS[impl]
    name, _, kernel = impl.partition(":")
    if name == "native" and kernel in KERNELS:
        return 1
    raise ValueError(
        f"unknown implementation {impl!r}; choose from {list(PEER_IMPLS)} or native:KERNEL ({', '.join(KERNELS)})"
    )


def missing_peers(impls) -> dict[str, str]:
    """impl -> why it cannot run here, for each of ``impls`` that cannot."""
    out = {}
    for impl in impls:
        kernel = impl.partition(":")[2]
        if kernel in KERNELS and KERNELS[kernel].hopper_only and torch.cuda.get_device_capability() != (9, 0):
            out[impl] = f"{kernel} needs sm_90a"
        elif impl.startswith("flashmla") and peers.flashmla_missing():
            out[impl] = peers.flashmla_missing()
        elif impl == "sglang":
            try:
                peers.load_sglang_extend()
            except (FileNotFoundError, RuntimeError) as e:
                out[impl] = str(e)
    return out


def shape_unsupported(impl: str, heads: int, nodes: int) -> str | None:
    """Why ``impl`` cannot run a shape it otherwise runs, or None."""
    if impl == "flashmla_sparse" and heads % 64:
        return "FlashMLA's sparse prefill takes heads in blocks of 64"
    return None


def peer_calls(impl: str, rot: Rotation) -> tuple[list, dict]:
    """One prepared call per rotation set, and what to record about it."""
    sets = [rot.inputs(i) for i in range(rot.n)]
    if impl.startswith("native"):
        ops = rot.native_ops(impl=impl.partition(":")[2] or "auto")
        return [op.run for op in ops], dict(kernel=ops[0].impl, splits=ops[0].plan.splits, build=ops[0].defines)
    if impl == "flashmla":
        keep = ("q", "kv_pool", "page_table", "prefix_lens")
        return [peers.FlashMLAPrefix(**{k: s[k] for k in keep}, scale=SOFTMAX_SCALE).run for s in sets], {}
    if impl == "flashmla_cascade":
        return [peers.FlashMLACascade(**s, scale=SOFTMAX_SCALE).run for s in sets], {}
    if impl == "flashmla_sparse":  # one key array per pool: the sets differ in their page tables only
        kv = peers.sparse_kv(sets[0]["kv_pool"], sets[0]["tree_kv"])
        return [peers.FlashMLASparseVerify(**s, scale=SOFTMAX_SCALE, kv=kv).run for s in sets], {}
    if impl == "sglang":
        return [peers.SglangExtend(**s, scale=SOFTMAX_SCALE).run for s in sets], {}
    if impl == "triton":
        from ..attention.triton_extend import extend_attention_fwd, prepare_extend_inputs

        preps = [prepare_extend_inputs(**s) for s in sets]
        return [(lambda p=p: extend_attention_fwd(p, SOFTMAX_SCALE)) for p in preps], {}
    raise ValueError(f"{impl!r} has no call here")


def peer_sweep(
    contexts=PEER_CONTEXTS,
    shapes=PEER_SHAPES,
    impls=tuple(PEER_IMPLS),
    rep_ms: float = 40.0,
    progress=print,
    rounds: int = 2,
) -> tuple[list[dict], dict[str, str]]:
    """Rows of ``impl, context, heads, nodes, page_size, ms`` (+ cost and rates) for each impl that
    can run here, and {impl: why not} for those that cannot. Each shape's impls, of every page size,
    are timed ``rounds`` times in one order, reversed every other round: ours first, then FlashMLA's
    prefix call, so the two are timed back to back in every round. ``ms`` is the fastest of an
    impl's timings (``ms_runs``): one timing of a long call spreads by several percent."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    page_size = {i: peer_page_size(i) for i in impls}
    missing = missing_peers(impls)
    for impl, why in missing.items():
        progress(f"{impl}: not measured ({why})")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    turn = lambda i: (i != "native", i != "flashmla", not i.startswith("native"))  # noqa: E731
    rows = []
    for ctx in contexts:
        for h, t in shapes:
            cost = attention_cost(ctx, t, h)
            groups = {}  # page size -> (its inputs, its impls)
            for ps in sorted(set(page_size.values())):
                run = [i for i in impls if page_size[i] == ps and i not in missing]
                for impl in [i for i in run if shape_unsupported(i, h, t)]:
                    why = shape_unsupported(impl, h, t)
                    progress(f"{impl:>16} ctx={ctx:>6} H={h:>3} T={t:>4}: not measured ({why})")
                    run.remove(impl)
                if run:  # (a whole native verify first: the group's anchor)
                    run.sort(key=lambda i: not i.startswith("native"))
                    groups[ps] = (Rotation(ctx, ps, t, h, l2, seed=ctx + h + t), run)
            order = sorted((i for _, run in groups.values() for i in run), key=turn)
            built = {impl: peer_calls(impl, groups[page_size[impl]][0]) for impl in order}
            times = {impl: [] for impl in order}
            for r in range(rounds):
                for impl in order if r % 2 == 0 else order[::-1]:
                    t0 = time.time()
                    ms = time_rotating(built[impl][0], rep_ms)
                    times[impl].append(ms)
                    progress(f"{impl:>16} ctx={ctx:>6} H={h:>3} T={t:>4}: {ms:9.4f} ms ({time.time() - t0:.1f}s)")
            for ps, (_, run) in groups.items():
                anchor = None  # ours on the group's first input set: every whole verify must agree with it
                for impl in run:
                    calls, extra = built.pop(impl)
                    out = calls[0]()[0].float()
                    if anchor is None:
                        anchor = out
                    elif impl != "flashmla":  # FlashMLA alone leaves out the tree block
                        extra["rel_diff_native"] = relative_error(out, anchor)
                    ms = min(times[impl])
                    rows.append(
                        dict(impl=impl, context=ctx, heads=h, nodes=t, page_size=ps, ms=ms, ms_runs=times[impl])
                        | extra
                        | cost
                        | rates(cost, ms)
                    )
                    del calls
            del groups
            torch.cuda.empty_cache()
    return rows, missing
