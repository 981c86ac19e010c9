"""``specdiag record``: re-record every measurement the notebooks show, on this GPU, in one command.

Each step is one recorder (a module's command line) writing one file of ``data/`` (named with a
tag for this GPU, ``h200`` on an H200); ``--only`` picks steps by name. Each runs in its own
process; a failed step is reported and the others still run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .attention.registry import KERNELS

__all__ = ["Step", "steps", "gpu_tag", "record"]


@dataclass(frozen=True)
class Step:
    name: str
    what: str
    argv: tuple[str, ...]  # after ``python -m``
    out: str  # the file it writes, under the data folder


def _check_file(kernel: str, tag: str) -> str:
    return f"native_check_{tag}.json" if kernel == "mma" else f"native_check_{kernel}_{tag}.json"


def steps(tag: str, data: Path, models: bool = False) -> list[Step]:
    """The recorders, in the order the notebooks use them; the models' training only with ``models``."""
    d = lambda name: str(data / name)  # noqa: E731
    out = [
        Step(f"check-{k}", f"{k} against float64", ("specdiag.bench", "check", "--impl", k), _check_file(k, tag))
        for k in KERNELS
    ]
    out += [
        Step(
            "sweep",
            "the context sweep (03, 05)",
            ("specdiag.bench", "sweep", "--impls", "native_auto,native_auto_ps1,native,triton,torch"),
            f"context_sweep_{tag}.json",
        ),
        Step("peers", "beside FlashMLA and sglang (03, 05, 06)", ("specdiag.bench", "peers"), f"peers_{tag}.json"),
        Step(
            "portable",
            "the kernel auto runs on sm_120, timed here (05, 06)",
            ("specdiag.bench", "sweep", "--impls", f"{KERNELS['mma_small'].label}_ps1,native_auto_ps1")
            + ("--contexts", "32768,65536,185000", "--heads", "8,64", "--trees", "9,65"),
            f"mma_small_{tag}.json",
        ),
        Step(
            "trace",
            "the seesaw kernel's per-tile timeline, one math stage left out at a time (05)",
            ("specdiag.bench", "trace", "--page-sizes", "1", "--defines", "TV_SKIP=1;TV_SKIP=2;TV_SKIP=4;TV_SKIP=3"),
            f"trace_seesaw_stages_{tag}.json",
        ),
        Step(
            "stalls",
            "where the seesaw kernel's warps wait, ncu's stall sampling (05)",
            ("specdiag.bench", "stalls"),
            f"ncu_stalls_seesaw_{tag}.json",
        ),
        Step("engine", "the engine adapter (06)", ("specdiag.bench", "engine"), f"engine_{tag}.json"),
        Step("ablate", "stages left out (05)", ("specdiag.bench", "ablate"), f"native_ablation_{tag}.json"),
        Step("tune", "split counts (the plan's fit)", ("specdiag.bench", "tune"), f"native_tune_{tag}.json"),
        Step("sanitize", "compute-sanitizer", ("specdiag.bench", "sanitize"), f"sanitizer_{tag}.json"),
        Step("probes", "NVML, GPM and ncu (02)", ("specdiag.probes.study",), f"probes_{tag}.json"),
    ]
    if models:
        train = "specdiag.models.train"
        out += [
            Step("train", "target (1k, then 16k) and drafter (01)", (train, "--extend-length", "16384"), "models"),
            Step(
                "train-64k",
                "a 64k stage for the target (01)",
                (
                    train,
                    "--extend-from",
                    d("models"),
                    "--extend-length",
                    "65536",
                    "--extend-steps",
                    "1000",
                    "--extend-batch",
                    "4",
                    "--extend-lr",
                    "3e-4",
                ),
                "models",
            ),  # fmt: skip
            Step("train-block", "the drafter's block head (01)", (train, "--block-from", d("models")), "models"),
            Step(
                "specdec",
                "drafter validation (01)",
                ("specdiag.models.specdec", "--models", d("models")),
                f"drafter_validation_{tag}.json",
            ),
        ]
    return out


def gpu_tag() -> str:
    """A short name for this GPU: its model's last word, lower case (``NVIDIA H200`` -> ``h200``)."""
    import torch

    name = torch.cuda.get_device_name(0)
    return re.sub(r"[^a-z0-9]+", "", name.split()[-1].lower()) or "gpu"


def record(data: Path, only=(), tag: str | None = None, models: bool = False, progress=print) -> list[dict]:
    """Run the chosen steps; one row per step: name, file, exit code, seconds."""
    from .machine import gpu_available

    if not gpu_available():
        raise RuntimeError("record needs a CUDA GPU (without one the notebooks show the recordings in data/)")
    tag = tag or gpu_tag()
    todo = steps(tag, data, models)
    if only:
        unknown = sorted(set(only) - {s.name for s in todo})
        if unknown:
            raise ValueError(f"unknown step(s) {', '.join(unknown)}; the steps: {', '.join(s.name for s in todo)}")
        todo = [s for s in todo if s.name in only]
    data.mkdir(parents=True, exist_ok=True)
    rows = []
    for s in todo:
        t0 = time.time()
        progress(f"[{s.name}] {s.what} -> {data / s.out}")
        rc = subprocess.call([sys.executable, "-m", *s.argv, "--out", str(data / s.out)])
        rows.append(dict(step=s.name, file=str(data / s.out), exit_code=rc, seconds=round(time.time() - t0, 1)))
        progress(f"[{s.name}] {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {rows[-1]['seconds']} s")
    return rows
