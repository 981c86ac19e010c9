"""Recorded measurements in ``data/`` (with machine metadata), so notebooks render without a GPU,
and the one rule every notebook follows: measure here, or show the recording."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from .machine import describe_machine, gpu_available, machine_metadata

__all__ = [
    "data_dir",
    "load_json",
    "save",
    "measure_or_load",
    "MEASURE_CHOICES",
    "provenance",
    "sweep_frame",
    "describe_machine",
    "gpu_available",
]

MEASURE_CHOICES = ("auto", "always", "never")


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


def save(path: str | Path, kind: str, payload: dict) -> Path:
    """Write a result document: ``kind``, this machine's metadata, then ``payload``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"kind": kind, "machine": machine_metadata(), **payload}
    path.write_text(json.dumps(doc, indent=1, default=float))
    return path


def measure_or_load(
    measure: str,
    recorded: str,
    run: Callable[[], dict],
    *,
    available: Callable[[], bool] = gpu_available,
    needs: str = "a CUDA GPU",
) -> dict:
    """A notebook's data: ``run()`` here when ``measure`` is "always", or "auto" and ``available()``;
    else the recording ``data/<recorded>``. Prints which, and from which machine; the document
    gets ``source`` ("measured" or "recorded")."""
    if measure not in MEASURE_CHOICES:
        raise ValueError(f"measure must be one of {MEASURE_CHOICES}, got {measure!r}")
    here = measure != "never" and available()
    if measure == "always" and not here:
        raise RuntimeError(f"measure='always' needs {needs}; there is none here")
    if here:
        doc = run()
        doc.setdefault("machine", machine_metadata())
        doc["source"] = "measured"
        print("measured now on:", describe_machine(doc["machine"]))
        return doc
    doc = load_json(recorded)
    doc["source"] = "recorded"
    where = describe_machine(doc["machine"]) if "machine" in doc else doc.get("recorded_utc", "date unknown")
    print(
        f"not measured here (that needs {needs}, or measure='never' "
        f"was asked): the recording data/{recorded}, made on: {where}"
    )
    if doc.get("partial"):
        done, of = doc["partial"]["contexts_done"], doc["partial"]["contexts"]
        print(f"  that recording was cut off: {len(done)} of {len(of)} contexts ({', '.join(map(str, done))})")
    return doc


def provenance(doc: dict) -> str:
    """One line for a figure: measured here or recorded, on which GPU, on which date."""
    m = doc.get("machine", {})
    when = (m.get("recorded_utc") or doc.get("recorded_utc") or "date unknown")[:10]
    how = "measured now" if doc.get("source") == "measured" else "recorded"
    part = doc.get("partial")
    cut = f", cut off after {len(part['contexts_done'])} of {len(part['contexts'])} contexts" if part else ""
    return f"{how} on {m.get('gpu', 'an unknown machine')}, {when}{cut}"


def sweep_frame(doc: dict):
    import pandas as pd

    return pd.DataFrame(doc["rows"])
