"""Synthetic text with known predictability.

* **prose**: an order-2 Markov chain over the vocabulary with peaked but uncertain transitions
  (a stand-in for free prose: locally plausible, not predictable from far context);
* **predictable**: a random segment repeated over and over (a stand-in for boilerplate, code
  or a document quoted back): after the first period every token follows from the context.

Training mixes the two, so the target learns both a prose model and copying (induction).
"""

from __future__ import annotations

import torch

__all__ = ["MarkovProse", "repeated", "add_repeats", "training_batch"]


class MarkovProse:
    def __init__(self, vocab: int = 64, seed: int = 0, temperature: float = 0.6):
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        logits = torch.randn(vocab, vocab, vocab, generator=g) / temperature
        self.probs = torch.softmax(logits, -1)

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        if n < 1:
            raise ValueError("n must be >= 1")
        out = torch.empty(n, dtype=torch.long)
        a, b = torch.randint(0, self.vocab, (2,), generator=generator).tolist()
        for i in range(n):
            c = int(torch.multinomial(self.probs[a, b], 1, generator=generator))
            out[i] = c
            a, b = b, c
        return out

    def sample_batch(self, batch: int, n: int, generator: torch.Generator, device=None) -> torch.Tensor:
        """Vectorised over the batch (the per-token loop is over positions only), on ``device``
        (the generator must live there too)."""
        probs = self.probs.to(device) if device is not None else self.probs
        out = torch.empty(batch, n, dtype=torch.long, device=device)
        a = torch.randint(0, self.vocab, (batch,), generator=generator, device=device)
        b = torch.randint(0, self.vocab, (batch,), generator=generator, device=device)
        for i in range(n):
            c = torch.multinomial(probs[a, b], 1, generator=generator)[:, 0]
            out[:, i] = c
            a, b = b, c
        return out


def repeated(n: int, period: int, vocab: int, generator: torch.Generator, device=None) -> torch.Tensor:
    """A random segment of ``period`` tokens, repeated to length ``n``."""
    if period < 1 or n < 1:
        raise ValueError("period and n must be >= 1")
    seg = torch.randint(0, vocab, (period,), generator=generator, device=device)
    return seg.repeat((n + period - 1) // period)[:n]


def add_repeats(
    x: torch.Tensor, vocab: int, generator: torch.Generator, min_period: int = 8, max_period: int = 96
) -> torch.Tensor:
    """In place: the second half of the rows of ``x`` [B, L] turn into repeats of a random
    segment from a random point in their first half on."""
    batch, length = x.shape
    dev = x.device
    for i in range(batch // 2, batch):
        period = int(torch.randint(min_period, max_period + 1, (1,), generator=generator, device=dev))
        start = int(torch.randint(0, length // 2, (1,), generator=generator, device=dev))
        x[i, start:] = repeated(length - start, period, vocab, generator, dev)
    return x


def training_batch(
    prose: MarkovProse, batch: int, length: int, generator: torch.Generator, min_period: int = 8, max_period: int = 96
) -> torch.Tensor:
    """Half prose, half 'prose then repeats' (the repeat starting at a random point)."""
    return add_repeats(prose.sample_batch(batch, length, generator), prose.vocab, generator, min_period, max_period)
