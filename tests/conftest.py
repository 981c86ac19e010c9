"""Test setup: Triton's CPU interpreter unless a GPU is present; headless matplotlib."""

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


HAS_GPU = _has_gpu()
if not HAS_GPU:
    # must be set before triton is imported anywhere
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
