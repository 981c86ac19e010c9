"""The real peers, each optional: SGLang's own Triton extend-attention kernel (what the deployment
ran), loaded unmodified from the sglang wheel, and DeepSeek's FlashMLA SM90 dense decode.

* ``SglangExtend``: ``sglang.kernels.ops.attention.extend_attention.extend_attention_fwd`` of
  sglang ``SGLANG_VERSION``, called with what SGLang's Triton backend passes in target-verify for
  an MLA layer: page_size=1 ``kv_indices``, ``qo_indptr`` / ``kv_indptr`` / ``mask_indptr``, the
  flat per-request [T, prefix + T] custom mask, ``is_causal=True``, the default
  ``skip_prefix_custom_mask=True``, K = the 576-wide latent, V = its first 512 columns. Its four
  imports of the engine are met by ``_engine_stubs`` (no engine is installed). It runs on a GPU,
  and on the CPU under ``TRITON_INTERPRET=1`` in float32.
* ``FlashMLAPrefix``: ``flash_mla.flash_mla_with_kvcache(use_legacy=True)`` (the ``sgl-flash-mla``
  wheel) over the prefix alone: page size 64, ``causal=False``, the T nodes as ``s_q``. It has no
  tree mask; ``FlashMLACascade`` adds the tree block and the log-sum-exp merge in torch.
* ``FlashMLASparseVerify``: ``flash_mla.flash_mla_sparse_fwd(use_legacy=True)``, FlashMLA's SM90
  sparse prefill, which gathers single tokens by index: the whole tree verify at any page size
  (the deployment's is 1), each node attending to its prefix rows and visible tree rows
  (``sparse_indices``). Its heads come in blocks of 64.

Where the sglang kernel comes from (``sglang_source``): ``$SPECDIAG_SGLANG`` (a sglang wheel, or a
folder holding ``sglang/kernels/ops/attention/``), else a wheel in ``~/.cache/specdiag``
(``pip download --no-deps sglang==0.5.23 -d ~/.cache/specdiag``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import types
import zipfile
from pathlib import Path

import torch

from .inputs import MLA_HEAD_DIM, MLA_V_DIM
from .reference import merge_partials

__all__ = [
    "SGLANG_VERSION",
    "SGLANG_FILES",
    "sglang_source",
    "sglang_runs_here",
    "load_sglang_extend",
    "sglang_provenance",
    "sglang_tile",
    "sglang_target_verify",
    "SglangExtend",
    "flashmla_missing",
    "FlashMLAPrefix",
    "FlashMLACascade",
    "sparse_indices",
    "sparse_kv",
    "FlashMLASparseVerify",
]

SGLANG_VERSION = "0.5.23"
_ATTN = "sglang/kernels/ops/attention"
# the kernel and the two sibling modules it imports from (loaded as they are)
SGLANG_FILES = (f"{_ATTN}/extend_attention.py", f"{_ATTN}/decode_attention.py", f"{_ATTN}/score_mod.py")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specdiag"
_loaded: dict[str, types.ModuleType] = {}


def sglang_source() -> Path | None:
    """The sglang wheel or folder the kernel is loaded from, or None."""
    env = os.environ.get("SPECDIAG_SGLANG")
    if env:
        path = Path(env).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"SPECDIAG_SGLANG={env} does not exist")
        return path
    wheels = sorted(CACHE.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    return wheels[-1] if wheels else None


def sglang_runs_here() -> bool:
    """A CUDA GPU and the sglang wheel (or folder) are both here: the real kernel can be timed."""
    from ..machine import gpu_available

    return gpu_available() and sglang_source() is not None


def _folder(source: Path) -> Path:
    """A folder holding SGLANG_FILES: ``source`` itself, or the wheel's files extracted once."""
    if source.is_dir():
        missing = [f for f in SGLANG_FILES if not (source / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{source} lacks {', '.join(missing)}")
        return source
    out = CACHE / source.stem
    with zipfile.ZipFile(source) as whl:
        names = set(whl.namelist())
        missing = [f for f in SGLANG_FILES if f not in names]
        if missing:
            raise FileNotFoundError(f"{source.name} lacks {', '.join(missing)}: not a sglang {SGLANG_VERSION} wheel?")
        for f in SGLANG_FILES:
            if not (out / f).is_file():
                whl.extract(f, out)
    return out


class _Envs:
    """``sglang.srt.environ.envs`` for the flags the extend path reads (on AMD GPUs only), at
    their defaults; any other flag is an error, so a new dependency shows itself."""

    DEFAULTS = {"SGLANG_TRITON_FP8_PREFILL_ATTN": False, "SGLANG_TRITON_COMPACT_EXTEND_ATTENTION": False}

    def __getattr__(self, name):
        if name not in self.DEFAULTS:
            raise AttributeError(f"specdiag's sglang stub has no environment flag {name}")
        return types.SimpleNamespace(get=lambda value=self.DEFAULTS[name]: value)


def _engine_stubs() -> dict[str, types.ModuleType]:
    """The engine modules the kernel files import: packages, ``sglang.srt.environ``, ``sglang.srt.utils``."""
    mods = {}
    for name in ("sglang", "sglang.srt", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention"):
        mods[name] = types.ModuleType(name)
        mods[name].__path__ = []
    mods["sglang.srt.environ"] = env = types.ModuleType("sglang.srt.environ")
    env.envs = _Envs()
    mods["sglang.srt.utils"] = utils = types.ModuleType("sglang.srt.utils")
    utils.is_cuda = lambda: torch.cuda.is_available() and torch.version.cuda is not None
    utils.is_hip = lambda: torch.version.hip is not None
    utils.is_gfx95_supported = lambda: False
    utils.is_gfx1250_supported = lambda: False
    utils.get_device_core_count = lambda i=0: torch.cuda.get_device_properties(i).multi_processor_count
    return mods


def load_sglang_extend(source: str | Path | None = None) -> types.ModuleType:
    """sglang's ``extend_attention`` module, loaded from ``source`` (default ``sglang_source()``)."""
    src = Path(source) if source is not None else sglang_source()
    if src is None:
        raise FileNotFoundError(
            f"no sglang {SGLANG_VERSION} wheel: set SPECDIAG_SGLANG, or run "
            f"pip download --no-deps sglang=={SGLANG_VERSION} -d {CACHE}"
        )
    key = str(src.resolve())
    if key in _loaded:
        return _loaded[key]
    folder = _folder(src)
    if "sglang" in sys.modules and not getattr(sys.modules["sglang"], "_specdiag_stub", False):
        raise RuntimeError("a real sglang is imported in this process: use its own extend_attention_fwd")
    stubs = _engine_stubs()
    stubs["sglang"]._specdiag_stub = True
    sys.modules.update({k: v for k, v in stubs.items() if k not in sys.modules})
    mod = None
    for f in SGLANG_FILES[::-1]:  # score_mod, decode_attention, then the kernel that imports them
        name = f[: -len(".py")].replace("/", ".")
        spec = importlib.util.spec_from_file_location(name, folder / f)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    _loaded[key] = mod
    return mod


def sglang_provenance(source: str | Path | None = None) -> dict:
    """Where the kernel came from and the sha256 of each file, for a recording's metadata."""
    src = Path(source) if source is not None else sglang_source()
    folder = _folder(src)
    return dict(
        version=SGLANG_VERSION,
        source=src.name,
        sha256={f.rsplit("/", 1)[1]: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in SGLANG_FILES},
    )


def sglang_tile(capability: tuple[int, int], lq: int = MLA_HEAD_DIM, lv: int = MLA_V_DIM, source=None) -> dict:
    """The tile sglang's extend kernel uses on a CUDA GPU of ``capability``, read from its own
    source (its block-size rule, run with the capability set for the call and restored after)."""
    mod = load_sglang_extend(source)
    had = "CUDA_CAPABILITY" in vars(mod)
    saved = mod._is_cuda, vars(mod).get("CUDA_CAPABILITY")
    try:
        mod._is_cuda, mod.CUDA_CAPABILITY = True, tuple(capability)
        _, _, _, block_m, block_n, warps = mod._get_block_sizes_for_extend_attention(lq, lv)
    finally:
        mod._is_cuda = saved[0]
        if had:
            mod.CUDA_CAPABILITY = saved[1]
        else:
            del mod.CUDA_CAPABILITY
    return dict(block_m=block_m, block_n=block_n, num_warps=warps)


def sglang_target_verify(
    mod, q, k_ext, v_ext, o, kv_buffer, indptrs, kv_indices, custom_mask, nodes: int, sm_scale: float, lse=None
):
    """sglang's ``extend_attention_fwd`` (``mod``: ``load_sglang_extend()``) called as its Triton
    backend calls it in target-verify for an MLA layer: q [B T, H, 576]; k_ext / v_ext the draft
    tokens' latents [B T, 1, 576] / [B T, 1, 512]; o [B T, H, 512] written; kv_buffer [slots, 1,
    576] with V its first 512 columns; ``indptrs`` = (qo_indptr, kv_indptr, mask_indptr);
    page_size=1 ``kv_indices``; the flat ``custom_mask``; ``nodes`` draft tokens per request;
    ``is_causal=True``, unit KV scales, the default ``skip_prefix_custom_mask=True``; ``lse``
    [B T, H] written when given."""
    qo_indptr, kv_indptr, mask_indptr = indptrs
    mod.extend_attention_fwd(
        q,
        k_ext,
        v_ext,
        o,
        kv_buffer,
        kv_buffer[..., :MLA_V_DIM],
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        True,
        mask_indptr,
        nodes,
        1.0,
        1.0,
        sm_scale,
        lse_extend=lse,
    )
    return o


class SglangExtend:
    """The real sglang kernel on one verify batch, its engine tensors built once; ``run()`` calls it.

    Takes the workbook's layout (``tree_verify_attention_ref``'s arguments) and lays it out as the
    engine does: the pool as a [slots, 1, 576] token buffer (page_size=1), each request's prefix
    as slot ids, the tree nodes' latents as ``k_extend`` and the [T, prefix + T] uint8 mask.
    ``run()`` returns ``out`` [B, T, H, 512] and ``lse`` [B, T, H] like the reference.
    """

    def __init__(self, q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, source=None):
        if q.shape[-1] != MLA_HEAD_DIM:
            raise ValueError(f"q must have head dim {MLA_HEAD_DIM} (512 latent + 64 rope), got {q.shape[-1]}")
        from .triton_extend import prepare_extend_inputs

        self.mod = load_sglang_extend(source)
        prep = prepare_extend_inputs(q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask)
        b, t, h = prep["shape"]
        self.shape, self.batched, self.scale = (b, t, h), prep["batched"], float(scale)
        self.q, self.k_ext = prep["q_extend"], prep["k_extend"].unsqueeze(1)  # [B T, 1, 576]
        self.v_ext = self.k_ext[..., :MLA_V_DIM].contiguous()
        self.buf = prep["k_buffer"].unsqueeze(1)  # [slots, 1, 576]
        self.indptrs = tuple(prep[k].to(torch.int32) for k in ("qo_indptr", "kv_indptr")) + (prep["mask_indptr"],)
        self.kv_indices, self.custom_mask = prep["kv_indices"], prep["custom_mask"]
        self.o = torch.empty(b * t, h, MLA_V_DIM, dtype=q.dtype, device=q.device)
        self.lse = torch.empty(b * t, h, dtype=torch.float32, device=q.device)

    def run(self):
        sglang_target_verify(
            self.mod, self.q, self.k_ext, self.v_ext, self.o, self.buf, self.indptrs, self.kv_indices,
            self.custom_mask, self.shape[1], self.scale, self.lse,
        )  # fmt: skip
        b, t, h = self.shape
        out, lse = self.o.view(b, t, h, MLA_V_DIM), self.lse.view(b, t, h)
        return (out, lse) if self.batched else (out[0], lse[0])


def flashmla_missing() -> str | None:
    """Why FlashMLA's SM90 dense decode cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return "FlashMLA's dense decode is built for sm_90 only"
    try:
        import flash_mla
    except ImportError as e:
        return f"flash_mla is not installed ({e}); it is the sgl-flash-mla wheel"
    if not flash_mla.has_legacy():
        return "this flash_mla build has no legacy (SM90 dense) kernels"
    return None


class FlashMLAPrefix:
    """FlashMLA over each request's prefix (no tree block): bf16 ``q`` [B, T, H, 576], ``kv_pool``
    [pages, 64, 576], int32 ``page_table`` [B, max_pages] and ``prefix_lens`` [B] on the GPU;
    ``run()`` returns ``out`` [B, T, H, 512] and ``lse`` [B, T, H] over the prefix keys alone.
    The scheduler metadata is made by the first ``run()`` and reused."""

    def __init__(self, q, kv_pool, page_table, prefix_lens, scale):
        why = flashmla_missing()
        if why:
            raise RuntimeError(why)
        import flash_mla

        if kv_pool.shape[1] != 64:
            raise ValueError(f"FlashMLA's dense decode needs page size 64, got {kv_pool.shape[1]}")
        self.fm, self.scale = flash_mla, float(scale)
        self.q = q if q.dim() == 4 else q.unsqueeze(0)
        self.cache = kv_pool.view(kv_pool.shape[0], 64, 1, MLA_HEAD_DIM)
        self.table = page_table.view(self.q.shape[0], -1).to(torch.int32)
        self.lens = prefix_lens.view(-1).to(torch.int32)
        self.meta, _ = flash_mla.get_mla_metadata()

    def run(self):
        out, lse = self.fm.flash_mla_with_kvcache(
            self.q,
            self.cache,
            self.table,
            self.lens,
            MLA_V_DIM,
            self.meta,
            softmax_scale=self.scale,
            causal=False,
            use_legacy=True,
        )
        return out, lse.transpose(1, 2)  # lse [B, H, T] -> [B, T, H]


class FlashMLACascade:
    """FlashMLA's prefix call, the tree block (ancestor mask) in torch, merged by log-sum-exp:
    the tree verify a user could build on FlashMLA today. Same arguments and result as
    ``tree_verify_attention_ref`` (batched), on the GPU, page size 64."""

    def __init__(self, q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale):
        self.prefix = FlashMLAPrefix(q, kv_pool, page_table, prefix_lens, scale)
        self.q, self.scale = self.prefix.q, float(scale)
        self.tree_kv = tree_kv.view(self.q.shape[0], self.q.shape[1], MLA_HEAD_DIM)
        self.hidden = ~tree_mask.view(self.q.shape[0], self.q.shape[1], -1).bool()[:, :, None, :]  # [B, T, 1, T]

    def run(self):
        o1, l1 = self.prefix.run()
        s = torch.einsum("bthd,bnd->bthn", self.q, self.tree_kv).float() * self.scale
        s = s.masked_fill(self.hidden, float("-inf"))
        l2 = torch.logsumexp(s, -1)
        p = torch.exp(s - l2[..., None]).to(self.q.dtype)
        o2 = torch.einsum("bthn,bnd->bthd", p, self.tree_kv[..., :MLA_V_DIM]).float()
        out, lse = merge_partials([o1.float(), o2], [l1, l2])
        return out.to(self.q.dtype), lse


def sparse_indices(page_table, prefix_len: int, page_size: int, pool_rows: int, tree_mask, multiple: int = 128):
    """Each node's keys as rows of ``sparse_kv``'s array (the pool's rows, then the tree's): the
    prefix's pool rows through ``page_table`` [max_pages], then its visible tree nodes
    (``pool_rows + j`` where ``tree_mask`` [T, T] is set), padded with -1 to a multiple of
    ``multiple`` (FlashMLA's sparse prefill takes 128). int32 [T, topk]."""
    t = tree_mask.shape[0]
    dev = tree_mask.device
    tok = torch.arange(prefix_len, device=dev)
    rows = page_table[tok // page_size].long() * page_size + tok % page_size
    topk = max(multiple, -(-(prefix_len + t) // multiple) * multiple)
    idx = torch.full((t, topk), -1, dtype=torch.int32, device=dev)
    idx[:, :prefix_len] = rows.to(torch.int32)
    tree_rows = pool_rows + torch.arange(t, device=dev, dtype=torch.int32)
    idx[:, prefix_len : prefix_len + t] = torch.where(tree_mask.bool(), tree_rows, torch.full_like(tree_rows, -1))
    return idx


def sparse_kv(kv_pool, tree_kv):
    """The pool's rows, then one request's tree rows: [pool rows + T, 1, 576], the key array of
    ``FlashMLASparseVerify`` (one copy per pool, shared by the calls over it)."""
    return torch.cat([kv_pool.reshape(-1, MLA_HEAD_DIM), tree_kv.reshape(-1, MLA_HEAD_DIM)]).unsqueeze(1)


class FlashMLASparseVerify:
    """The whole tree verify of one request through FlashMLA's SM90 sparse prefill: bf16 ``q``
    [1, T, H, 576] (H a multiple of 64), ``kv_pool`` [pages, page_size, 576], int32 ``page_table``
    [1, max_pages], ``prefix_lens`` [1], ``tree_kv`` [1, T, 576], ``tree_mask`` [1, T, T], on the
    GPU; ``kv`` is ``sparse_kv(kv_pool, tree_kv)`` when several calls share a pool (made here
    otherwise). ``run()`` returns ``out`` [1, T, H, 512] and ``lse`` [1, T, H], as the reference."""

    def __init__(self, q, kv_pool, page_table, prefix_lens, tree_kv, tree_mask, scale, kv=None):
        why = flashmla_missing()
        if why:
            raise RuntimeError(why)
        import flash_mla

        q4 = q if q.dim() == 4 else q.unsqueeze(0)
        if q4.shape[0] != 1:
            raise ValueError(f"FlashMLA's sparse prefill takes one request, got a batch of {q4.shape[0]}")
        if q4.shape[2] % 64:
            raise ValueError(f"FlashMLA's sparse prefill takes heads in blocks of 64, got {q4.shape[2]}")
        self.fm, self.scale = flash_mla, float(scale)
        self.q = q4[0].contiguous()  # [T, H, 576]
        self.kv = sparse_kv(kv_pool, tree_kv) if kv is None else kv
        t = self.q.shape[0]
        idx = sparse_indices(
            page_table.view(-1),
            int(prefix_lens.view(-1)[0]),
            kv_pool.shape[1],
            kv_pool.shape[0] * kv_pool.shape[1],
            tree_mask.view(t, t),
        )
        self.idx = idx.view(t, 1, -1)

    def run(self):
        res = self.fm.flash_mla_sparse_fwd(self.q, self.kv, self.idx, self.scale, d_v=MLA_V_DIM, use_legacy=True)
        out, lse = res[0], res[2]  # (out, max_logits, lse), lse in natural log
        return out.unsqueeze(0), lse.unsqueeze(0)
