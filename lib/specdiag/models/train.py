"""Train the target LM and the drafter (reproducible seed; a few minutes on an H200).

    python -m specdiag.models.train --out data/models

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
from .lm import Drafter, DrafterConfig, LMConfig, TargetLM

__all__ = ["TrainSettings", "train", "load_models", "save_model"]


class TrainSettings:
    def __init__(self, seed=0, target_steps=2500, drafter_steps=2500, batch=64, length=1024, pool=2048, lr=2e-3, vocab=64, drafter_length=None):
        drafter_length = min(1024, length) if drafter_length is None else drafter_length
        if drafter_length > length:
            raise ValueError(f"drafter_length {drafter_length} cannot exceed the training length {length}")
        self.seed, self.target_steps, self.drafter_steps = seed, target_steps, drafter_steps
        self.batch, self.length, self.pool, self.lr, self.vocab = batch, length, pool, lr, vocab
        self.drafter_length = drafter_length

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


def train(out_dir, settings: TrainSettings | None = None, device=None, progress=print) -> dict:
    s = settings or TrainSettings()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(s.seed)
    g = torch.Generator(device=dev).manual_seed(s.seed)
    prose = MarkovProse(s.vocab, seed=s.seed)
    t0 = time.time()
    pool = prose.sample_batch(s.pool, s.length, g, device=dev)  # prose sequences, sampled on the device
    log = {"settings": s.to_dict(), "pool_seconds": time.time() - t0, "target_loss": [], "drafter_loss": []}
    amp = dict(device_type="cuda", dtype=torch.bfloat16) if dev.type == "cuda" else dict(device_type="cpu", enabled=False)

    def fit(name, model, steps, inputs_and_targets):
        """AdamW with warm-up + cosine, bf16 autocast on GPU, cross-entropy; losses into the log."""
        opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.01)
        for step in range(steps):
            _schedule(opt, step, steps, s.lr)
            inputs, targets = inputs_and_targets(_batch(pool, s.batch, s.vocab, g))
            with torch.autocast(**amp):
                logits = model(inputs)
            loss = F.cross_entropy(logits.float().reshape(-1, s.vocab), targets.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % 50 == 0 or step == steps - 1:
                log[f"{name}_loss"].append((step, loss.item()))
                if step % 500 == 0:
                    progress(f"{name} step {step}: loss {loss.item():.3f}")

    target = TargetLM(LMConfig(vocab=s.vocab, train_len=s.length)).to(dev)
    fit("target", target, s.target_steps, lambda x: (x[:, :-1], x[:, 1:]))

    drafter = Drafter(DrafterConfig(vocab=s.vocab, train_len=s.drafter_length)).to(dev)
    n = s.drafter_length

    def crop(x):  # a random drafter_length + 1 slice of each row; causal LM within the window
        off = int(torch.randint(0, s.length - n, (1,), generator=g, device=dev)) if s.length > n else 0
        x = x[:, off : off + n + 1]
        return x[:, :-1], x[:, 1:]

    fit("drafter", drafter, s.drafter_steps, crop)
    log["seconds"] = time.time() - t0
    log["device"] = str(dev)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_model(target, out / "target.pt")
    save_model(drafter, out / "drafter.pt")
    try:
        from ..bench import machine_metadata

        log["machine"] = machine_metadata()
    except Exception:  # pragma: no cover
        pass
    (out / "train_log.json").write_text(json.dumps(log, indent=1))
    return log


def save_model(model, path) -> None:
    torch.save({"config": model.cfg.to_dict(), "kind": type(model).__name__, "state": {k: v.half() for k, v in model.state_dict().items()}}, path)


def load_models(folder, device="cpu") -> tuple[TargetLM, Drafter]:
    folder = Path(folder)
    models = []
    for name, cls, cfg_cls in (("target.pt", TargetLM, LMConfig), ("drafter.pt", Drafter, DrafterConfig)):
        p = folder / name
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found: train with `python -m specdiag.models.train --out {folder}`")
        blob = torch.load(p, map_location="cpu", weights_only=True)
        m = cls(cfg_cls(**blob["config"]))
        m.load_state_dict({k: v.float() for k, v in blob["state"].items()})
        models.append(m.to(device).eval())
    return models[0], models[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.models.train")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-steps", type=int, default=2500)
    ap.add_argument("--drafter-steps", type=int, default=2500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--length", type=int, default=1024, help="target's training length")
    ap.add_argument("--drafter-length", type=int, default=None, help="default: min(1024, --length)")
    a = ap.parse_args(argv)
    log = train(a.out, TrainSettings(seed=a.seed, target_steps=a.target_steps, drafter_steps=a.drafter_steps, batch=a.batch, length=a.length, lr=a.lr, drafter_length=a.drafter_length))
    print(f"done in {log['seconds']:.0f} s: target loss {log['target_loss'][-1][1]:.3f}, drafter loss {log['drafter_loss'][-1][1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
