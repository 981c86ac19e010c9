"""Tensor maps for the Tensor Memory Accelerator (TMA), encoded by the CUDA driver.

The seesaw kernel's ``TV_TMA_KV`` builds load whole prefix tiles with ``cp.async.bulk.tensor``
boxes of a few token rows (``pool_map``); each copy names a ``CUtensorMap`` (128 opaque bytes)
that the driver's ``cuTensorMapEncodeTiled`` fills in. pycuda does not wrap that call, so it is
called here through ctypes on ``libcuda``. The map is then copied to device memory and the kernel
gets its address (a tensor map may live in global memory; it is written before the launch, so no
in-kernel fence is needed).

``check_tiled`` validates the arguments against the driver's documented limits first, so a bad
shape fails here with a clear message (and can be tested on a machine without a GPU).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

__all__ = [
    "TiledMap",
    "check_tiled",
    "encode_tiled",
    "token_rows_map",
    "box_rows",
    "pool_map",
    "SWIZZLE_NONE",
    "SWIZZLE_128B",
]

# CUtensorMapDataType: the kernel only copies bytes, so bf16 rows are described as uint16
# (same 2-byte elements; out-of-bounds fill 0x0000 = bf16 +0).
_DTYPE_UINT16 = 1
_ELEM_BYTES = 2
SWIZZLE_NONE, SWIZZLE_128B = 0, 3  # CUtensorMapSwizzle
_SWIZZLE_SPAN = {SWIZZLE_NONE: None, SWIZZLE_128B: 128}
_INTERLEAVE_NONE = 0
_L2_PROMOTION_256B = 3
_OOB_FILL_ZERO = 0


@dataclass(frozen=True)
class TiledMap:
    """Arguments of one ``cuTensorMapEncodeTiled`` call (2-byte elements)."""

    address: int
    dims: tuple[int, ...]  # elements, innermost first
    strides: tuple[int, ...]  # bytes, of dims[1:]
    box: tuple[int, ...]
    swizzle: int = SWIZZLE_128B


def check_tiled(m: TiledMap) -> None:
    """Raise ValueError where the driver would refuse the map (CUDA driver API limits)."""
    rank = len(m.dims)
    if not 1 <= rank <= 5:
        raise ValueError(f"tensor rank must be 1..5, got {rank}")
    if len(m.strides) != rank - 1 or len(m.box) != rank:
        raise ValueError(
            f"a rank-{rank} map needs {rank - 1} strides and {rank} box sizes, got {len(m.strides)} and {len(m.box)}"
        )
    if m.address % 16:
        raise ValueError(f"global address must be 16-byte aligned, got {m.address:#x}")
    for i, d in enumerate(m.dims):
        if not 1 <= d <= 2**32:
            raise ValueError(f"dims[{i}] = {d} is outside 1..2^32")
    for i, s in enumerate(m.strides):
        if s % 16 or not 0 < s < 2**40:
            raise ValueError(f"strides[{i}] = {s} must be a positive multiple of 16 below 2^40")
    for i, b in enumerate(m.box):
        if not 1 <= b <= 256:
            raise ValueError(f"box[{i}] = {b} is outside 1..256")
    if m.swizzle not in _SWIZZLE_SPAN:
        raise ValueError(f"unsupported swizzle mode {m.swizzle}")
    inner = m.box[0] * _ELEM_BYTES
    if inner % 16:
        raise ValueError(f"the inner box dimension must span a multiple of 16 bytes, got {inner}")
    span = _SWIZZLE_SPAN[m.swizzle]
    if span is not None and inner > span:
        raise ValueError(
            f"with a {span}-byte swizzle the inner box dimension may span at most {span} bytes, got {inner}"
        )


def token_rows_map(address: int, rows: int, row_bytes: int, box_rows: int) -> TiledMap:
    """A 3-D map {64, row_bytes / 128, rows} over ``rows`` contiguous token rows of
    ``row_bytes`` bytes, box (64 elements, 1 column block, ``box_rows`` rows), 128-byte swizzle:
    one copy per column block lands as ``box_rows`` x 128 swizzled bytes."""
    if row_bytes % 128:
        raise ValueError(f"token rows must be a multiple of 128 bytes, got {row_bytes}")
    return TiledMap(address, (64, row_bytes // 128, rows), (128, row_bytes), (64, 1, box_rows), SWIZZLE_128B)


def box_rows(page_size: int, tile: int = 64) -> int:
    """Tokens per TMA box for pages of ``page_size`` tokens: the largest power of two up to
    ``tile`` that divides the page size (a box never crosses a page)."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    return min(tile, page_size & -page_size)


def pool_map(address: int, pages: int, page_size: int, row_bytes: int = 1152) -> TiledMap:
    """The map over a KV pool of ``pages`` x ``page_size`` token rows at ``address``, boxes of
    ``box_rows(page_size)`` tokens x one 64-dim column block."""
    return token_rows_map(address, pages * page_size, row_bytes, box_rows(page_size))


def _libcuda():
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("the CUDA driver library (libcuda) is not available: TMA maps need an NVIDIA driver")


def encode_tiled(m: TiledMap) -> bytes:
    """The 128-byte ``CUtensorMap`` for ``m`` (needs the CUDA driver)."""
    check_tiled(m)
    lib = _libcuda()
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    rank = len(m.dims)
    raw = ctypes.create_string_buffer(128 + 64)  # CUtensorMap is 64-byte aligned
    addr = (ctypes.addressof(raw) + 63) & ~63
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    dims = (u64 * rank)(*m.dims)
    strides = (u64 * max(1, rank - 1))(*(m.strides or (0,)))
    box = (u32 * rank)(*m.box)
    elem_strides = (u32 * rank)(*([1] * rank))
    res = fn(
        ctypes.c_void_p(addr),
        _DTYPE_UINT16,
        u32(rank),
        ctypes.c_void_p(m.address),
        dims,
        strides,
        box,
        elem_strides,
        _INTERLEAVE_NONE,
        m.swizzle,
        _L2_PROMOTION_256B,
        _OOB_FILL_ZERO,
    )
    if res != 0:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(res, ctypes.byref(msg))
        raise RuntimeError(
            f"cuTensorMapEncodeTiled failed ({res}: {msg.value.decode() if msg.value else 'unknown'}) for {m}"
        )
    return ctypes.string_at(addr, 128)
