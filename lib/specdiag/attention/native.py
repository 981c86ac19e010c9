"""The native CUDA tree-verify attention as a torch op.

``NativeTreeVerify`` validates, plans, allocates and packs the kernels' one argument
(``VerifyParams``) once; ``run()`` only launches two kernels on torch's current stream: the
partial kernel ``impl`` names (``registry.KERNELS``; ``"auto"`` picks by GPU and shape) over every
(query tile, KV split, request), then the log-sum-exp merge.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math

import torch

from .inputs import MLA_HEAD_DIM, MLA_V_DIM, check_verify_inputs
from .plan import merge_groups, plan_launch
from .registry import KERNELS, MERGE, resolve_impl

__all__ = [
    "NativeTreeVerify",
    "VerifyParams",
    "build_defines",
    "page_divider",
    "tree_mask_bits",
    "tree_verify_attention_native",
]


_I32, _U32, _PTR = ctypes.c_int32, ctypes.c_uint32, ctypes.c_void_p
_POINTERS = ("q", "kv_pool", "page_table", "prefix_lens", "tree_kv", "tree_mask", "o_part", "lse_part", "out", "lse")


class VerifyParams(ctypes.Structure):
    """Mirror of ``tv::VerifyParams`` (kernels/tree_verify_params.cuh); shapes and dtypes there."""

    _fields_ = [
        *((name, _PTR) for name in _POINTERS),
        ("R", _I32),
        ("T", _I32),
        ("H", _I32),
        ("page_size", _I32),
        ("page_magic", _U32),
        ("page_shift", _I32),
        ("max_pages", _I32),
        ("n_prefix_splits", _I32),
        ("prefix_tiles_per_split", _I32),
        ("tree_tiles_per_split", _I32),
        ("NS", _I32),
        ("scale_log2", ctypes.c_float),
        ("tree_bits", _PTR),
        ("tree_words", _I32),
    ]


def page_divider(page_size: int) -> tuple[int, int]:
    """(magic, shift) with n // page_size == (umulhi(n, magic) + n) >> shift for 0 <= n < 2**31: the
    kernels' page lookups multiply instead of dividing (``tv::page_of``)."""
    if not 1 <= page_size < 2**31:
        raise ValueError(f"page_size must be in 1..2^31-1, got {page_size}")
    shift = (page_size - 1).bit_length()  # ceil(log2 page_size)
    return ((1 << 32) * ((1 << shift) - page_size)) // page_size + 1, shift


def tree_mask_bits(tree_mask: torch.Tensor) -> torch.Tensor:
    """The ancestor mask [B, T, T] (nonzero: visible) packed for the kernels' ``tree_bits``: int64
    [B, T, ceil(T / 64)], bit k of word j of [b][i] set where node i sees node 64 j + k (keys past T
    clear)."""
    b, t, _ = tree_mask.shape
    words = -(-t // 64)
    padded = torch.zeros(b, t, words * 64, dtype=torch.uint8, device=tree_mask.device)
    padded[..., :t] = tree_mask != 0
    # a byte per 8 keys (distinct bits: the sum is their OR), 8 bytes a little-endian word; no
    # temporary wider than the mask itself
    shifts = torch.arange(8, dtype=torch.uint8, device=tree_mask.device)
    packed = (padded.view(b, t, words * 8, 8) << shifts).sum(-1, dtype=torch.uint8)
    return packed.view(torch.int64)


# Whether a pool of one-token pages gets the TV_PAGE_SIZE=1 build by default: it returns the run-time
# page size's bits, a little sooner (docs/kernel_notes.md, thirty-eighth session)
ONE_TOKEN_PAGE_BUILD = True


def build_defines(page_size: int, defines=None) -> dict[str, int]:
    """The partial kernel's compile-time switches for a pool of ``page_size``-token pages:
    ``defines``, and ``TV_PAGE_SIZE=1`` for one-token pages where ``ONE_TOKEN_PAGE_BUILD`` (the
    build whose loaders do no page arithmetic). A ``TV_PAGE_SIZE`` in ``defines`` must be 0 (the
    page size read at run time) or ``page_size``: a build for other pages would read the wrong rows."""
    out = {"TV_PAGE_SIZE": 1} if page_size == 1 and ONE_TOKEN_PAGE_BUILD else {}
    out.update(defines or {})
    fixed = out.get("TV_PAGE_SIZE", 0)
    if fixed not in (0, page_size):
        raise ValueError(f"defines TV_PAGE_SIZE={fixed}, but kv_pool's pages hold {page_size} tokens")
    return out


def _validated(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, check: bool):
    if isinstance(q, torch.Tensor) and q.shape[-1] != MLA_HEAD_DIM:
        raise ValueError(f"the native kernel is built for head dim {MLA_HEAD_DIM}; q has {q.shape[-1]}")
    x = check_verify_inputs(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, MLA_V_DIM, check_pages=check)
    for name, t in (("q", x.q), ("kv_pool", x.kv_pool), ("tree_kv", x.tree_kv)):
        if t.dtype != torch.bfloat16:
            raise ValueError(f"the native kernel needs bf16 {name}, got {t.dtype}")
        if not t.is_cuda:
            raise ValueError(f"the native kernel needs {name} on a CUDA device")
        if t.device != x.q.device:
            raise ValueError(f"{name} is on {t.device}, q on {x.q.device}")
    return x


class NativeTreeVerify:
    """Validated, planned, allocated and packed once; ``run()`` launches.

    Same contract as ``tree_verify_attention_ref``: bf16 ``q`` [B, T, H, 576] (or [T, H, 576]),
    ``kv_pool`` [pages, page_size, 576], int ``page_table`` [B, max_pages] and ``prefix_lens`` [B],
    bf16 ``tree_kv`` [B, T, 576], bool/uint8 ``tree_mask`` [B, T, T], all on one CUDA device;
    ``run()`` returns ``out`` bf16 [B, T, H, 512] and ``lse`` float32 [B, T, H] (natural log),
    buffers reused by the next ``run()``. ``impl``: a ``registry.KERNELS`` name or ``"auto"``;
    ``prefix_splits`` overrides the plan's split count; ``defines`` are compile-time switches of
    the kernel source (the stage ablations' ``TV_SKIP``; ``TV_PAGE_SIZE=1`` for a pool of one-token
    pages), checked by ``build_defines``; ``self.defines`` is what the partial kernel was built with.
    """

    def __init__(
        self,
        q,
        kv_pool,
        page_table,
        prefix_lens,
        tree_kv,
        tree_mask,
        scale,
        *,
        impl="auto",
        prefix_splits=None,
        check=True,
        defines=None,
    ):
        from .. import kernels

        if impl != "auto":
            resolve_impl(impl)  # a bad name fails before the tensors are looked at
        x = _validated(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, check)
        dev = x.q.device
        b, t, h, _ = x.q.shape
        max_prefix = int(x.prefix_lens.max())
        self.spec = KERNELS[resolve_impl(impl, dev, max_prefix=max_prefix, rows=t * h)]
        self.defines = build_defines(x.kv_pool.shape[1], defines)
        # what the build exports: a -D build may change the tile or shared memory (plan with it),
        # and the module says whether it reads the packed ancestor mask
        cfg = kernels.module_config(self.spec, dev.index, self.defines)
        if self.defines:
            self.spec = dataclasses.replace(
                self.spec,
                threads=cfg.threads,
                rows_per_cta=cfg.rows_per_cta,
                keys_per_tile=cfg.keys_per_tile,
                smem_bytes=cfg.smem_bytes,
            )
        self.impl = self.spec.name
        self.batched = x.batched
        self.device = dev
        num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
        self.plan = plan = plan_launch(
            t * h,
            t,
            max_prefix,
            b,
            num_sms,
            prefix_splits,
            rows_per_cta=self.spec.rows_per_cta,
            bn=self.spec.keys_per_tile,
        )
        self._keep = (
            x.q.contiguous(),
            x.kv_pool.contiguous(),
            x.page_table.to(device=dev, dtype=torch.int32).contiguous(),
            x.prefix_lens.to(device=dev, dtype=torch.int32).contiguous(),
            x.tree_kv.contiguous(),
            x.tree_mask.to(device=dev, dtype=torch.uint8).contiguous(),
        )
        self.o_part = torch.empty(b, plan.splits, t * h, MLA_V_DIM, device=dev, dtype=torch.float32)
        self.lse_part = torch.empty(b, plan.splits, t * h, device=dev, dtype=torch.float32)
        self.out = torch.empty(b, t, h, MLA_V_DIM, device=dev, dtype=torch.bfloat16)
        self.lse = torch.empty(b, t, h, device=dev, dtype=torch.float32)
        # the packed ancestor mask, once per plan, for a build that reads it; else none
        self.tree_bits = tree_mask_bits(x.tree_mask) if cfg.tree_bits else None
        q_, pool, pt, lens, tkv, mask = self._keep
        magic, shift = page_divider(pool.shape[1])
        self.params = VerifyParams(
            **{
                name: t.data_ptr()
                for name, t in zip(
                    _POINTERS, (q_, pool, pt, lens, tkv, mask, self.o_part, self.lse_part, self.out, self.lse)
                )
            },
            R=t * h,
            T=t,
            H=h,
            page_size=pool.shape[1],
            page_magic=magic,
            page_shift=shift,
            max_pages=pt.shape[1],
            n_prefix_splits=plan.n_prefix_splits,
            prefix_tiles_per_split=plan.prefix_tiles_per_split,
            tree_tiles_per_split=plan.tree_tiles_per_split,
            NS=plan.splits,
            scale_log2=scale * math.log2(math.e),
            tree_bits=None if self.tree_bits is None else self.tree_bits.data_ptr(),
            tree_words=0 if self.tree_bits is None else self.tree_bits.shape[-1],
        )
        packed = bytes(self.params)
        with torch.cuda.device(dev):
            partial = kernels.load_kernel(self.spec, dev.index, self.defines)
            merge = kernels.load_kernel(MERGE, dev.index)
        self._launches = (
            kernels.PreparedLaunch(
                partial.function,
                (plan.m_tiles, plan.splits, b),
                (self.spec.threads, 1, 1),
                packed,
                shared=partial.smem_bytes,
                device_index=dev.index,
            ),
            kernels.PreparedLaunch(
                merge.function,
                (t * h, b, merge_groups(plan.splits)),
                (MERGE.threads, 1, 1),
                packed,
                device_index=dev.index,
            ),
        )

    def bind(self, q=None, kv_pool=None, tree_kv=None, out=None) -> "NativeTreeVerify":
        """Point the prepared launches at other tensors of the same shapes, dtype and device (the
        next layer's q, KV pool and tree latents; ``out``: where ``run()`` writes, [B, T, H, 512]
        bf16), keeping the plan: one plan per step, one ``bind`` + ``run`` per layer."""
        q_, pool, _, _, tkv, _ = self._keep
        new = dict(q=q, kv_pool=kv_pool, tree_kv=tree_kv, out=out)
        have = dict(q=q_, kv_pool=pool, tree_kv=tkv, out=self.out)
        for name, t in new.items():
            if t is None:
                continue
            if t.numel() != have[name].numel() or t.shape[-1] != have[name].shape[-1]:
                raise ValueError(
                    f"bind: {name} has shape {tuple(t.shape)}, the plan was made for {tuple(have[name].shape)}"
                )
            if t.dtype != have[name].dtype or t.device != have[name].device or not t.is_contiguous():
                raise ValueError(f"bind: {name} must be contiguous {have[name].dtype} on {have[name].device}")
            if name == "kv_pool" and t.shape[1:] != pool.shape[1:]:
                raise ValueError(
                    f"bind: kv_pool pages are {tuple(t.shape[1:])}, the plan's are {tuple(pool.shape[1:])}"
                )
            setattr(self.params, name, t.data_ptr())
        keep = dict(zip(("q", "kv_pool", "page_table", "prefix_lens", "tree_kv", "tree_mask"), self._keep))
        keep.update({k: t for k, t in new.items() if t is not None and k != "out"})
        self._keep = tuple(keep.values())  # the launches hold raw pointers: keep their tensors alive
        if out is not None:
            self.out = out.view(self.out.shape)
        packed = bytes(self.params)
        for launch in self._launches:
            launch.buf = packed
        return self

    def run(self):
        for launch in self._launches:
            launch()
        return (self.out, self.lse) if self.batched else (self.out[0], self.lse[0])


def tree_verify_attention_native(*inputs, **options):
    """MLA tree-verify attention on the GPU, as a function: ``NativeTreeVerify``'s arguments, and
    copies of what its ``run()`` returns (same contract as ``tree_verify_attention_ref``)."""
    out, lse = NativeTreeVerify(*inputs, **options).run()
    return out.clone(), lse.clone()
