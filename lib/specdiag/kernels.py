"""Load the project's CUDA sources (``kernels/*.cu``) through pycuda, inside PyTorch's context.

* The sources ship as package data (``specdiag._cu``) so a non-editable install finds them.
* pycuda joins the device's *primary* context, the one PyTorch's runtime uses, so torch tensors'
  pointers are valid in kernels.
* Launches go to torch's current stream: directly on the legacy default stream, otherwise through
  a pycuda stream fenced with events in both directions.
* Every kernel module exports its launch shape (``tv_config``): ``load_kernel`` reads it from the
  GPU module and ``ptx_config`` from the compiled PTX on a CPU; both are checked against the
  registry row.
* ``nvcc_check`` / ``sass`` compile a source for a target and report ptxas' resources / the
  disassembly: usable on machines with nvcc and no GPU.
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
from typing import Mapping

__all__ = [
    "kernel_names",
    "kernel_source",
    "native_sources",
    "sources_digest",
    "kernel_path",
    "kernel_arch",
    "arch_flags",
    "define_flags",
    "nvcc_check",
    "parse_ptxas",
    "find_cuobjdump",
    "sass",
    "sass_instructions",
    "opcode",
    "ptx_config",
    "module_config",
    "PtxasFunction",
    "KernelConfig",
    "LoadedKernel",
    "load_module",
    "load_kernel",
    "PreparedLaunch",
]

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


def native_sources() -> dict[str, bytes]:
    """What sets a native measurement's numbers besides the machine: the CUDA sources this install
    builds from (``kernels/<file>``) and the launch plan (``lib/specdiag/attention/plan.py``), by
    their paths in the repository."""
    files = {f"kernels/{p.name}": p.read_bytes() for p in _kernel_dir().iterdir() if p.name.endswith((".cu", ".cuh"))}
    files["lib/specdiag/attention/plan.py"] = (Path(__file__).parent / "attention" / "plan.py").read_bytes()
    return files


def sources_digest(files: Mapping[str, bytes] | None = None) -> str:
    """12 hex digits of the sha256 of ``files`` (path -> contents; default ``native_sources()``), in
    path order: recordings carry it (``machine.native_digest``) and
    ``tools/compare_revision/digest.py`` finds the commits whose sources give it."""
    import hashlib

    files = native_sources() if files is None else files
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()[:12]


_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([\w.\-]+)"[ \t]*$', re.M)


def kernel_source(name: str, root: str | Path | None = None) -> str:
    """The source of ``kernels/<name>.cu`` (or ``root/<name>.cu``) with the project's own headers
    (``#include "x.cuh"`` of a file beside it) pasted in, so it compiles from a string (pycuda) or
    a lone copy."""
    d = _kernel_dir() if root is None else Path(root)
    p = d / f"{name}.cu"
    if not p.is_file():
        raise FileNotFoundError(
            f"no CUDA source {name!r}; " + (f"shipped: {kernel_names()}" if root is None else f"not in {d}")
        )
    return _expand_includes(p.read_text(), seen=set(), d=d)


def _expand_includes(text: str, seen: set[str], d) -> str:
    def paste(m: re.Match) -> str:
        header = d / m.group(1)
        if not header.is_file():
            return m.group(0)  # not ours: leave it to the compiler's include path
        if m.group(1) in seen:
            return f"// {m.group(1)} already included"
        seen.add(m.group(1))
        body = re.sub(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", "", header.read_text(), flags=re.M)
        return f"// ---- begin {m.group(1)} ----\n{_expand_includes(body, seen, d)}\n// ---- end {m.group(1)} ----"

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
    return _arch_of(kernel_source(name))


def _arch_of(text: str) -> str:
    m = re.search(r"^//\s*specdiag-arch:\s*(sm_\d+a?)\s*$", text, re.M)
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


def define_flags(defines: Mapping[str, int] | None) -> list[str]:
    """``-DNAME=VALUE`` for each compile-time switch, in a stable order."""
    return [f"-D{k}={int(v)}" for k, v in sorted((defines or {}).items())]


def _compile(
    name: str,
    arch: str | None,
    nvcc: str | None,
    out: str,
    td: str,
    extra=(),
    source: str | None = None,
    defines: Mapping[str, int] | None = None,
    root: str | Path | None = None,
) -> subprocess.CompletedProcess:
    exe = nvcc or shutil.which("nvcc")
    if exe is None:
        raise FileNotFoundError("nvcc is not on PATH")
    src = Path(root) / f"{name}.cu" if root is not None else kernel_path(name)
    if root is not None and not src.is_file():
        raise FileNotFoundError(f"{src}: no such kernel source")
    arch = arch or _arch_of(kernel_source(name, root))
    if source is not None:
        src = Path(td) / f"{name}.cu"
        src.write_text(source)
    suffix = {"ptx": "-ptx", "cubin": "-cubin"}[out]
    cmd = [
        exe,
        *arch_flags(arch),
        suffix,
        "-O3",
        "-std=c++17",
        *define_flags(defines),
        "-o",
        str(Path(td) / f"k.{out}"),
        str(src),
        *extra,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed for {name}.cu ({arch}):\n{res.stderr}")
    return res


def nvcc_check(
    name: str,
    arch: str | None = None,
    nvcc: str | None = None,
    extra: tuple[str, ...] = (),
    source: str | None = None,
    defines: Mapping[str, int] | None = None,
) -> dict[str, "PtxasFunction"]:
    """Compile ``kernels/<name>.cu`` (or ``source``, a variant of it) to a cubin for ``arch``
    (default: ``kernel_arch``) with ``defines`` and parse ptxas' resource report."""
    with tempfile.TemporaryDirectory() as td:
        res = _compile(name, arch, nvcc, "cubin", td, ("-Xptxas", "-v", *extra), source, defines)
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


def sass(
    name: str,
    arch: str | None = None,
    nvcc: str | None = None,
    defines: Mapping[str, int] | None = None,
    root: str | Path | None = None,
) -> str:
    """Disassembly (SASS) of ``kernels/<name>.cu`` (or ``root/<name>.cu``: another revision's
    sources) built for ``arch`` (default: the source's ``specdiag-arch``); needs nvcc and cuobjdump."""
    dump = find_cuobjdump()
    if dump is None:
        raise FileNotFoundError("sass() needs cuobjdump (PATH or Triton's bundled copy)")
    with tempfile.TemporaryDirectory() as td:
        _compile(name, arch, nvcc, "cubin", td, defines=defines, root=root)
        return subprocess.run(
            [dump, "--dump-sass", str(Path(td) / "k.cubin")], capture_output=True, text=True, check=True
        ).stdout


_SASS_LINE = re.compile(r"/\*([0-9a-f]+)\*/\s+(.*?);")


def sass_instructions(text: str) -> list[tuple[int, str]]:
    """A SASS listing's instructions as (address, instruction) pairs, in order."""
    return [(int(a, 16), x) for a, x in _SASS_LINE.findall(text)]


def opcode(instruction: str) -> str:
    """'@!P0 BRA 0x10' -> 'BRA'; 'HGMMA.64x64x16.F32.BF16 R1, ...' -> 'HGMMA'."""
    words = instruction.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


@dataclass(frozen=True)
class KernelConfig:
    """A module's exported launch shape (``TV_EXPORT_CONFIG`` in kernels/tree_verify_params.cuh),
    and whether it reads the host's packed ancestor mask (``VerifyParams::tree_bits``)."""

    threads: int
    rows_per_cta: int
    keys_per_tile: int
    smem_bytes: int
    tree_bits: bool = False

    def check(self, spec) -> "KernelConfig":
        """Raise unless the registry row ``spec`` declares this shape."""
        declared = (spec.threads, spec.rows_per_cta, spec.keys_per_tile, spec.smem_bytes)
        if declared != (self.threads, self.rows_per_cta, self.keys_per_tile, self.smem_bytes):
            raise RuntimeError(
                f"kernels/{spec.source}.cu exports threads, rows, keys, shared bytes = "
                f"{self.threads, self.rows_per_cta, self.keys_per_tile, self.smem_bytes}; "
                f"the registry row {spec.name!r} says {declared}"
            )
        return self


_CONFIG_INTS = 5
_PTX_CONFIG = re.compile(rf"tv_config\[{4 * _CONFIG_INTS}\]\s*=\s*\{{([\d,\s]*)\}}")


def ptx_config(name: str, arch: str | None = None, defines: Mapping[str, int] | None = None) -> KernelConfig:
    """The launch shape ``kernels/<name>.cu`` exports, read from its PTX (nvcc, no GPU)."""
    import struct

    with tempfile.TemporaryDirectory() as td:
        _compile(name, arch, None, "ptx", td, defines=defines)
        ptx = (Path(td) / "k.ptx").read_text()
    m = _PTX_CONFIG.search(ptx)
    if not m:
        raise RuntimeError(f"{name}.cu exports no tv_config (TV_EXPORT_CONFIG)")
    raw = bytes(int(v) for v in m.group(1).replace(" ", "").split(",") if v)
    return _config(struct.unpack(f"<{_CONFIG_INTS}i", raw.ljust(4 * _CONFIG_INTS, b"\0")))


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
            funcs[current] = PtxasFunction(
                current, int(m.group(1)), frame, stores, loads, int(m.group(2) or 0), current in serialized
            )
            current, frame, stores, loads = None, 0, 0, 0
    if not funcs:
        raise RuntimeError(f"no ptxas resource report found in:\n{report}")
    return funcs


# --------------------------------------------------------------------------- runtime (GPU)

_modules: dict[tuple[str, int], object] = {}
_configs: dict[int, KernelConfig] = {}  # id(module) -> what it exports (a module in _modules is never freed)
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


def load_module(name: str, device_index: int | None = None, defines: Mapping[str, int] | None = None):
    """Compile (cached by pycuda) and load ``kernels/<name>.cu`` with ``defines`` on a torch device,
    for the device's own target; a source marked for ``sm_XYa`` is refused on any other device."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("native kernels need a CUDA GPU; torch sees none")
    try:
        from pycuda.compiler import SourceModule
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeError("pycuda is not installed: pip install 'specdiag[gpu]'") from e
    dev = torch.cuda.current_device() if device_index is None else int(device_index)
    key = (name, dev, tuple(sorted((defines or {}).items())))
    if key not in _modules:
        torch.cuda.init()
        _primary_context(dev)
        major, minor = torch.cuda.get_device_capability(dev)
        need = kernel_arch(name)
        arch, code = f"sm_{major}{minor}", None
        if need.endswith("a"):
            if need != f"sm_{major}{minor}a":
                raise RuntimeError(f"{name}.cu is built for {need} only; this GPU is sm_{major}{minor}")
            arch, code = f"compute_{major}{minor}a", need
        options = ["-O3", "-std=c++17", *define_flags(defines)]
        _modules[key] = SourceModule(kernel_source(name), arch=arch, code=code, no_extern_c=True, options=options)
    return _modules[key]


@dataclass(frozen=True)
class LoadedKernel:
    function: object  # pycuda Function
    config: KernelConfig

    @property
    def smem_bytes(self) -> int:
        return self.config.smem_bytes


def _spec_module(spec, device_index: int | None, defines: Mapping[str, int] | None):
    """A registry row's module, built with the row's ``defines`` and then ``defines``."""
    return load_module(spec.source, device_index, {**dict(spec.defines), **(defines or {})})


def _exported_config(mod, source: str) -> KernelConfig:
    """The launch shape a loaded module exports (``tv_config``), read from the GPU once per module:
    a plan asks for it each time, and each read is a synchronous copy."""
    import numpy as np
    import pycuda.driver as cuda

    if id(mod) not in _configs:
        ptr, size = mod.get_global("tv_config")
        cfg = np.empty(_CONFIG_INTS, dtype=np.int32)
        if size != cfg.nbytes:
            raise RuntimeError(f"{source}.cu: tv_config is {size} bytes, expected {cfg.nbytes}")
        cuda.memcpy_dtoh(cfg, ptr)
        _configs[id(mod)] = _config(cfg)
    return _configs[id(mod)]


def _config(ints) -> KernelConfig:
    *shape, tree_bits = map(int, ints)
    return KernelConfig(*shape, tree_bits=bool(tree_bits))


def module_config(spec, device_index: int | None = None, defines: Mapping[str, int] | None = None) -> KernelConfig:
    """The launch shape that a registry row's module, built with the row's ``defines`` and then
    ``defines``, exports on a torch device (not checked: a variant may change it)."""
    return _exported_config(_spec_module(spec, device_index, defines), spec.source)


def load_kernel(spec, device_index: int | None = None, defines: Mapping[str, int] | None = None) -> LoadedKernel:
    """A registry row's entry point on a torch device (built with the row's ``defines``, then
    ``defines``), with the launch shape its module exports (checked against the row)."""
    mod = _spec_module(spec, device_index, defines)
    return LoadedKernel(mod.get_function(spec.entry), _exported_config(mod, spec.source).check(spec))


class PreparedLaunch:
    """One kernel launch, prepared once: the packed parameter bytes and the dynamic shared-memory
    limit set at construction, so a call costs one driver launch (plus torch's current stream).
    The bytes hold raw pointers: the caller keeps the tensors alive."""

    def __init__(self, func, grid, block, params: bytes, shared: int = 0, device_index: int | None = None):
        import torch

        self.func, self.grid, self.block, self.shared = (
            func,
            tuple(int(g) for g in grid),
            tuple(int(b) for b in block),
            int(shared),
        )
        self.device = torch.cuda.current_device() if device_index is None else int(device_index)
        self.buf = bytes(params)
        if self.shared > 48 * 1024:
            import pycuda.driver as cuda

            func.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)

    def __call__(self) -> None:
        _on_torch_stream(
            self.device, lambda stream: self.func._launch_kernel(self.grid, self.block, self.buf, self.shared, stream)
        )


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
