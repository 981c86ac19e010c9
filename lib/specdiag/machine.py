"""Where a measurement was taken: the machine's metadata, recorded with every result."""

from __future__ import annotations

import datetime as _dt
import platform

__all__ = ["gpu_available", "sm90_available", "machine_metadata", "describe_machine"]


def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def sm90_available() -> bool:
    """Whether torch sees an sm_90 (Hopper) GPU: the Hopper kernels run only there."""
    if not gpu_available():
        return False
    import torch

    return torch.cuda.get_device_capability() == (9, 0)


def machine_metadata() -> dict:
    import torch

    meta = {
        "recorded_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": platform.node(),
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    try:
        import pycuda

        meta["pycuda"] = getattr(pycuda, "VERSION_TEXT", None)
    except ImportError:
        meta["pycuda"] = None
    try:  # which kernel sources and launch plan the numbers come from (specdiag.kernels.sources_digest)
        from .kernels import sources_digest

        meta["native_digest"] = sources_digest()
    except OSError:  # pragma: no cover - an install without its sources
        meta["native_digest"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta.update(
            gpu=p.name,
            sm_count=p.multi_processor_count,
            l2_bytes=getattr(p, "L2_cache_size", None),
            memory_bytes=p.total_memory,
            capability=f"{p.major}.{p.minor}",
            cuda_runtime=torch.version.cuda,
        )
        try:
            import pynvml

            pynvml.nvmlInit()
            meta["driver"] = pynvml.nvmlSystemGetDriverVersion()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            meta["power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
        except Exception as e:  # pragma: no cover - machine dependent
            meta["driver"] = f"unavailable ({type(e).__name__})"
    return meta


def describe_machine(meta: dict) -> str:
    keys = (
        "gpu",
        "device",
        "sm_count",
        "driver",
        "cuda_runtime",
        "torch",
        "triton",
        "pycuda",
        "native_digest",
        "recorded_utc",
    )
    return ", ".join(f"{k}={meta[k]}" for k in keys if meta.get(k) is not None)
