"""Configuration read from the environment, in one place.

``FUSEGRAD_DEBUG``: 1 prints one line per compile, 2 one line per kernel launch, 3 the IR
after each pass, 4 the generated LLVM IR. ``FUSEGRAD_DUMP_DIR``: write the IR after each
pass there. ``FUSEGRAD_VERIFY``: verify the IR after every pass (on in the test suite).
``FUSEGRAD_NUM_THREADS``: kernel threads (default: the number of cores).
``FUSEGRAD_CACHE_DIR``: the on-disk kernel cache (default under the user's cache folder;
``0`` or ``off`` disables it). ``FUSEGRAD_CACHE_MAX_BYTES`` (default 256 MiB) and
``FUSEGRAD_CACHE_MAX_AGE_DAYS`` (default 30): the disk cache evicts the least recently used
entries beyond that size and entries unused for that long.
``FUSEGRAD_RECOMPILE_LIMIT`` (default 8, torch's ``recompile_limit``): how many signatures
(shapes, dtypes, ...) one compiled function compiles for; calls with further signatures run
eagerly, with one warning.
``FUSEGRAD_EAGER_KERNELS`` (default 512; ``0`` turns it off): composite ops (gelu, softmax,
layer_norm, cross_entropy, conv2d, max_pool2d...) called eagerly on float32 CPU tensors with at
least this many elements run as the fused kernels of their compiled definition
(:mod:`fusegrad.tracer.eager_kernels`).
``FUSEGRAD_NATIVE_GEMM`` (default ``auto``): compiled programs run their float32 matrix products
as GEMMs generated for their shapes (:mod:`fusegrad.codegen.llvm.gemm`) on CPUs with AVX-512
(``auto``), everywhere (``on``), or never (``off``: numpy's BLAS).
``FUSEGRAD_MALLOC_TOP_PAD`` (default 16 MiB; ``0``: glibc's default): freed heap memory the
process keeps for the next eager op's arrays (:mod:`fusegrad.host_memory`).
``FUSEGRAD_CUDA_SYNC`` (default 0; torch's ``CUDA_LAUNCH_BLOCKING``): 1 waits for each CUDA
kernel as it is launched, so that a kernel that faults is named by the error its launch raises
(kernels otherwise run asynchronously and report a fault at a later call).
``FUSEGRAD_CUDA_COLLECT`` (unset by default): a folder where the CUDA lowering records the
source of every kernel it makes, one file per distinct kernel (``make test`` sets it and then
compiles them all with nvcc: ``python -m fusegrad.testing.nvcc FOLDER``).
``FUSEGRAD_CUDA_EAGER_CACHE`` (default 4096, as torch's cuFFT plan cache): how many compiled
single-op programs eager cuda tensors keep (least recently used first out; an evicted program
unloads its module from the GPU).
``FUSEGRAD_CUDA_BLAS`` (default ``auto``): CUDA matmuls run through cuBLASLt where its library
is found (:mod:`fusegrad.runtime.cublas`), or always as the generated tiled kernel
(``kernel``). ``float32_matmul_precision`` (not from the environment; torch's
``set_float32_matmul_precision``): ``"high"`` lets float32 matmuls use TF32.

Settings can also be changed at run time, as attributes of this module or of ``config``::

    import fusegrad
    fusegrad.config.recompile_limit = 64     # torch's alias cache_size_limit works too
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from dataclasses import dataclass


def _int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        _ignored(name, default)
        return default


def _ignored(name: str, default) -> None:
    """Say that an environment variable's value is not understood (it is not ignored
    silently); ``default`` is used instead."""
    warnings.warn(f"{name}={os.environ.get(name)!r} is not a number; fusegrad uses {default}",
                  RuntimeWarning, stacklevel=3)


def _choice(name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (the first is the default), read case-insensitively."""
    value = os.environ.get(name, choices[0]).strip().lower()
    if value in choices:
        return value
    warnings.warn(f"{name}={os.environ.get(name)!r} is not one of {', '.join(choices)}; "
                  f"fusegrad uses {choices[0]}", RuntimeWarning, stacklevel=3)
    return choices[0]


def _float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        _ignored(name, default)
        return default


def _cache_dir() -> str | None:
    value = os.environ.get("FUSEGRAD_CACHE_DIR")
    if value is not None:
        return None if value.lower() in ("", "0", "off", "none") else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fusegrad")


@dataclass
class Config:
    debug: int
    dump_dir: str | None
    verify: bool
    num_threads: int
    cache_dir: str | None
    cache_max_bytes: int
    cache_max_age_days: float
    recompile_limit: int
    eager_kernel_threshold: int
    native_gemm: str
    cuda_sync: bool
    cuda_eager_cache: int
    # Matmuls on CUDA: "auto" through cuBLASLt where the library is found, "kernel" always the
    # generated tiled kernel.
    cuda_blas: str
    # A folder where the CUDA lowering records every kernel's source (FUSEGRAD_CUDA_COLLECT).
    cuda_collect: str | None = None
    # torch.set_float32_matmul_precision: "highest" (full float32), "high" (TF32 allowed).
    float32_matmul_precision: str = "highest"
    # torch._dynamo.config.automatic_dynamic_shapes: with compile(dynamic=None), a dim seen
    # with a second size is compiled as a symbol (tracer/dynamic_shapes.py).
    automatic_dynamic_shapes: bool = True

    @classmethod
    def from_env(cls) -> "Config":
        return cls(
            debug=_int("FUSEGRAD_DEBUG", 0),
            dump_dir=os.environ.get("FUSEGRAD_DUMP_DIR") or None,
            verify=os.environ.get("FUSEGRAD_VERIFY", "0") not in ("", "0", "false"),
            num_threads=max(1, _int("FUSEGRAD_NUM_THREADS", os.cpu_count() or 1)),
            cache_dir=_cache_dir(),
            cache_max_bytes=max(0, _int("FUSEGRAD_CACHE_MAX_BYTES", 256 << 20)),
            cache_max_age_days=max(0.0, _float("FUSEGRAD_CACHE_MAX_AGE_DAYS", 30.0)),
            recompile_limit=max(1, _int("FUSEGRAD_RECOMPILE_LIMIT", 8)),
            eager_kernel_threshold=max(0, _int("FUSEGRAD_EAGER_KERNELS", 512)),
            native_gemm=_choice("FUSEGRAD_NATIVE_GEMM", ("auto", "on", "off")),
            cuda_sync=os.environ.get("FUSEGRAD_CUDA_SYNC", "0") not in ("", "0", "false"),
            cuda_eager_cache=max(1, _int("FUSEGRAD_CUDA_EAGER_CACHE", 4096)),
            cuda_blas=_choice("FUSEGRAD_CUDA_BLAS", ("auto", "kernel")),
            cuda_collect=os.environ.get("FUSEGRAD_CUDA_COLLECT") or None,
            automatic_dynamic_shapes=os.environ.get("FUSEGRAD_AUTOMATIC_DYNAMIC_SHAPES", "1")
            not in ("0", "false", "off"),
        )

    @property
    def cache_size_limit(self) -> int:
        """torch.compile's older name for :attr:`recompile_limit`."""
        return self.recompile_limit

    @cache_size_limit.setter
    def cache_size_limit(self, value: int) -> None:
        self.recompile_limit = value


config = Config.from_env()


def reload() -> Config:
    """Re-read the environment (tests change it)."""
    global config
    new = Config.from_env()
    for field in new.__dataclass_fields__:
        setattr(config, field, getattr(new, field))
    return config


class _ConfigModule(types.ModuleType):
    """This module, with ``config``'s settings readable and writable as its attributes
    (``fusegrad.config.recompile_limit = 16``), as torch's config modules are."""

    _settings = frozenset(Config.__dataclass_fields__) | {"cache_size_limit"}

    def __getattr__(self, name: str):
        if name in _ConfigModule._settings:
            return getattr(config, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if name in _ConfigModule._settings:
            setattr(config, name, value)
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _ConfigModule
