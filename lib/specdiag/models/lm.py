"""A small target LM and a small drafter LM, with RoPE + YaRN and KV caches.

Target: a pre-LN decoder-only transformer with rotary positions. ``forward_tree`` runs the
DDTree verify pass: the tree's tokens at positions ``start + depth`` attend to the whole cached
prefix and, inside the tree, only to their ancestors.

Drafters, both with **sliding-window attention** (they only ever see the last ``window``
tokens, in training and in their *draft KV cache*) and a ``draft`` call that returns ``block``
per-position distributions, the input DDTree needs:

* ``BlockDrafter`` (the shipped one): DFlash-style, all ``block`` distributions from **one**
  block pass over the cached window (``BlockHead``: mask queries with per-slot copy heads);
* ``Drafter``: its encoder on its own, drafting autoregressively along its greedy path
  (``block`` tiny passes, EAGLE-style); kept as the comparison.

YaRN (Peng et al. 2023): frequencies whose wavelength is short compared with the original
training length are kept, long ones are interpolated by ``factor``, with a linear ramp
between, and attention logits are scaled by ``0.1 ln(factor) + 1``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "LMConfig",
    "DrafterConfig",
    "yarn_inv_freq",
    "TargetLM",
    "Drafter",
    "BlockHead",
    "BlockDrafter",
    "KVCache",
    "block_targets",
    "HEAD_PREFIX",
]


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
class DrafterConfig(LMConfig):
    block: int = 8  # positions drafted per call
    window: int = 128  # sliding window over committed tokens


def yarn_inv_freq(
    head_dim: int, base: float, factor: float, original_len: int, beta_fast: float = 32.0, beta_slow: float = 1.0
):
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
    """x [..., S, D] rotated by positions pos [S] (GPT-NeoX half-split layout)."""
    ang = pos.to(inv_freq.dtype)[:, None] * inv_freq[None, :].to(pos.device)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class KVCache:
    """Per-layer K/V [H, S, Dh] lists, appended along S. A block drafter's cache also keeps,
    per cached position, the final hidden state (``feats`` [S, dim]) and the token (``tokens``
    [S]), trimmed with the K/V."""

    def __init__(self, layers: int):
        self.k = [None] * layers
        self.v = [None] * layers
        self.last_logits = None  # the drafter's prediction after the newest cached token
        self.feats = None
        self.tokens = None

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

    def append_feats(self, feats, tokens):
        self.feats = feats if self.feats is None else torch.cat([self.feats, feats])
        self.tokens = tokens if self.tokens is None else torch.cat([self.tokens, tokens])

    def truncate(self, n: int):
        for i in range(len(self.k)):
            if self.k[i] is not None:
                self.k[i], self.v[i] = self.k[i][:, :n], self.v[i][:, :n]
        if self.feats is not None:
            self.feats, self.tokens = self.feats[:n], self.tokens[:n]

    def keep_last(self, n: int):
        for i in range(len(self.k)):
            if self.k[i] is not None:
                self.k[i], self.v[i] = self.k[i][:, -n:], self.v[i][:, -n:]
        if self.feats is not None:
            self.feats, self.tokens = self.feats[-n:], self.tokens[-n:]


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

    @contextmanager
    def yarn_scaled(self, factor: float):
        """Run with YaRN ``factor``, then restore the previous one."""
        saved = self.yarn
        self.set_yarn(factor)
        try:
            yield self
        finally:
            self.set_yarn(saved)

    def forward(self, tokens: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """Training: tokens [B, S] -> logits [B, S, V], causal (within ``window`` tokens if given)."""
        return self.head(self.hidden(tokens, window))

    def hidden(self, tokens: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """The final (layer-normed) hidden states [B, S, dim] that ``forward`` feeds its head."""
        s = tokens.shape[1]
        pos = torch.arange(s, device=tokens.device)
        mask = None
        if window is not None:
            i = torch.arange(s, device=tokens.device)
            mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
        x = self.emb(tokens)
        for blk in self.blocks:
            q, k, v = blk.qkv_heads(x, pos, self.inv_freq)
            scale = self.mscale / math.sqrt(q.shape[-1])
            att = (
                F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
                if mask is None
                else F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            )
            x = blk.finish(x, att)
        return self.ln(x)

    @torch.no_grad()
    def prefill(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        max_scores: int = 1 << 26,
        start_pos: int | None = None,
        return_hidden: bool = False,
    ):
        """tokens [S] appended to ``cache`` (chunked causal prefill); returns the last logits,
        and with ``return_hidden`` also the final hidden states [S, dim] of all the tokens.

        Positions continue from ``start_pos`` (default: the cache's length). Chunks are sized
        so one chunk's mask (chunk x total keys) stays under ``max_scores``.
        """
        out, hidden = None, []
        total = cache.length + tokens.numel()
        chunk = max(64, min(4096, max_scores // max(1, total)))
        offset = 0 if start_pos is None else start_pos - cache.length
        for s0 in range(0, tokens.numel(), chunk):
            piece = tokens[s0 : s0 + chunk]
            start = cache.length
            pos = torch.arange(start + offset, start + offset + piece.numel(), device=tokens.device)
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
            h = self.ln(x[0])
            hidden.append(h)
            out = self.head(h[-1])
        return (out, torch.cat(hidden)) if return_hidden else out

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


class Drafter(TargetLM):
    """Sliding-window drafter LM with a draft KV cache; ``draft`` gives ``block`` distributions."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__(cfg)
        self.window = cfg.window

    def forward(self, tokens: torch.Tensor, window: int | None = None) -> torch.Tensor:
        return super().forward(tokens, window=self.window if window is None else window)

    @torch.no_grad()
    def extend_cache(self, tokens: torch.Tensor, start_pos: int, cache: KVCache) -> None:
        """Append committed ``tokens`` (absolute positions from ``start_pos``), trim to the window."""
        cache.last_logits = self.prefill(tokens, cache, start_pos=start_pos)
        cache.keep_last(self.window)

    @torch.no_grad()
    def draft(self, next_pos: int, cache: KVCache) -> torch.Tensor:
        """Log-probabilities [block, V] for positions next_pos .. next_pos + block - 1.

        Position j's distribution is conditioned on the drafter's own greedy tokens before it;
        the temporary KV of those tokens is dropped afterwards.
        """
        if cache.last_logits is None:
            raise ValueError("the draft cache is empty: extend_cache() with the committed tokens first")
        keep = cache.length
        dev = self.head.weight.device
        logits = cache.last_logits
        out = []
        for j in range(self.cfg.block):
            lp = torch.log_softmax(logits.float(), -1)
            out.append(lp)
            if j + 1 < self.cfg.block:
                tok = lp.argmax().view(1)
                logits = self.prefill(tok.to(dev), cache, start_pos=next_pos + j)
        cache.truncate(keep)
        return torch.stack(out)


HEAD_PREFIX = "block_head."  # a BlockDrafter's state-dict keys that belong to its block head, not its encoder


class BlockHead(nn.Module):
    """The block pass of ``BlockDrafter``: ``block`` mask queries over the context, in one pass.

    The query for slot j (drafting the token j + 1 after the root) is the root's hidden state
    through a per-slot projection. It attends over the context window with **per-slot key
    offsets** (copy heads): the key at context position i is the hidden state at i - 1 - j, the
    value the token at i. A query whose local context matches the one j + 1 tokens before i
    therefore reads the token at i, which is exactly "copy what followed the last time", for
    every slot at once. A learned null key lets a query match nothing (free prose). An MLP over
    [root hidden + slot embedding, attention output] gives the slot's logits.
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        d, h = cfg.dim, cfg.heads
        if d % h:
            raise ValueError(f"dim {d} must divide into {h} heads")
        self.block, self.heads, self.vocab = cfg.block, h, cfg.vocab
        self.slot = nn.Embedding(cfg.block, d)
        self.q = nn.Linear(d, d * cfg.block, bias=False)  # one query projection per slot
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Embedding(cfg.vocab, d)
        self.null_k = nn.Parameter(torch.zeros(h, 1, d // h))
        self.null_v = nn.Parameter(torch.zeros(h, 1, d // h))
        self.ln = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(2 * d, cfg.ffn), nn.GELU(), nn.Linear(cfg.ffn, d))
        self.out = nn.Linear(d, cfg.vocab)

    def forward(self, feats: torch.Tensor, tokens: torch.Tensor, window: int, last_only: bool = False) -> torch.Tensor:
        """feats [b, S, dim] and tokens [b, S] of a context -> logits [b, S, block, V]: row p
        drafts positions p + 1 .. p + block from the window of ``window`` tokens ending at p
        (only the last row, [b, 1, block, V], with ``last_only``)."""
        b, s, d = feats.shape
        if tokens.shape != (b, s):
            raise ValueError(f"tokens {tuple(tokens.shape)} do not match feats {tuple(feats.shape)}")
        h, dh = self.heads, d // self.heads
        rows = feats[:, -1:] if last_only else feats
        r = rows.shape[1]
        q = self.q(rows).view(b, r, self.block, h, dh)
        kb = self.k(feats).view(b, s, h, dh).transpose(1, 2)
        vals = torch.cat([self.null_v.expand(b, h, 1, dh), self.v(tokens).view(b, s, h, dh).transpose(1, 2)], 2)
        p = torch.arange(s - r, s, device=feats.device)[:, None]
        i = torch.arange(s, device=feats.device)[None]
        null = torch.ones(r, 1, dtype=torch.bool, device=feats.device)
        outs = []
        for j in range(self.block):
            keys = torch.cat(
                [self.null_k.expand(b, h, 1, dh), F.pad(kb, (0, 0, 1 + j, 0))[:, :, :s]], 2
            )  # key at i: hidden at i - 1 - j
            mask = (i <= p) & (i >= p - window + 2 + j) & (i >= 1 + j)  # both i and i - 1 - j inside the window
            att = F.scaled_dot_product_attention(
                q[:, :, j].transpose(1, 2), keys, vals, attn_mask=torch.cat([null, mask], 1)
            )
            outs.append(att.transpose(1, 2).reshape(b, r, d))
        o = torch.stack(outs, 2)  # [b, r, block, dim]
        z = torch.cat([(rows[:, :, None] + self.slot.weight).to(o.dtype), o], -1)
        return self.out(self.ln(o + self.mlp(z)))


def block_targets(tokens: torch.Tensor, block: int, ignore_index: int = -100) -> torch.Tensor:
    """tokens [b, S] -> the block head's targets [b, S, block]: row p, slot j is token p + 1 + j
    (``ignore_index`` past the end)."""
    b, s = tokens.shape
    out = torch.full((b, s, block), ignore_index, dtype=tokens.dtype, device=tokens.device)
    for j in range(block):
        out[:, : max(0, s - 1 - j), j] = tokens[:, 1 + j :]
    return out


class BlockDrafter(Drafter):
    """DFlash-style block-parallel drafter: one pass gives the ``block`` per-position distributions.

    A sliding-window causal LM (RoPE + YaRN, the draft KV cache, as in ``Drafter``) encodes the
    committed tokens; the draft cache also keeps each position's final hidden state. ``draft``
    is then a single ``BlockHead`` pass over the cached window: the distributions of all block
    positions at once, none conditioned on the drafter's own guesses (the marginals DDTree's
    tree is built from). The encoder is trained as an LM, the head on top of it
    (``train.train_block_head``).
    """

    def __init__(self, cfg: DrafterConfig):
        super().__init__(cfg)
        self.block_head = BlockHead(cfg)

    def autoregressive(self) -> Drafter:
        """The encoder on its own as an autoregressive ``Drafter`` (a copy of its weights): the
        same LM drafting its block along its own greedy path, for comparison."""
        ar = Drafter(self.cfg).to(self.head.weight.device)
        ar.load_state_dict({k: v for k, v in self.state_dict().items() if not k.startswith(HEAD_PREFIX)})
        ar.window = self.window
        return ar.train(self.training)

    def block_logits(self, tokens: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """Training: tokens [b, S] -> block logits [b, S, block, V] (``block_targets`` are the labels)."""
        w = self.window if window is None else window
        return self.block_head(self.hidden(tokens, window=w), tokens, w)

    @torch.no_grad()
    def extend_cache(self, tokens: torch.Tensor, start_pos: int, cache: KVCache) -> None:
        cache.last_logits, feats = self.prefill(tokens, cache, start_pos=start_pos, return_hidden=True)
        cache.append_feats(feats, tokens)
        cache.keep_last(self.window)

    @torch.no_grad()
    def draft(self, next_pos: int, cache: KVCache) -> torch.Tensor:
        """Log-probabilities [block, V] for positions next_pos .. next_pos + block - 1, from one
        block pass over the cached window (the head uses relative offsets only, so ``next_pos``
        only names the positions)."""
        if cache.feats is None:
            raise ValueError("the draft cache is empty: extend_cache() with the committed tokens first")
        logits = self.block_head(cache.feats[None], cache.tokens[None], self.window, last_only=True)[0, 0]
        return torch.log_softmax(logits.float(), -1)
