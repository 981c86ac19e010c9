"""A small target LM and a DFlash-style block drafter, with RoPE + YaRN and KV caches.

Target: a pre-LN decoder-only transformer with rotary positions. ``forward_tree`` runs the
DDTree verify pass: the tree's tokens at positions ``start + depth`` attend to the whole cached
prefix and, inside the tree, only to their ancestors.

Drafter (DFlash-style, block-parallel): one forward pass turns the last ``window`` committed
tokens (its own sliding-window *draft KV cache*) plus ``block`` mask queries at the next
positions into ``block`` per-position distributions, the input DDTree needs.

YaRN (Peng et al. 2023): frequencies whose wavelength is short compared with the original
training length are kept, long ones are interpolated by ``factor``, with a linear ramp
between, and attention logits are scaled by ``0.1 ln(factor) + 1``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["LMConfig", "DrafterConfig", "yarn_inv_freq", "TargetLM", "Drafter", "KVCache"]


@dataclass
class LMConfig:
    vocab: int = 64
    dim: int = 128
    layers: int = 2
    heads: int = 4
    ffn: int = 512
    rope_base: float = 10000.0
    train_len: int = 512  # original context length (YaRN's reference)
    yarn_factor: float = 1.0

    def to_dict(self):
        return asdict(self)


@dataclass
class DrafterConfig:
    vocab: int = 64
    dim: int = 128
    layers: int = 2
    heads: int = 4
    ffn: int = 512
    block: int = 8  # positions drafted per pass
    window: int = 128  # sliding window over committed tokens
    rotary_frac: float = 0.5  # share of each head's dims that rotate (the rest match content at any distance)
    rope_base: float = 10000.0
    train_len: int = 512
    yarn_factor: float = 1.0

    def to_dict(self):
        return asdict(self)


def yarn_inv_freq(head_dim: int, base: float, factor: float, original_len: int, beta_fast: float = 32.0, beta_slow: float = 1.0):
    """Inverse frequencies after YaRN's 'NTK-by-parts' interpolation, and the logit scale."""
    if head_dim % 2:
        raise ValueError("rotary head dim must be even")
    if factor < 1:
        raise ValueError(f"YaRN factor must be >= 1, got {factor}")
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if factor == 1:
        return inv.float(), 1.0

    def dim_for(rotations):  # dimension index whose wavelength fits `rotations` times in original_len
        return head_dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo = max(math.floor(dim_for(beta_fast)), 0)
    hi = min(math.ceil(dim_for(beta_slow)), head_dim // 2 - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - lo) / max(hi - lo, 1e-3)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: keep the frequency (short wavelengths), 0: interpolate
    inv = inv / factor * (1 - extrapolate) + inv * extrapolate
    return inv.float(), 0.1 * math.log(factor) + 1.0


def apply_rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x [..., S, D] rotated by positions pos [S] (GPT-NeoX half-split layout).

    Partial rotary: only the first ``2 * len(inv_freq)`` dims rotate, the rest pass through.
    """
    rd = 2 * inv_freq.numel()
    ang = pos.to(inv_freq.dtype)[:, None] * inv_freq[None, :].to(pos.device)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2, rest = x[..., : rd // 2], x[..., rd // 2 : rd], x[..., rd:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class KVCache:
    """Per-layer K/V [H, S, Dh] lists, appended along S."""

    def __init__(self, layers: int):
        self.k = [None] * layers
        self.v = [None] * layers
        self.history = None  # the drafter's last few committed tokens (its lag features)

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[1]

    def get(self, layer):
        return self.k[layer], self.v[layer]

    def append(self, layer, k, v):
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=1)
            self.v[layer] = torch.cat([self.v[layer], v], dim=1)

    def keep_last(self, n: int):
        for i in range(len(self.k)):
            if self.k[i] is not None:
                self.k[i], self.v[i] = self.k[i][:, -n:], self.v[i][:, -n:]


class Block(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def qkv_heads(self, x, pos, inv_freq):
        s, d = x.shape[-2], x.shape[-1]
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (*x.shape[:-2], s, self.heads, d // self.heads)
        q, k, v = (t.reshape(shape).transpose(-3, -2) for t in (q, k, v))  # [..., H, S, Dh]
        return apply_rope(q, pos, inv_freq), apply_rope(k, pos, inv_freq), v

    def finish(self, x, att):
        att = att.transpose(-3, -2).reshape(x.shape)
        x = x + self.proj(att)
        return x + self.mlp(self.ln2(x))


def _sdpa(q, k, v, mask, scale_mult):
    scale = scale_mult / math.sqrt(q.shape[-1])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


class TargetLM(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg.dim, cfg.heads, cfg.ffn) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.set_yarn(cfg.yarn_factor)

    def set_yarn(self, factor: float):
        inv, self.mscale = yarn_inv_freq(self.cfg.dim // self.cfg.heads, self.cfg.rope_base, factor, self.cfg.train_len)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.yarn = factor

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Training: tokens [B, S] -> logits [B, S, V], causal."""
        s = tokens.shape[1]
        pos = torch.arange(s, device=tokens.device)
        x = self.emb(tokens)
        for blk in self.blocks:
            q, k, v = blk.qkv_heads(x, pos, self.inv_freq)
            x = blk.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.mscale / math.sqrt(q.shape[-1])))
        return self.head(self.ln(x))

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, cache: KVCache, max_scores: int = 1 << 26) -> torch.Tensor:
        """tokens [S] appended to ``cache`` (chunked causal prefill); returns the last logits.

        Chunks are sized so one chunk's mask (chunk x total keys) stays under ``max_scores``.
        """
        out = None
        total = cache.length + tokens.numel()
        chunk = max(64, min(4096, max_scores // max(1, total)))
        for s0 in range(0, tokens.numel(), chunk):
            piece = tokens[s0 : s0 + chunk]
            start = cache.length
            pos = torch.arange(start, start + piece.numel(), device=tokens.device)
            x = self.emb(piece)[None]
            n = piece.numel()
            for li, blk in enumerate(self.blocks):
                q, k, v = blk.qkv_heads(x, pos, self.inv_freq)
                ck, cv = cache.get(li)
                kk = k[0] if ck is None else torch.cat([ck, k[0]], 1)
                vv = v[0] if cv is None else torch.cat([cv, v[0]], 1)
                mask = torch.ones(n, start + n, dtype=torch.bool, device=tokens.device).tril(diagonal=start)
                x = blk.finish(x, _sdpa(q[0], kk, vv, mask, self.mscale)[None])
                cache.append(li, k[0], v[0])
            out = self.head(self.ln(x[0, -1]))
        return out

    @torch.no_grad()
    def forward_tree(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor, cache: KVCache):
        """Verify pass: logits [N, V] and the tree's per-layer (k, v) for later compaction."""
        n = tokens.numel()
        x = self.emb(tokens)[None]
        new_kv = []
        plen = cache.length
        full = torch.cat([torch.ones(n, plen, dtype=torch.bool, device=tokens.device), tree_mask.to(tokens.device)], 1)
        for li, blk in enumerate(self.blocks):
            q, k, v = blk.qkv_heads(x, positions, self.inv_freq)
            ck, cv = cache.get(li)
            kk = k[0] if ck is None else torch.cat([ck, k[0]], 1)
            vv = v[0] if cv is None else torch.cat([cv, v[0]], 1)
            x = blk.finish(x, _sdpa(q[0], kk, vv, full, self.mscale)[None])
            new_kv.append((k[0], v[0]))
        return self.head(self.ln(x[0])), new_kv


class Drafter(nn.Module):
    """Block-parallel drafter: context window + ``block`` mask queries -> block distributions.

    As in DFlash, the block starts from the last verified token (the root): every mask query
    carries the root's embedding (one table per slot) next to its slot embedding. Each context
    token is embedded with *lag features*, the embeddings of the ``block`` tokens before it
    (one table per lag), so the query for slot j can find, in one attention hop, where the
    root appeared j + 1 tokens earlier, instead of an induction circuit the small model would
    have to discover.
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab + 1, cfg.dim)  # last id is the mask / padding token
        self.lags = nn.Embedding(cfg.block * (cfg.vocab + 1), cfg.dim)
        self.slot = nn.Embedding(cfg.block, cfg.dim)  # which of the block's positions a query drafts
        self.root = nn.Embedding(cfg.block * (cfg.vocab + 1), cfg.dim)  # the root token, per slot
        self.blocks = nn.ModuleList(Block(cfg.dim, cfg.heads, cfg.ffn) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.window = cfg.window
        self.set_yarn(cfg.yarn_factor)

    @property
    def mask_id(self) -> int:
        return self.cfg.vocab

    def set_yarn(self, factor: float):
        rot = int(self.cfg.dim // self.cfg.heads * self.cfg.rotary_frac) // 2 * 2
        inv, self.mscale = yarn_inv_freq(rot, self.cfg.rope_base, factor, self.cfg.train_len)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.yarn = factor

    def _layers(self, ctx_x, ctx_pos, q_x, q_pos, cache: KVCache | None, ctx_mask, write_cache: bool):
        """Context tokens attend causally within the window; queries attend to all context + themselves."""
        for li, blk in enumerate(self.blocks):
            parts_q, parts_k, parts_v = [], [], []
            if ctx_x is not None:
                cq, ck, cv = blk.qkv_heads(ctx_x, ctx_pos, self.inv_freq)
            qq, qk, qv = blk.qkv_heads(q_x, q_pos, self.inv_freq)
            pk, pv = (cache.get(li) if cache is not None else (None, None))
            ks = [t for t in (pk, ck if ctx_x is not None else None) if t is not None]
            vs = [t for t in (pv, cv if ctx_x is not None else None) if t is not None]
            keys = torch.cat(ks + [qk], -2)
            vals = torch.cat(vs + [qv], -2)
            nctx = keys.shape[-2] - qk.shape[-2]
            nq = qq.shape[-2]
            # queries: all context + their own slot only (mask tokens carry no content)
            qmask = torch.zeros(nq, keys.shape[-2], dtype=torch.bool, device=q_x.device)
            qmask[:, :nctx] = True
            qmask[:, nctx:] = torch.eye(nq, dtype=torch.bool, device=q_x.device)
            q_att = _sdpa(qq, keys, vals, qmask, self.mscale)
            if ctx_x is not None:
                c_att = _sdpa(cq, keys[..., :nctx, :], vals[..., :nctx, :], ctx_mask, self.mscale)
                ctx_x = blk.finish(ctx_x, c_att)
                if write_cache and cache is not None:
                    cache.append(li, ck if ck.dim() == 3 else ck[0], cv if cv.dim() == 3 else cv[0])
            q_x = blk.finish(q_x, q_att)
        return q_x

    def embed_context(self, ext: torch.Tensor) -> torch.Tensor:
        """ext [..., block + n]: ``block`` tokens of history then n context tokens -> [..., n, dim]."""
        blk, v1 = self.cfg.block, self.cfg.vocab + 1
        n = ext.shape[-1] - blk
        x = self.emb(ext[..., blk:])
        for k in range(1, blk + 1):
            x = x + self.lags(ext[..., blk - k : blk - k + n] + (k - 1) * v1)
        return x

    def queries(self, root: torch.Tensor) -> torch.Tensor:
        """root [...] token ids -> mask queries [..., block, dim]."""
        blk, v1 = self.cfg.block, self.cfg.vocab + 1
        slots = torch.arange(blk, device=root.device)
        mask = self.emb(torch.full(root.shape + (blk,), self.mask_id, device=root.device))
        return mask + self.slot.weight + self.root(root[..., None] + slots * v1)

    def forward(self, window_tokens: torch.Tensor) -> torch.Tensor:
        """Training: window_tokens [B, block + W] (history, then the context ending at the anchor) -> logits [B, block, V]."""
        b, w = window_tokens.shape[0], window_tokens.shape[1] - self.cfg.block
        dev = window_tokens.device
        ctx_pos = torch.arange(w, device=dev)
        q_pos = torch.arange(w, w + self.cfg.block, device=dev)
        q_x = self.queries(window_tokens[:, -1])
        ctx_mask = torch.ones(w, w, dtype=torch.bool, device=dev).tril()
        out = self._layers(self.embed_context(window_tokens), ctx_pos, q_x, q_pos, None, ctx_mask, False)
        return self.head(self.ln(out))

    # --- inference with a draft KV cache -------------------------------------------------
    @torch.no_grad()
    def extend_cache(self, tokens: torch.Tensor, start_pos: int, cache: KVCache):
        """Append ``tokens`` (absolute positions from ``start_pos``) to the draft cache, then trim to the window.

        Cached keys of earlier tokens are reused as they are: the cache holds per-layer K/V of the
        context tokens computed when they were appended.
        """
        n = tokens.numel()
        dev = tokens.device
        pos = torch.arange(start_pos, start_pos + n, device=dev)
        hist = cache.history if cache.history is not None else torch.full((self.cfg.block,), self.mask_id, dtype=tokens.dtype, device=dev)
        ext = torch.cat([hist, tokens])
        cache.history = ext[-self.cfg.block :]
        x = self.embed_context(ext)
        plen = cache.length
        for li, blk in enumerate(self.blocks):
            q, k, v = blk.qkv_heads(x, pos, self.inv_freq)
            pk, pv = cache.get(li)
            kk = k if pk is None else torch.cat([pk, k], -2)
            vv = v if pv is None else torch.cat([pv, v], -2)
            mask = torch.ones(n, plen + n, dtype=torch.bool, device=dev).tril(diagonal=plen)
            x = blk.finish(x, _sdpa(q, kk, vv, mask, self.mscale))
            cache.append(li, k, v)
        cache.keep_last(self.window)

    @torch.no_grad()
    def draft(self, next_pos: int, cache: KVCache) -> torch.Tensor:
        """Per-position log-probabilities [block, V] for positions next_pos .. next_pos + block - 1."""
        dev = self.slot.weight.device
        q_pos = torch.arange(next_pos, next_pos + self.cfg.block, device=dev)
        if cache.history is None:
            raise ValueError("the draft cache is empty: extend_cache() with the committed tokens first")
        q_x = self.queries(cache.history[-1])
        out = self._layers(None, None, q_x, q_pos, cache, None, False)
        return torch.log_softmax(self.head(self.ln(out)).float(), -1)
