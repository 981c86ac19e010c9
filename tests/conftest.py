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


def _has_sass_tools() -> tuple[bool, bool]:
    """(nvcc on PATH, nvcc and cuobjdump: SASS can be built and read)."""
    import shutil

    from specdiag import kernels

    nvcc = shutil.which("nvcc") is not None
    return nvcc, nvcc and kernels.find_cuobjdump() is not None


HAS_NVCC, HAS_SASS = _has_sass_tools()


def pytest_collection_modifyitems(config, items):
    skips = {
        "gpu": (HAS_GPU, "needs a CUDA GPU"),
        "nvcc": (HAS_NVCC, "nvcc not on PATH"),
        "sass": (HAS_SASS, "needs nvcc and cuobjdump"),
    }
    for item in items:
        for marker, (have, reason) in skips.items():
            if marker in item.keywords and not have:
                item.add_marker(pytest.mark.skip(reason=reason))
