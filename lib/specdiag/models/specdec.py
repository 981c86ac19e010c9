"""Tree speculative decoding with the small model pair, and the drafter-validation sweep.

One step: drafter per-position distributions -> DDTree tree (``specdiag.tree``) -> one target
verify pass with tree attention -> greedy walk -> commit (accepted drafts + bonus) -> KV
compaction of the accepted path (``compaction_indices`` / ``apply_compaction``).

Faults that a drafter deployment can suffer, injectable to show what a collapse looks like:

* ``broken_window``: the drafter's sliding window shrunk (e.g. 8 tokens instead of 128);
* ``wrong_yarn``: the drafter run with a YaRN factor it was not trained with;
* ``stale_draft_kv``: committed tokens never reach the draft KV cache.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field

import torch

from ..tree import apply_compaction, build_ddtree, compaction_indices, verify_greedy
from .corpus import MarkovProse, repeated
from .lm import BlockDrafter, Drafter, KVCache, TargetLM

__all__ = [
    "Faults",
    "SpecResult",
    "speculative_generate",
    "greedy_generate",
    "make_prompt",
    "validation_sweep",
    "continuation_accuracy",
    "drafter_kind",
    "drafters_of",
    "FAULTS",
]


@dataclass
class Faults:
    broken_window: int | None = None
    wrong_yarn: float | None = None
    stale_draft_kv: bool = False

    @property
    def name(self) -> str:
        parts = []
        if self.broken_window is not None:
            parts.append(f"broken window ({self.broken_window})")
        if self.wrong_yarn is not None:
            parts.append(f"wrong YaRN ({self.wrong_yarn:g})")
        if self.stale_draft_kv:
            parts.append("stale draft KV")
        return " + ".join(parts) or "healthy"


FAULTS = {
    "healthy": Faults(),
    "broken window": Faults(broken_window=8),
    "wrong YaRN": Faults(wrong_yarn=64.0),
    "stale draft KV": Faults(stale_draft_kv=True),
}


@dataclass
class SpecResult:
    tokens: list[int]
    commit_lengths: list[int] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def mean_commit(self) -> float:
        return sum(self.commit_lengths) / max(1, len(self.commit_lengths))


def target_yarn_for(target: TargetLM, context: int) -> float:
    """YaRN for the target, set from the prompt's length (so the output never depends on how
    many tokens are requested): stretch only when the context exceeds the training length."""
    return max(1.0, context / target.cfg.train_len)


def _append_path(cache: KVCache, new_kv, tree, result):
    """Append the tree's KV, move the accepted path into place, drop the rest."""
    plen = cache.length
    for li, (k, v) in enumerate(new_kv):
        cache.append(li, k, v)
    src, dst = compaction_indices(tree, result, prefix_len=plen)
    for li in range(len(new_kv)):
        k, v = cache.get(li)
        apply_compaction(k.transpose(0, 1), src, dst)  # views over [S, H, Dh]: in place
        apply_compaction(v.transpose(0, 1), src, dst)
        cache.k[li], cache.v[li] = k[:, : plen + src.numel()], v[:, : plen + src.numel()]


@torch.no_grad()
def speculative_generate(
    target: TargetLM,
    drafter: Drafter,
    prompt: torch.Tensor,
    new_tokens: int,
    budget: int = 16,
    faults: Faults | None = None,
) -> SpecResult:
    """Greedy tree speculative decoding; the output equals ``greedy_generate`` (lossless)."""
    if prompt.numel() < 2:
        raise ValueError("the prompt needs at least 2 tokens")
    if new_tokens < 1:
        raise ValueError("new_tokens must be >= 1")
    f = faults or Faults()
    dev = target.head.weight.device
    prompt = prompt.to(dev)
    with contextlib.ExitStack() as restore:
        restore.enter_context(target.yarn_scaled(target_yarn_for(target, prompt.numel())))
        if f.broken_window is not None:
            restore.callback(setattr, drafter, "window", drafter.window)
            drafter.window = f.broken_window
        if f.wrong_yarn is not None:
            restore.enter_context(drafter.yarn_scaled(f.wrong_yarn))
        t0 = time.time()
        tcache, dcache = KVCache(len(target.blocks)), KVCache(len(drafter.blocks))
        target.prefill(prompt[:-1], tcache)
        w = min(drafter.window, prompt.numel())
        drafter.extend_cache(prompt[-w:], prompt.numel() - w, dcache)
        n = prompt.numel()  # the root (last committed token) sits at position n - 1
        root = int(prompt[-1])
        res = SpecResult([])
        while len(res.tokens) < new_tokens:
            tree = build_ddtree(drafter.draft(n, dcache).cpu(), budget, root_token=root)
            logits, kv = target.forward_tree(
                tree.tokens.to(dev), tree.position_ids(n - 1).to(dev), tree.ancestor_mask(dev), tcache
            )
            verdict = verify_greedy(tree, logits.float().cpu())
            _append_path(tcache, kv, tree, verdict)
            committed = verdict.committed_tokens
            res.tokens += committed
            res.commit_lengths.append(len(committed))
            if not f.stale_draft_kv:
                drafter.extend_cache(torch.tensor(committed, device=dev), n, dcache)
            n += len(committed)
            root = committed[-1]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        res.seconds = time.time() - t0
        res.tokens = res.tokens[:new_tokens]
        return res


@torch.no_grad()
def greedy_generate(target: TargetLM, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """Plain greedy decoding with a KV cache (one token per target pass)."""
    from ..tree import chain_tree

    dev = target.head.weight.device
    prompt = prompt.to(dev)
    with target.yarn_scaled(target_yarn_for(target, prompt.numel())):
        cache = KVCache(len(target.blocks))
        target.prefill(prompt[:-1], cache)
        out, tok, n = [], int(prompt[-1]), prompt.numel()
        one = chain_tree([], root_token=0)
        for _ in range(new_tokens):
            logits, kv = target.forward_tree(
                torch.tensor([tok], device=dev), torch.tensor([n - 1], device=dev), one.ancestor_mask(dev), cache
            )
            for li, (k, v) in enumerate(kv):
                cache.append(li, k, v)
            tok = int(logits[0].float().argmax())
            out.append(tok)
            n += 1
        return out


def make_prompt(kind: str, length: int, vocab: int = 64, seed: int = 0, period: int = 37) -> torch.Tensor:
    """'predictable' (a segment repeated) or 'prose' (Markov text) of ``length`` tokens."""
    g = torch.Generator().manual_seed(seed)
    if kind == "predictable":
        return repeated(length, period, vocab, g)
    if kind == "prose":
        return MarkovProse(vocab, seed=0).sample(length, g)
    raise ValueError(f"prompt kind must be 'predictable' or 'prose', got {kind!r}")


def drafter_kind(drafter: Drafter) -> str:
    """'block' (one block-parallel pass, DFlash-style) or 'autoregressive' (EAGLE-style)."""
    return "block" if isinstance(drafter, BlockDrafter) else "autoregressive"


def drafters_of(drafter: Drafter, kinds=None) -> dict:
    """The drafters a models folder's drafter offers, by ``drafter_kind``: a ``BlockDrafter`` as
    itself ('block') and its encoder drafting on its own ('autoregressive'); an autoregressive
    ``Drafter`` only as itself. ``kinds`` picks some, in that order (default: all it offers)."""
    offered = {drafter_kind(drafter): drafter}
    if isinstance(drafter, BlockDrafter):
        offered["autoregressive"] = drafter.autoregressive()
    kinds = list(offered) if kinds is None else list(kinds)
    missing = [k for k in kinds if k not in offered]
    if missing:
        raise ValueError(f"{missing} not available from a {type(drafter).__name__}; it offers {list(offered)}")
    return {k: offered[k] for k in kinds}


def validation_sweep(
    target,
    drafter,
    contexts=(1024, 16384, 65536, 131072),
    kinds=("predictable", "prose"),
    faults=FAULTS,
    new_tokens: int = 64,
    budget: int = 16,
    seed: int = 0,
    progress=print,
) -> list[dict]:
    """Mean commit length per (context, text, fault); each row names the drafter's kind."""
    rows = []
    kind_of_drafter = drafter_kind(drafter)
    for ctx in contexts:
        for kind in kinds:
            prompt = make_prompt(kind, ctx, target.cfg.vocab, seed=seed)
            for name, f in faults.items():
                r = speculative_generate(target, drafter, prompt, new_tokens, budget=budget, faults=f)
                rows.append(
                    dict(
                        drafter=kind_of_drafter,
                        context=ctx,
                        text=kind,
                        fault=name,
                        mean_commit=r.mean_commit,
                        steps=len(r.commit_lengths),
                        commit_lengths=r.commit_lengths,
                        seconds=r.seconds,
                        **{"fault_detail": asdict(f)},
                    )
                )
                progress(
                    f"{kind_of_drafter:>14} ctx={ctx:>6} {kind:>11} {name:>15}: mean commit "
                    f"{r.mean_commit:.2f} over {len(r.commit_lengths)} steps ({r.seconds:.1f}s)"
                )
    return rows


def main(argv=None) -> int:
    """python -m specdiag.models.specdec --models data/models --out data/drafter_validation_h200.json"""
    import argparse
    import json
    from pathlib import Path

    from ..machine import machine_metadata
    from .train import load_models

    ap = argparse.ArgumentParser(prog="python -m specdiag.models.specdec")
    ap.add_argument("--models", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="1024,16384,65536,131072")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument(
        "--drafters",
        default="block,autoregressive",
        help="which drafters of the folder to sweep: block (the block drafter as shipped), "
        "autoregressive (its encoder drafting on its own)",
    )
    a = ap.parse_args(argv)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    target, drafter = load_models(a.models, dev)
    contexts = tuple(int(c) for c in a.contexts.split(","))
    try:
        drafters = drafters_of(drafter, [k.strip() for k in a.drafters.split(",") if k.strip()])
    except ValueError as e:
        ap.error(f"--drafters: {e} ({a.models})")
    rows, lossless, accuracy = [], [], []
    for k, d in drafters.items():
        rows += validation_sweep(target, d, contexts=contexts, new_tokens=a.new_tokens, budget=a.budget)
        for ctx in contexts[:2]:
            for kind in ("predictable", "prose"):
                p = make_prompt(kind, ctx, target.cfg.vocab)
                spec = speculative_generate(target, d, p, a.new_tokens, budget=a.budget).tokens
                lossless.append(
                    dict(drafter=k, context=ctx, text=kind, equal=spec == greedy_generate(target, p, a.new_tokens))
                )
                print("lossless", lossless[-1])
        accuracy += continuation_accuracy(target, d, contexts=contexts)
    doc = {
        "kind": "drafter_validation",
        "machine": machine_metadata(),
        "budget": a.budget,
        "new_tokens": a.new_tokens,
        "drafters": list(drafters),
        "rows": rows,
        "lossless": lossless,
        "accuracy": accuracy,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    return 0 if all(x["equal"] for x in lossless) else 1


@torch.no_grad()
def continuation_accuracy(
    target: TargetLM,
    drafter: Drafter,
    contexts=(1024, 4096, 16384),
    kinds=("predictable", "prose"),
    tail: int = 256,
    seed: int = 0,
) -> list[dict]:
    """Each model on its own: teacher-forced next-token accuracy over the last ``tail`` tokens
    of the sweep's prompts (target with the sweep's YaRN; drafter through its window).

    Commit length measures drafter-target *agreement*; this splits it: on predictable text the
    right answer is known, so a drop can be pinned on the model that stops finding it. A block
    drafter is scored on what it drafts: its block head's first slot (``drafter_acc``) and all
    ``block`` slots of the rows whose whole block lies in the tail (``drafter_block_acc``).
    """
    rows = []
    dev = target.head.weight.device
    block = isinstance(drafter, BlockDrafter)
    nb = drafter.cfg.block
    for ctx in contexts:
        for kind in kinds:
            p = make_prompt(kind, ctx, target.cfg.vocab, seed=seed).to(dev)
            with target.yarn_scaled(target_yarn_for(target, ctx)):
                t_pred = target(p[None, :-1])[0, -tail:].argmax(-1)
            d_in = p[-(drafter.window + tail + 1) :]
            truth = p[-tail:]
            row = dict(context=ctx, text=kind, drafter=drafter_kind(drafter))
            if block:
                lg = drafter.block_logits(d_in[None, :-1])[0]  # row r drafts d_in[r + 1 .. r + block]
                d_pred = lg[-tail:, 0].argmax(-1)
                rows_all = lg[-tail : lg.shape[0] - nb + 1].argmax(-1)  # [tail - block + 1, block]
                starts = torch.arange(d_in.numel() - 1 - tail, d_in.numel() - nb, device=dev)
                want = d_in[starts[:, None] + 1 + torch.arange(nb, device=dev)]
                row["drafter_block_acc"] = float((rows_all == want).float().mean())
            else:
                d_pred = drafter(d_in[None, :-1])[0, -tail:].argmax(-1)
            row.update(
                target_acc=float((t_pred == truth).float().mean()),
                drafter_acc=float((d_pred == truth).float().mean()),
                agreement=float((t_pred == d_pred).float().mean()),
                target_yarn=target_yarn_for(target, ctx),
            )
            rows.append(row)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
