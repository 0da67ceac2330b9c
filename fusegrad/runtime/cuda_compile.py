"""CUDA C to machine code: NVRTC in process, else ``nvcc``, cached on disk.

:func:`compile_cuda` turns CUDA C (:mod:`fusegrad.codegen.cuda`) into machine code (CUBIN) for
the device's compute capability (``sm_90``) with NVRTC, in process (the ``nvidia-cuda-nvrtc``
wheel's ``libnvrtc``, found through ``FUSEGRAD_NVRTC``, the wheels, ``CUDA_HOME`` or the loader
path; the one of the driver's CUDA major first), else with ``nvcc -cubin``; a virtual
``compute_90`` gives PTX. The code is cached on disk (:mod:`fusegrad.runtime.disk_cache`,
never unpickled) keyed by the source's hash, the architecture and the compiler's version, like
the CPU's object code. At a driver's first compile its CUDA version is checked against
NVRTC's (:func:`check_driver_compatible`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import threading

from fusegrad.config import config
from fusegrad.runtime import cuda_drivers, disk_cache
from fusegrad.runtime.cuda_drivers import INSTALL_HINT, CudaUnavailable
from fusegrad.version import __version__

__all__ = ["compile_cuda", "find_nvrtc", "find_cuda_library", "nvrtc_version", "nvrtc_arch_list",
           "nvrtc_package", "check_driver_compatible", "machine_arch", "is_machine_code"]

# --------------------------------------------------------------------------- compiling


def _library_major(path: str, stem: str) -> int | None:
    """The CUDA major version in a ``libnvrtc.so.12`` file name (None without one)."""
    m = re.search(rf"lib{stem}\.so\.(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else None


def _nvrtc_major(path: str) -> int | None:
    return _library_major(path, "nvrtc")


def find_cuda_library(stem: str, env: str, driver_version: int | None = None) -> str | None:
    """Path of CUDA library ``lib{stem}`` (``nvrtc``, ``cublasLt``): the environment
    variable ``env``, NVIDIA's wheels (``nvidia/cu13/lib`` of the CUDA 13 wheels,
    ``nvidia/<component>/lib`` of the ``-cu12`` ones), ``CUDA_HOME``, or the loader's search
    path; None when there is none.

    With several installed, the one whose CUDA major version is the driver's
    (``driver_version`` as ``cuDriverGetVersion`` gives it, 13000 for 13.0; the process's
    driver's when None and one is made) comes first, then older majors, newest first: a
    newer major needs a newer driver."""
    path = os.environ.get(env)
    if path and os.path.exists(path):
        return path
    pattern = f"lib{stem}.so*"
    candidates = []
    try:
        spec = importlib.util.find_spec("nvidia")
        for root in (spec.submodule_search_locations or []) if spec else []:
            candidates += sorted(glob.glob(os.path.join(root, "*", "lib", pattern)))
    except (ImportError, ValueError):
        pass
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates += sorted(glob.glob(os.path.join(home, "lib64", pattern)))
    candidates = [c for c in candidates if "builtins" not in c and "alt" not in c]
    if driver_version is None:
        driver_version = _known_driver_version()
    if driver_version is not None and candidates:
        wanted = driver_version // 1000

        def preference(path: str) -> tuple[int, int]:
            major = _library_major(path, stem)
            if major is None:                  # an unversioned lib*.so: after the known
                return (1, 0)
            return (0 if major == wanted else 1 if major < wanted else 2, -major)
        candidates.sort(key=preference)       # stable: folder order breaks ties
    if candidates:
        return candidates[0]
    return ctypes.util.find_library(stem)


def find_nvrtc(driver_version: int | None = None) -> str | None:
    """Path of ``libnvrtc`` (``FUSEGRAD_NVRTC``, else :func:`find_cuda_library`'s search:
    ``nvidia-cuda-nvrtc`` 13's ``nvidia/cu13/lib``, ``nvidia-cuda-nvrtc-cu12``'s
    ``nvidia/cuda_nvrtc/lib``, ...); None when there is none."""
    return find_cuda_library("nvrtc", "FUSEGRAD_NVRTC", driver_version)


def _known_driver_version() -> int | None:
    """The process's driver's CUDA version, when a driver was made and can tell."""
    version = getattr(cuda_drivers._driver, "driver_version", None)
    try:
        return version() if callable(version) else None
    except Exception:
        return None


_nvrtc_lock = threading.Lock()
_nvrtc_lib = None


def _nvrtc(driver_version: int | None = None):
    """The NVRTC library, loaded on first use (the one :func:`find_nvrtc` picks for
    ``driver_version``); None without one."""
    global _nvrtc_lib
    with _nvrtc_lock:
        if _nvrtc_lib is None:
            path = find_nvrtc(driver_version)
            if path is None:
                return None
            # NVRTC opens libnvrtc-builtins by name at its first compile; a wheel's folder is
            # not on the loader's path, so the one beside it is loaded first.
            for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path),
                                                          "libnvrtc-builtins.so*"))):
                if "alt" not in os.path.basename(builtins):
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                    break
            _nvrtc_lib = ctypes.CDLL(path)
        return _nvrtc_lib


def nvrtc_version() -> str | None:
    """NVRTC's version ("13.0"), or None without NVRTC."""
    lib = _nvrtc()
    if lib is None:
        return None
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def nvrtc_arch_list() -> list[str]:
    """The ``sm_XX`` architectures NVRTC compiles for (``nvrtcGetSupportedArchs``); empty
    without NVRTC."""
    lib = _nvrtc()
    if lib is None or not hasattr(lib, "nvrtcGetSupportedArchs"):
        return []
    count = ctypes.c_int()
    lib.nvrtcGetNumSupportedArchs(ctypes.byref(count))
    archs = (ctypes.c_int * count.value)()
    lib.nvrtcGetSupportedArchs(archs)
    return [f"sm_{a}" for a in archs]


def _nvrtc_compile(source: str, arch: str, name: str) -> tuple[bytes, str]:
    """(CUBIN for ``sm_XX``, PTX for ``compute_XX``; the log) from NVRTC; raises
    RuntimeError with the log on an error."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    check = _nvrtc_check(lib)
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None,
                                 None))
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        status = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace").strip()
        if status != 0:
            raise RuntimeError(f"NVRTC failed to compile {name}:\n{text}")
        if is_machine_code(arch):
            check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
            cubin = ctypes.create_string_buffer(size.value)
            check(lib.nvrtcGetCUBIN(prog, cubin))
            return cubin.raw, text
        check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
        ptx = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetPTX(prog, ptx))
        return ptx.raw.rstrip(b"\0"), text
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvrtc_check(lib):
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(status: int) -> None:
        if status != 0:
            raise RuntimeError(f"NVRTC: {lib.nvrtcGetErrorString(status).decode()}")
    return check


def machine_arch(arch: str) -> str:
    """The real GPU (``sm_90``) of a virtual architecture (``compute_90``), what programs
    compile machine code for; an ``sm_XX`` stays as it is."""
    return "sm_" + arch[len("compute_"):] if arch.startswith("compute_") else arch


def is_machine_code(arch: str) -> bool:
    """Whether ``arch`` names a real GPU (``sm_90``: CUBIN) rather than a virtual one
    (``compute_90``: PTX, which the driver compiles when it loads it)."""
    return arch.startswith("sm_")


def _nvcc_compile(source: str, arch: str, name: str) -> tuple[bytes, str]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc):
        raise CudaUnavailable(f"no CUDA compiler: neither NVRTC nor nvcc was found; {INSTALL_HINT}")
    kind = "cubin" if is_machine_code(arch) else "ptx"
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, f"{name}.cu"), os.path.join(tmp, f"{name}.{kind}")
        with open(src, "w") as f:
            f.write(source)
        arch_flag = arch.replace("compute_", "sm_")
        run = subprocess.run([nvcc, f"-arch={arch_flag}", f"-{kind}", src, "-o", out],
                             capture_output=True, text=True)
        log = (run.stdout + run.stderr).strip()
        if run.returncode != 0:
            raise RuntimeError(f"nvcc failed to compile {name}:\n{log}")
        with open(out, "rb") as f:
            return f.read(), log


def _nvcc_version() -> str:
    """``nvcc --version``'s release line (part of the cache key)."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "nvcc"
    return next((line for line in out.splitlines() if "release" in line), "nvcc")


def compile_cuda(source: str, arch: str = "sm_90", name: str = "fusegrad",
                 compiler: str | None = None, cache_dir: str | None = None) -> bytes:
    """Machine code (CUBIN) of CUDA C ``source`` for ``arch`` (``sm_90``: Hopper), or PTX
    for a virtual ``compute_XX``, from NVRTC when found (``compiler="nvrtc"`` or ``"nvcc"``
    forces one), cached on disk in ``cache_dir`` (the runtime's cache folder by default)
    keyed by the source, the architecture and the compiler's version."""
    use_nvrtc = compiler == "nvrtc" or (compiler is None and _nvrtc() is not None)
    if use_nvrtc and _nvrtc() is None:
        raise CudaUnavailable(f"NVRTC was not found; {INSTALL_HINT}")
    identity = f"nvrtc {nvrtc_version()}" if use_nvrtc else _nvcc_identity()
    key = hashlib.sha256("\n".join([__version__, identity, arch, source]).encode()).hexdigest()
    cache_dir = cache_dir or _cache_dir()
    limit = 256 << 20
    if cache_dir:
        hit = disk_cache.read_entry(cache_dir, key, limit)
        if hit is not None:
            return hit
    code, _ = (_nvrtc_compile if use_nvrtc else _nvcc_compile)(source, arch, name)
    if cache_dir:
        disk_cache.write_entry(cache_dir, key, code, limit, 30 * 86400)
    return code


_nvcc_identity_value: str | None = None


def _nvcc_identity() -> str:
    global _nvcc_identity_value
    if _nvcc_identity_value is None:
        _nvcc_identity_value = _nvcc_version()
    return _nvcc_identity_value


def nvrtc_package(major: int, minor: int | None = None) -> str:
    """The pip requirement that installs NVRTC of CUDA ``major`` (``minor`` or older when
    given): ``nvidia-cuda-nvrtc`` from CUDA 13 on, ``nvidia-cuda-nvrtc-cu12`` before."""
    if major >= 13:
        return f"nvidia-cuda-nvrtc=={major}.{minor}.*" if minor is not None else \
            f"nvidia-cuda-nvrtc>={major},<{major + 1}"
    name = f"nvidia-cuda-nvrtc-cu{major}"
    return f"{name}=={major}.{minor}.*" if minor is not None else name


def check_driver_compatible(driver_version: int, nvrtc: str, arch: str) -> None:
    """Raise :class:`CudaUnavailable` when code that NVRTC ``nvrtc`` ("13.5") makes for
    ``arch`` cannot be loaded by a driver of CUDA ``driver_version`` (13000 for 13.0), naming
    both versions and the package to install.

    A newer NVRTC major than the driver's never works: its CUBIN and PTX need the newer
    driver. A newer minor within the driver's major works for CUBIN (CUDA's minor version
    compatibility: machine code of 13.x runs on any 13.y driver) but not for PTX: the
    driver's JIT reads no PTX ISA newer than its own (NVRTC 13.5 writes ``.version 9.5``,
    which a 13.0 driver refuses with CUDA_ERROR_UNSUPPORTED_PTX_VERSION)."""
    d_major, d_minor = driver_version // 1000, driver_version % 1000 // 10
    n_major, n_minor = (int(p) for p in nvrtc.split(".")[:2])
    driver = f"the NVIDIA driver supports CUDA {d_major}.{d_minor}"
    if n_major > d_major:
        raise CudaUnavailable(
            f"NVRTC {nvrtc} makes code that the installed driver cannot load ({driver}): "
            f'install the NVRTC of CUDA {d_major} (pip install "{nvrtc_package(d_major)}") '
            f"or a driver for CUDA {n_major}")
    if not is_machine_code(arch) and (n_major, n_minor) > (d_major, d_minor):
        raise CudaUnavailable(
            f"NVRTC {nvrtc} writes PTX that the installed driver cannot load ({driver}; "
            f"minor version compatibility covers machine code, not PTX): compile for "
            f"sm_XX, or install an older NVRTC (pip install "
            f'"{nvrtc_package(d_major, d_minor)}")')


def _cache_dir() -> str | None:
    base = getattr(config, "cache_dir", None)
    return os.path.join(base, "cuda") if base else None
