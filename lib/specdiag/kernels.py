"""Load the project's CUDA sources (``kernels/*.cu``) through pycuda, inside PyTorch's context.

* The sources ship as package data (``specdiag._cu``) so a non-editable install finds them.
* pycuda joins the device's *primary* context, the one PyTorch's runtime uses, instead of
  creating its own (no ``pycuda.autoinit``), so torch tensors' pointers are valid in kernels.
* Launches go to torch's current stream: directly when it is the legacy default stream, and
  otherwise through a pycuda stream fenced with events in both directions.
* ``nvcc_check`` compiles a source for a target with ``-Xptxas -v`` and parses the resource
  report (registers, spills, shared memory): usable on machines with nvcc and no GPU.
"""

from __future__ import annotations

import atexit
import importlib.resources
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["kernel_names", "kernel_source", "kernel_path", "kernel_arch", "arch_flags", "nvcc_check", "parse_ptxas", "find_cuobjdump", "sass", "PtxasFunction", "load_module", "launch", "PreparedLaunch", "arg_format"]

_REPO_KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _kernel_dir():
    try:
        d = importlib.resources.files("specdiag._cu")
        if any(p.name.endswith(".cu") for p in d.iterdir()):
            return d
    except (ModuleNotFoundError, FileNotFoundError, TypeError):
        pass
    return _REPO_KERNELS


def kernel_names() -> list[str]:
    """Names (without .cu) of every CUDA source the package ships."""
    return sorted(p.name[:-3] for p in _kernel_dir().iterdir() if p.name.endswith(".cu"))


_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([\w.\-]+)"[ \t]*$', re.M)


def kernel_source(name: str) -> str:
    """The source of ``kernels/<name>.cu`` with the project's own headers (``#include "x.cuh"``
    of a file beside it) pasted in, so it compiles from a string (pycuda) or a lone copy."""
    p = _kernel_dir() / f"{name}.cu"
    if not p.is_file():
        raise FileNotFoundError(f"no CUDA source {name!r}; shipped: {kernel_names()}")
    return _expand_includes(p.read_text(), seen=set())


def _expand_includes(text: str, seen: set[str]) -> str:
    def paste(m: re.Match) -> str:
        header = _kernel_dir() / m.group(1)
        if not header.is_file():
            return m.group(0)  # not ours: leave it to the compiler's include path
        if m.group(1) in seen:
            return f"// {m.group(1)} already included"
        seen.add(m.group(1))
        body = re.sub(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", "", header.read_text(), flags=re.M)
        return f"// ---- begin {m.group(1)} ----\n{_expand_includes(body, seen)}\n// ---- end {m.group(1)} ----"

    return _LOCAL_INCLUDE.sub(paste, text)


def kernel_path(name: str) -> Path:
    """A real file path for the source (copied out of a zipped install if needed)."""
    p = _kernel_dir() / f"{name}.cu"
    if isinstance(p, Path) and p.is_file():
        return p
    tmp = Path(tempfile.mkdtemp(prefix="specdiag-cu-")) / f"{name}.cu"
    tmp.write_text(kernel_source(name))
    return tmp


def kernel_arch(name: str) -> str:
    """The target a source needs: its ``// specdiag-arch: sm_90a`` line, else ``sm_90``.

    Sources using wgmma / setmaxnreg need the architecture-specific ``sm_90a`` target."""
    m = re.search(r"^//\s*specdiag-arch:\s*(sm_\d+a?)\s*$", kernel_source(name), re.M)
    return m.group(1) if m else "sm_90"


def arch_flags(arch: str) -> list[str]:
    """nvcc flags for a target. ``sm_XXa`` uses the -gencode form: with nvcc 13.0 the
    ``-arch=sm_90a`` shorthand also runs a plain sm_90 pass that rejects wgmma."""
    m = re.fullmatch(r"sm_(\d+)(a?)", arch)
    if not m:
        raise ValueError(f"unknown target {arch!r} (expected e.g. sm_90 or sm_90a)")
    if m.group(2):
        return [f"-gencode=arch=compute_{m.group(1)}a,code=sm_{m.group(1)}a"]
    return [f"-arch={arch}"]


@dataclass
class PtxasFunction:
    name: str
    registers: int
    stack_frame: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    wgmma_serialized: bool = False  # ptxas C7514/C7515: it put the wgmma pipeline in program order

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def nvcc_check(name: str, arch: str | None = None, nvcc: str | None = None, extra: tuple[str, ...] = (), source: str | None = None) -> dict[str, PtxasFunction]:
    """Compile ``kernels/<name>.cu`` (or ``source``, a variant of it) to a cubin for ``arch``
    (default: ``kernel_arch``) and parse ptxas' resource report."""
    exe = nvcc or shutil.which("nvcc")
    if exe is None:
        raise FileNotFoundError("nvcc is not on PATH")
    arch = arch or kernel_arch(name)
    with tempfile.TemporaryDirectory() as td:
        src = kernel_path(name)
        if source is not None:
            src = Path(td) / f"{name}.cu"
            src.write_text(source)
        cmd = [exe, *arch_flags(arch), "-cubin", "-O3", "-Xptxas", "-v", "-o", str(Path(td) / "k.cubin"), str(src), *extra]
        res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed for {name}.cu ({arch}):\n{res.stderr}")
    return parse_ptxas(res.stderr)


def find_cuobjdump() -> str | None:
    """cuobjdump from PATH, else the copy Triton's NVIDIA backend ships."""
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(cand) if cand.is_file() else None
    except ImportError:
        return None


def sass(name: str, arch: str | None = None, nvcc: str | None = None) -> str:
    """Disassembly (SASS) of ``kernels/<name>.cu`` built for ``arch`` (default: ``kernel_arch``);
    needs nvcc and cuobjdump."""
    exe = nvcc or shutil.which("nvcc")
    dump = find_cuobjdump()
    if exe is None or dump is None:
        raise FileNotFoundError("sass() needs nvcc and cuobjdump (PATH or Triton's bundled copy)")
    with tempfile.TemporaryDirectory() as td:
        cubin = Path(td) / "k.cubin"
        subprocess.run([exe, *arch_flags(arch or kernel_arch(name)), "-cubin", "-O3", "-o", str(cubin), str(kernel_path(name))], check=True, capture_output=True)
        return subprocess.run([dump, "--dump-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


def parse_ptxas(report: str) -> dict[str, PtxasFunction]:
    funcs: dict[str, PtxasFunction] = {}
    # "(C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized ... in the function 'f'"
    serialized = set(re.findall(r"wgmma\.mma_async instructions are serialized.*?function '([^']+)'", report))
    current = None
    frame = stores = loads = 0
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            frame, stores, loads = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?", line)
        if m and current:
            funcs[current] = PtxasFunction(current, int(m.group(1)), frame, stores, loads, int(m.group(2) or 0), current in serialized)
            current, frame, stores, loads = None, 0, 0, 0
    if not funcs:
        raise RuntimeError(f"no ptxas resource report found in:\n{report}")
    return funcs


# --------------------------------------------------------------------------- runtime (GPU)

_modules: dict[tuple[str, int], object] = {}
_contexts: dict[int, object] = {}
_streams: dict[int, object] = {}


def _primary_context(device_index: int):
    import pycuda.driver as cuda

    if device_index not in _contexts:
        cuda.init()
        ctx = cuda.Device(device_index).retain_primary_context()
        ctx.push()
        _contexts[device_index] = ctx
        atexit.register(_pop_context, ctx)
    return _contexts[device_index]


def _pop_context(ctx) -> None:
    try:
        ctx.pop()
    except Exception:  # interpreter shutdown: the context may already be gone
        pass


def load_module(name: str, device_index: int | None = None, arch: str | None = None):
    """Compile (cached by pycuda) and load ``kernels/<name>.cu`` on a torch device.

    ``arch`` defaults to the device's ``sm_XY``; a source marked for ``sm_XYa`` is built for
    exactly that target and refused on any other device."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("native kernels need a CUDA GPU; torch sees none")
    try:
        from pycuda.compiler import SourceModule
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeError("pycuda is not installed: pip install 'specdiag[gpu]'") from e
    dev = torch.cuda.current_device() if device_index is None else int(device_index)
    key = (name, dev)
    if key not in _modules:
        torch.cuda.init()
        _primary_context(dev)
        major, minor = torch.cuda.get_device_capability(dev)
        need = kernel_arch(name)
        code = None
        if need.endswith("a"):
            if need != f"sm_{major}{minor}a":
                raise RuntimeError(f"{name}.cu is built for {need} only; this GPU is sm_{major}{minor}")
            arch, code = f"compute_{major}{minor}a", need
        elif arch is None:
            arch = f"sm_{major}{minor}"
        _modules[key] = SourceModule(kernel_source(name), arch=arch, code=code, no_extern_c=True, options=["-O3", "-std=c++17"])
    return _modules[key]


def arg_format(args) -> str:
    """The struct format of a kernel's packed parameters: numpy scalars only (``np.uintp`` for
    pointers, ``np.int32``, ``np.float32`` ...), so the layout is explicit."""
    import numpy as np

    fmt = []
    for i, a in enumerate(args):
        if not isinstance(a, np.number):
            raise TypeError(f"kernel argument #{i} is a {type(a).__name__}; pass numpy scalars (np.uintp(tensor.data_ptr()), np.int32, np.float32)")
        fmt.append(a.dtype.char)
    return "".join(fmt)


class PreparedLaunch:
    """One kernel launch, prepared once: arguments packed into pycuda's parameter buffer and
    the dynamic shared-memory limit set at construction, so a call costs one driver launch
    (plus torch's current stream). The plain ``func(*args, ...)`` call re-inspects every
    argument in Python on each launch, which at ~20 arguments costs more host time than a
    short kernel runs. The buffer holds raw pointers: the caller keeps the tensors alive."""

    def __init__(self, func, grid, block, args, shared: int = 0, device_index: int | None = None):
        import torch
        from pycuda._pvt_struct import pack

        self.func, self.grid, self.block, self.shared = func, tuple(int(g) for g in grid), tuple(int(b) for b in block), int(shared)
        self.device = torch.cuda.current_device() if device_index is None else int(device_index)
        self.buf = pack(arg_format(args), *args)
        if self.shared > 48 * 1024:
            import pycuda.driver as cuda

            func.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)

    def __call__(self) -> None:
        _on_torch_stream(self.device, lambda stream: self.func._launch_kernel(self.grid, self.block, self.buf, self.shared, stream))


def _on_torch_stream(dev: int, launch_on) -> None:
    """Run ``launch_on(pycuda_stream)`` ordered on torch's current stream of device ``dev``:
    directly on the default stream, else on a pycuda stream joined to it by events."""
    import torch

    current = torch.cuda.current_stream(dev)
    if current.cuda_stream == 0:
        launch_on(None)
        return
    import pycuda.driver as cuda

    if dev not in _streams:
        _streams[dev] = cuda.Stream()
    ps = _streams[dev]
    ext = torch.cuda.ExternalStream(ps.handle, device=dev)
    before = torch.cuda.Event()
    before.record(current)
    ext.wait_event(before)
    launch_on(ps)
    after = torch.cuda.Event()
    after.record(ext)
    current.wait_event(after)


def launch(func, grid, block, args, shared: int = 0, device_index: int | None = None) -> None:
    """Launch a pycuda function on torch's current stream (prepared each time: for repeated
    launches keep a ``PreparedLaunch``)."""
    PreparedLaunch(func, grid, block, args, shared=shared, device_index=device_index)()
