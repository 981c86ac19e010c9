"""Recorded measurements in ``data/`` (with machine metadata), so notebooks render without a GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["data_dir", "load_json", "gpu_available", "describe_machine", "sweep_frame", "choose_source"]


def data_dir() -> Path:
    env = os.environ.get("SPECDIAG_DATA")
    if env:
        return Path(env)
    for cand in (Path(__file__).resolve().parents[2] / "data", Path.cwd() / "data"):
        if cand.is_dir():
            return cand
    raise FileNotFoundError("no data/ folder found; set SPECDIAG_DATA to the workbook's data folder")


def load_json(name: str) -> dict:
    p = Path(name) if Path(name).is_absolute() else data_dir() / name
    if not p.is_file():
        raise FileNotFoundError(f"recorded data {p} not found")
    return json.loads(p.read_text())


def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def choose_source(measure: str) -> str:
    """'measure' or 'recorded' from a notebook's ``measure`` parameter ('auto', 'always', 'never')."""
    if measure not in ("auto", "always", "never"):
        raise ValueError(f"measure must be 'auto', 'always' or 'never', got {measure!r}")
    if measure == "always" and not gpu_available():
        raise RuntimeError("measure='always' needs a CUDA GPU; torch sees none")
    return "measure" if measure == "always" or (measure == "auto" and gpu_available()) else "recorded"


def describe_machine(meta: dict) -> str:
    keys = ("gpu", "device", "sm_count", "driver", "cuda_runtime", "torch", "triton", "pycuda", "recorded_utc")
    return ", ".join(f"{k}={meta[k]}" for k in keys if meta.get(k) is not None)


def sweep_frame(doc: dict):
    import pandas as pd

    df = pd.DataFrame(doc["rows"])
    if "skipped" not in df:
        df["skipped"] = None
    return df
