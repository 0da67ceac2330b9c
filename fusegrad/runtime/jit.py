"""Compile LLVM IR to machine code (MCJIT), with an in-memory and an on-disk cache.

The memory cache is keyed by the IR text's hash and keeps the most recently used
``MEMORY_CACHE_ENTRIES`` modules (a program holds its own module, so dropping one from the
cache only costs a recompile for a program built again later). The disk cache
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

__all__ = ["JitModule", "compile_ir", "cache_key", "host_identity", "stats"]

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
_memory: _LRU = _LRU(MEMORY_CACHE_ENTRIES)
stats = {"memory_hits": 0, "disk_hits": 0, "compiles": 0, "compile_ms": 0.0}


@functools.lru_cache(maxsize=1)
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


def _target_machine():
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


def _engine_with(obj: bytes | None, mod=None):
    tm = _target_machine()
    empty = llvm.parse_assembly("")
    empty.triple = tm.triple
    engine = llvm.create_mcjit_compiler(mod if mod is not None else empty, tm)
    if obj is not None:
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
    engine.finalize_object()
    return engine


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
            jm = JitModule(_engine_with(obj), names, None, "disk")
            stats["disk_hits"] += 1
        else:
            tm = _target_machine()
            mod = llvm.parse_assembly(ir_text)
            mod.triple = tm.triple
            mod.data_layout = str(tm.target_data)
            mod.verify()
            _optimize(mod, tm)
            optimized = str(mod) if keep_ir or config.debug >= 4 else None
            obj = tm.emit_object(mod)
            _write_disk(key, obj)
            jm = JitModule(_engine_with(obj), names, optimized, "compiled")
            stats["compiles"] += 1
        stats["compile_ms"] += (time.perf_counter() - start) * 1e3
        _memory[key] = jm
        return jm


def clear_memory_cache() -> None:
    with _lock:
        _memory.clear()
