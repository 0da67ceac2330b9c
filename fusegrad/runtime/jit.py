"""Compile LLVM IR to machine code (MCJIT), with an in-memory and an on-disk cache.

A program's kernels are compiled one module each (:func:`link_kernels`) and their object
code is linked into one MCJIT engine per program. Caching is per kernel: a training step's
first-step and steady graphs, or a function and its backward, share most kernels and compile
each once (one module for every kernel made a program's cache entry all-or-nothing, and LLVM
spent seconds on each large module again). Each kernel's function is named by the hash of
its code, so equal kernels are equal symbols wherever they come from.

The memory caches are keyed by the IR text's hash: object code per kernel, and linked
engines per set of kernels, each keeping the most recently used ``MEMORY_CACHE_ENTRIES`` (a
program holds its own engine, so dropping one from the cache only costs a link or a
recompile for a program built again later). The disk cache
(:mod:`fusegrad.runtime.disk_cache`) stores object code (``emit_object``) under that hash plus
the identity of everything that shapes the machine code (fusegrad, llvmlite and LLVM
versions, CPU name and features): written atomically, never unpickled, a corrupt or truncated
file rebuilt, bounded in size and age. ``FUSEGRAD_CACHE_DIR`` moves it;
``FUSEGRAD_CACHE_DIR=off`` disables it.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
import time
from collections import OrderedDict

import llvmlite
import llvmlite.binding as llvm

from fusegrad.config import config
from fusegrad.runtime import disk_cache

__all__ = ["JitModule", "compile_ir", "link_kernels", "kernel_symbol", "cache_key",
           "host_identity", "stats"]

MEMORY_CACHE_ENTRIES = 1024


class _LRU(OrderedDict):
    """A dict that keeps its ``limit`` most recently used entries."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def get(self, key, default=None):
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


_lock = threading.Lock()
_memory: _LRU = _LRU(MEMORY_CACHE_ENTRIES)          # engines: module or kernel-set key
_objects: _LRU = _LRU(MEMORY_CACHE_ENTRIES)         # object code: kernel key
stats = {"memory_hits": 0, "disk_hits": 0, "compiles": 0, "compile_ms": 0.0}


@functools.lru_cache(maxsize=1)
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def _target_machine():
    """A new target machine for the host (an MCJIT engine takes ownership of the one it is
    given, so engines get their own; :func:`_codegen_machine` is the shared one)."""
    _init()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                        features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, reloc="pic", codemodel="default")


@functools.lru_cache(maxsize=1)
def host_identity() -> str:
    """Everything besides the IR that decides the machine code."""
    from fusegrad import __version__
    _init()
    llvm_version = ".".join(map(str, llvm.llvm_version_info))
    return "|".join([__version__, llvmlite.__version__, llvm_version, llvm.get_host_cpu_name(),
                     llvm.get_host_cpu_features().flatten()])


@functools.lru_cache(maxsize=1)
def _codegen_machine():
    # Making a target machine costs milliseconds; optimizing and emitting object code reuse
    # one (under ``_lock``).
    return _target_machine()


def cache_key(ir_text: str) -> str:
    return hashlib.sha256((host_identity() + "\n" + ir_text).encode()).hexdigest()


def _prefer_wide_vectors(ir_text: str) -> str:
    # llvmlite.ir cannot attach string attributes; LLVM otherwise treats AVX-512 hosts as
    # 256-bit. Every defined function gets "prefer-vector-width"="512".
    return re.sub(r'^(define [^\n]*\))', r'\1 "prefer-vector-width"="512"', ir_text, flags=re.M)


def _optimize(mod, tm) -> None:
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


class JitModule:
    """Machine code for one LLVM module, loaded in an MCJIT engine that this object keeps
    alive; ``address(name)`` gives a function's entry point."""

    def __init__(self, engine, names, optimized_ir: str | None, source: str):
        self._engine = engine
        self.addresses = {n: engine.get_function_address(n) for n in names}
        self.optimized_ir = optimized_ir
        self.source = source          # "compiled", "memory" or "disk"

    def address(self, name: str) -> int:
        return self.addresses[name]


def _engine_with(objects: list[bytes]):
    """One MCJIT engine holding ``objects`` (linking costs well under a millisecond per
    object; an engine of its own per kernel would cost several)."""
    tm = _target_machine()
    empty = llvm.parse_assembly("")
    empty.triple = tm.triple
    engine = llvm.create_mcjit_compiler(empty, tm)
    for obj in objects:
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    engine.finalize_object()
    return engine


def _compile_object(ir_text: str, keep_ir: bool = False) -> tuple[bytes, str | None]:
    """Parse, verify, optimize and emit object code; also the optimized IR if asked."""
    tm = _codegen_machine()
    mod = llvm.parse_assembly(ir_text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    _optimize(mod, tm)
    optimized = str(mod) if keep_ir or config.debug >= 4 else None
    return tm.emit_object(mod), optimized


def _read_disk(key: str) -> bytes | None:
    if not config.cache_dir:
        return None
    return disk_cache.read_entry(config.cache_dir, key, config.cache_max_bytes)


def _write_disk(key: str, obj: bytes) -> None:
    if config.cache_dir:
        disk_cache.write_entry(config.cache_dir, key, obj, config.cache_max_bytes,
                               config.cache_max_age_days * 86400.0)


def compile_ir(ir_text: str, names: list[str], keep_ir: bool = False) -> JitModule:
    """Optimize and compile ``ir_text``; return the loaded module (cached)."""
    ir_text = _prefer_wide_vectors(ir_text)
    key = cache_key(ir_text)
    with _lock:
        hit = _memory.get(key)
        if hit is not None and (not keep_ir or hit.optimized_ir is not None):
            stats["memory_hits"] += 1
            return hit
        start = time.perf_counter()
        obj = None if keep_ir else _read_disk(key)
        if obj is not None:
            jm = JitModule(_engine_with([obj]), names, None, "disk")
            stats["disk_hits"] += 1
        else:
            obj, optimized = _compile_object(ir_text, keep_ir)
            _write_disk(key, obj)
            jm = JitModule(_engine_with([obj]), names, optimized, "compiled")
            stats["compiles"] += 1
        stats["compile_ms"] += (time.perf_counter() - start) * 1e3
        _memory[key] = jm
        return jm


KERNEL_PLACEHOLDER = "fg_kernel"


def kernel_symbol(ir_text: str) -> tuple[str, str]:
    """Name a one-kernel module's function by its code: ``ir_text`` defines its function as
    ``@"fg_kernel"``; returns the symbol and the text with that name in place. Equal code
    gets the same symbol, so one engine can hold kernels from anywhere without clashes."""
    digest = hashlib.sha256(ir_text.encode()).hexdigest()[:24]
    symbol = f"fg_{digest}"
    return symbol, ir_text.replace(f'@"{KERNEL_PLACEHOLDER}"', f'@"{symbol}"')


def link_kernels(sources: list[str], names: list[str]) -> JitModule:
    """Machine code for kernels given one module each (``sources``, defining the functions
    ``names``), loaded in one engine. Each kernel's object code comes from the memory cache,
    the disk cache, or LLVM, in that order; ``stats`` counts kernels. An engine made for the
    same set of kernels before is reused whole."""
    texts: dict[str, str] = {}
    for src in sources:
        src = _prefer_wide_vectors(src)
        texts.setdefault(cache_key(src), src)
    group = hashlib.sha256("\n".join(sorted(texts)).encode()).hexdigest()
    with _lock:
        hit = _memory.get(group)
        if hit is not None:
            stats["memory_hits"] += len(texts)
            return hit
        start = time.perf_counter()
        objects, origin = [], "memory"
        for key, text in texts.items():
            obj = _objects.get(key)
            if obj is not None:
                stats["memory_hits"] += 1
            else:
                obj = _read_disk(key)
                if obj is not None:
                    stats["disk_hits"] += 1
                    origin = "disk" if origin == "memory" else origin
                else:
                    obj, _ = _compile_object(text)
                    _write_disk(key, obj)
                    stats["compiles"] += 1
                    origin = "compiled"
                _objects[key] = obj
            objects.append(obj)
        jm = JitModule(_engine_with(objects), names, None, origin)
        stats["compile_ms"] += (time.perf_counter() - start) * 1e3
        _memory[group] = jm
        return jm


def clear_memory_cache() -> None:
    """Forget every compiled kernel and engine held in memory (programs keep theirs)."""
    with _lock:
        _memory.clear()
        _objects.clear()
