"""Train the target LM and the drafter (reproducible seed; a few minutes on an H200).

    python -m specdiag.models.train --out data/models --extend-length 16384
    python -m specdiag.models.train --out data/models --extend-from data/models \
        --extend-length 65536 --extend-steps 1000 --extend-batch 4 --extend-lr 3e-4

    python -m specdiag.models.train --out data/models --block-from data/models

(the shipped models: the second command continues the 16k target at 64k, drafter unchanged;
the third trains the drafter's block head on its frozen encoder, target unchanged. ``train``
alone runs every stage: target, drafter encoder, block head)

The target is trained the way long-context models are: a short-context stage (``--length``)
in which it learns prose and copying, then a long-context stage (``--extend-length``, fewer
and longer sequences, lower learning rate) after which its ``train_len`` (YaRN's reference
length) is the extended one; beyond it YaRN stretches the rotary frequencies. Training at the
long length from scratch does not work at this size: with the few sequences per step that
fit, the copy (induction) circuit never forms.

writes ``target.pt`` / ``drafter.pt`` (fp16 state dicts + configs, about 1 MB each) and
``train_log.json`` (loss curves, settings, machine). ``load_models(folder)`` reads them back.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .corpus import MarkovProse, add_repeats
from .lm import HEAD_PREFIX, BlockDrafter, Drafter, DrafterConfig, LMConfig, TargetLM, block_targets

__all__ = [
    "TrainSettings",
    "train",
    "extend_target",
    "train_block_head",
    "previous_log",
    "training_stages",
    "load_models",
    "save_model",
]

_DRAFTERS = {"Drafter": Drafter, "BlockDrafter": BlockDrafter}


class TrainSettings:
    def __init__(
        self,
        seed=0,
        target_steps=2500,
        drafter_steps=4000,
        batch=64,
        length=1024,
        pool=2048,
        lr=2e-3,
        vocab=64,
        drafter_length=None,
        extend_length=None,
        extend_steps=2400,
        extend_batch=16,
        extend_pool=128,
        extend_lr=5e-4,
        block_steps=1000,
        block_lr=2e-3,
    ):
        drafter_length = min(1024, length) if drafter_length is None else drafter_length
        if drafter_length > length:
            raise ValueError(f"drafter_length {drafter_length} cannot exceed the training length {length}")
        if extend_length is not None and extend_length <= length:
            raise ValueError(f"extend_length {extend_length} must exceed the training length {length}")
        if extend_length is not None and (extend_steps < 1 or extend_batch < 1 or extend_pool < 1):
            raise ValueError("extend_steps, extend_batch and extend_pool must be >= 1")
        if block_steps < 1:
            raise ValueError(f"block_steps must be >= 1, got {block_steps}")
        self.seed, self.target_steps, self.drafter_steps = seed, target_steps, drafter_steps
        self.batch, self.length, self.pool, self.lr, self.vocab = batch, length, pool, lr, vocab
        self.drafter_length = drafter_length
        self.extend_length, self.extend_steps, self.extend_batch = extend_length, extend_steps, extend_batch
        self.extend_pool, self.extend_lr = extend_pool, extend_lr
        self.block_steps, self.block_lr = block_steps, block_lr

    def to_dict(self):
        return dict(vars(self))


def _batch(pool: torch.Tensor, batch: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Pool rows (prose); half of them turn into repeats (``corpus.add_repeats``)."""
    idx = torch.randint(0, pool.shape[0], (batch,), generator=g, device=pool.device)
    return add_repeats(pool[idx].clone(), vocab, g)


def _schedule(opt, step, total, lr):
    warm = max(1, total // 20)
    f = step / warm if step < warm else 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))
    for grp in opt.param_groups:
        grp["lr"] = lr * f


class _Run:
    """Device, seeded generator, prose source and short-row pool of one training run."""

    def __init__(self, s: TrainSettings, device, progress):
        self.s, self.progress = s, progress
        self.dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch.manual_seed(s.seed)
        self.g = torch.Generator(device=self.dev).manual_seed(s.seed)
        self.prose = MarkovProse(s.vocab, seed=s.seed)
        self.t0 = time.time()
        self.pool = self.prose.sample_batch(
            s.pool, s.length, self.g, device=self.dev
        )  # prose sequences, sampled on the device
        self.log = {"settings": s.to_dict(), "pool_seconds": time.time() - self.t0}
        self.amp = (
            dict(device_type="cuda", dtype=torch.bfloat16)
            if self.dev.type == "cuda"
            else dict(device_type="cpu", enabled=False)
        )

    def fit(self, name, params, steps, loss_of, rows=None, batch=None, lr=None, every_other=None):
        """AdamW over ``params`` with warm-up + cosine, bf16 autocast on GPU; ``loss_of(batch)``
        gives the loss of a [B, L] token batch; losses into the log.
        ``every_other`` = (rows, batch): odd steps draw from those instead."""
        rows = self.pool if rows is None else rows
        batch, lr, vocab = batch or self.s.batch, lr or self.s.lr, self.s.vocab
        params = list(params)
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
        self.log[f"{name}_loss"] = []
        for step in range(steps):
            _schedule(opt, step, steps, lr)
            src_rows, src_batch = every_other if every_other is not None and step % 2 else (rows, batch)
            with torch.autocast(**self.amp):
                loss = loss_of(_batch(src_rows, src_batch, vocab, self.g))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            if step % 50 == 0 or step == steps - 1:
                self.log[f"{name}_loss"].append((step, loss.item()))
                if step % 500 == 0:
                    self.progress(f"{name} step {step}: loss {loss.item():.3f}")

    def crop(self, x, n):
        """A random ``n``-token slice of the rows of ``x`` (the same offset for the batch)."""
        length = x.shape[1]
        off = int(torch.randint(0, length - n + 1, (1,), generator=self.g, device=self.dev)) if length > n else 0
        return x[:, off : off + n]

    def fit_lm(self, name, model, steps, length=None, **kw):
        """Causal LM cross-entropy on ``length + 1``-token slices (whole rows by default)."""
        vocab = self.s.vocab

        def loss_of(x):
            if length is not None:
                x = self.crop(x, length + 1)
            logits = model(x[:, :-1])
            return F.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))

        encoder = [p for n, p in model.named_parameters() if not n.startswith(HEAD_PREFIX)]
        self.fit(name, encoder, steps, loss_of, **kw)

    def fit_block(self, drafter: BlockDrafter):
        """The block head on the frozen encoder: each row p of a ``drafter_length`` slice drafts
        tokens p + 1 .. p + block from its window, all rows and slots in one pass."""
        s, n = self.s, self.s.drafter_length

        def loss_of(x):
            x = self.crop(x, n)
            with torch.no_grad():
                feats = drafter.hidden(x, window=drafter.window)
            logits = drafter.block_head(feats, x, drafter.window)
            return F.cross_entropy(
                logits.float().reshape(-1, s.vocab), block_targets(x, drafter.cfg.block).reshape(-1), ignore_index=-100
            )

        self.fit("drafter_block", drafter.block_head.parameters(), s.block_steps, loss_of, lr=s.block_lr)

    def extend(self, target):
        """The long-context stage: long batches alternate with short ones (long-only training at
        this size loses some short-context copying: one wrong token per period at 1k, which
        derails greedy output); afterwards YaRN's reference is the extended length."""
        s = self.s
        long_rows = self.prose.sample_batch(s.extend_pool, s.extend_length, self.g, device=self.dev)
        self.fit_lm(
            "target_extend",
            target,
            s.extend_steps,
            rows=long_rows,
            batch=s.extend_batch,
            lr=s.extend_lr,
            every_other=(self.pool, s.batch),
        )
        target.cfg.train_len = s.extend_length

    def save(self, out_dir, target, drafter) -> dict:
        self.log["seconds"] = time.time() - self.t0
        self.log["device"] = str(self.dev)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_model(target, out / "target.pt")
        save_model(drafter, out / "drafter.pt")
        try:
            from ..machine import machine_metadata

            self.log["machine"] = machine_metadata()
        except Exception:  # pragma: no cover
            pass
        (out / "train_log.json").write_text(json.dumps(self.log, indent=1))
        return self.log


def train(out_dir, settings: TrainSettings | None = None, device=None, progress=print) -> dict:
    s = settings or TrainSettings()
    run = _Run(s, device, progress)
    target = TargetLM(LMConfig(vocab=s.vocab, train_len=s.length)).to(run.dev)
    run.fit_lm("target", target, s.target_steps)
    if s.extend_length is not None:
        run.extend(target)

    drafter = BlockDrafter(DrafterConfig(vocab=s.vocab, train_len=s.drafter_length)).to(run.dev)
    run.fit_lm("drafter", drafter, s.drafter_steps, length=s.drafter_length)
    run.fit_block(drafter)
    return run.save(out_dir, target, drafter)


def previous_log(models_dir):
    """The ``train_log.json`` of a models folder (None if it has none): an extended model's log
    carries the stages before it."""
    p = Path(models_dir) / "train_log.json"
    return json.loads(p.read_text()) if p.is_file() else None


def training_stages(log: dict) -> list[dict]:
    """The stages behind a models folder's ``train_log.json``, oldest first: for each trained
    model ("target", "target_extend", "drafter", "drafter_block": the block head), its sequence
    length and final loss. Follows
    ``extended_from`` back through folders that were extended."""
    older = (log.get("extended_from") or {}).get("log")
    stages = training_stages(older) if older else []
    st = log["settings"]
    lengths = {
        "target": st["length"],
        "target_extend": st.get("extend_length"),
        "drafter": st.get("drafter_length"),
        "drafter_block": st.get("drafter_length"),
    }
    for name in ("target", "target_extend", "drafter", "drafter_block"):
        if log.get(f"{name}_loss"):
            stages.append(
                {
                    "model": name,
                    "length": lengths[name],
                    "steps": log[f"{name}_loss"][-1][0] + 1,
                    "final_loss": log[f"{name}_loss"][-1][1],
                }
            )
    return stages


def extend_target(models_dir, out_dir, settings: TrainSettings, device=None, progress=print) -> dict:
    """One more long-context stage for an already trained target: load ``models_dir``, train the
    target at ``settings.extend_length`` (long batches alternating with short ones, as in
    ``train``), save it with the drafter copied unchanged to ``out_dir``. The drafter is not
    retrained, so its accuracy cannot move with the random stream."""
    s = settings
    if s.extend_length is None:
        raise ValueError("extend_target needs settings.extend_length")
    run = _Run(s, device, progress)
    target, drafter = load_models(models_dir, run.dev)
    if s.extend_length <= target.cfg.train_len:
        raise ValueError(
            f"extend_length {s.extend_length} must exceed the target's training length {target.cfg.train_len}"
        )
    run.log["extended_from"] = {
        "models": str(models_dir),
        "train_len": target.cfg.train_len,
        "log": previous_log(models_dir),
    }
    target.train()
    run.extend(target)
    return run.save(out_dir, target.eval(), drafter)


def train_block_head(models_dir, out_dir, settings: TrainSettings, device=None, progress=print) -> dict:
    """The block stage for an already trained pair: load ``models_dir``, put a fresh
    ``BlockHead`` (seeded) on its drafter's encoder, train the head (``settings.block_steps``
    on ``settings.drafter_length``-token slices; the encoder stays frozen, bit for bit) and save
    the pair to ``out_dir``, the target copied unchanged."""
    run = _Run(settings, device, progress)
    target, old = load_models(models_dir, run.dev)
    if old.cfg.vocab != settings.vocab:
        raise ValueError(f"settings.vocab {settings.vocab} does not match the models' vocabulary {old.cfg.vocab}")
    drafter = BlockDrafter(old.cfg).to(run.dev)
    missing, unexpected = drafter.load_state_dict(old.state_dict(), strict=False)
    if unexpected or any(not k.startswith(HEAD_PREFIX) for k in missing):
        raise ValueError(
            f"{models_dir}: drafter weights do not fit the block drafter's "
            f"encoder (missing {missing}, unexpected {unexpected})"
        )
    run.log["extended_from"] = {
        "models": str(models_dir),
        "train_len": target.cfg.train_len,
        "log": previous_log(models_dir),
    }
    run.fit_block(drafter)
    return run.save(out_dir, target, drafter.eval())


def save_model(model, path) -> None:
    torch.save(
        {
            "config": model.cfg.to_dict(),
            "kind": type(model).__name__,
            "state": {k: v.half() for k, v in model.state_dict().items()},
        },
        path,
    )


def load_models(folder, device="cpu") -> tuple[TargetLM, Drafter]:
    """The target and the drafter of a models folder (the drafter's class from its file: a
    ``BlockDrafter`` or the autoregressive ``Drafter``), in eval mode on ``device``."""
    folder = Path(folder)
    models = []
    for name, classes, cfg_cls in (
        ("target.pt", {"TargetLM": TargetLM}, LMConfig),
        ("drafter.pt", _DRAFTERS, DrafterConfig),
    ):
        p = folder / name
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found: train with `python -m specdiag.models.train --out {folder}`")
        blob = torch.load(p, map_location="cpu", weights_only=True)
        if blob.get("kind") not in classes:
            raise ValueError(f"{p} holds a {blob.get('kind')!r}, expected one of {sorted(classes)}")
        m = classes[blob["kind"]](cfg_cls(**blob["config"]))
        m.load_state_dict({k: v.float() for k, v in blob["state"].items()})
        models.append(m.to(device).eval())
    return models[0], models[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.models.train")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-steps", type=int, default=2500)
    ap.add_argument("--drafter-steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--length", type=int, default=1024, help="target's training length")
    ap.add_argument("--drafter-length", type=int, default=None, help="default: min(1024, --length)")
    ap.add_argument(
        "--extend-length", type=int, default=None, help="long-context stage for the target (none if not given)"
    )
    ap.add_argument("--extend-steps", type=int, default=2400, help="half of them on long sequences, half on short ones")
    ap.add_argument("--extend-batch", type=int, default=16)
    ap.add_argument("--extend-lr", type=float, default=5e-4)
    ap.add_argument(
        "--extend-from",
        default=None,
        help="trained models folder: only run another long-context stage for its target (--extend-length), "
        "drafter copied",
    )
    ap.add_argument("--block-steps", type=int, default=1000, help="steps of the drafter's block head")
    ap.add_argument("--block-lr", type=float, default=2e-3)
    ap.add_argument(
        "--block-from",
        default=None,
        help="trained models folder: only train a block head on its drafter's encoder, target copied",
    )
    a = ap.parse_args(argv)
    if a.extend_from and a.block_from:
        ap.error("--extend-from and --block-from are separate stages: run one, then the other on its output")
    settings = TrainSettings(
        seed=a.seed,
        target_steps=a.target_steps,
        drafter_steps=a.drafter_steps,
        batch=a.batch,
        length=a.length,
        lr=a.lr,
        drafter_length=a.drafter_length,
        extend_length=a.extend_length,
        extend_steps=a.extend_steps,
        extend_batch=a.extend_batch,
        extend_lr=a.extend_lr,
        block_steps=a.block_steps,
        block_lr=a.block_lr,
    )
    if a.block_from:
        log = train_block_head(a.block_from, a.out, settings)
        print(f"done in {log['seconds']:.0f} s: block head loss {log['drafter_block_loss'][-1][1]:.3f}")
        return 0
    if a.extend_from:
        log = extend_target(a.extend_from, a.out, settings)
        print(f"done in {log['seconds']:.0f} s: extended target loss {log['target_extend_loss'][-1][1]:.3f}")
        return 0
    log = train(a.out, settings)
    print(
        f"done in {log['seconds']:.0f} s: target loss {log['target_loss'][-1][1]:.3f}, drafter loss "
        f"{log['drafter_loss'][-1][1]:.3f}, block head loss {log['drafter_block_loss'][-1][1]:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
