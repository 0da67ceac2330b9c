"""Compile LLVM IR to machine code (MCJIT), with an in-memory and an on-disk cache.

A program's kernels are compiled one module each and their object code is linked into one
MCJIT engine per program (:func:`link_kernels`). Caching is per kernel: a training step's
first-step and steady graphs, or a function and its backward, share most kernels and
compile each once (one module for every kernel made a program's cache entry all-or-nothing,
and LLVM spent seconds on each large module again). Each kernel's function is named by the
hash of its code, so equal kernels are equal symbols wherever they come from.

Kernels are cached by a description of the kernel (:func:`kernel_key`: its nodes, views,
shapes and levels, plus a digest of the code generator's source) rather than by their IR,
because building the IR with llvmlite costs more than loading machine code: a warm cache
skips it. A :class:`KernelRecord` holds the symbol, the kernel's buffer order and the object
code. Whole modules (:func:`compile_ir`) are cached by their IR text's hash.

The memory caches keep the most recently used ``MEMORY_CACHE_ENTRIES`` kernels and engines
(a program holds its own engine, so dropping one from the cache only costs a link or a
recompile for a program built again later). The disk cache
(:mod:`fusegrad.runtime.disk_cache`) stores records and object code under those keys plus
the identity of everything that shapes the machine code (fusegrad, llvmlite and LLVM
versions, CPU name and features): written atomically, never unpickled, a corrupt or truncated
file rebuilt, bounded in size and age. ``FUSEGRAD_CACHE_DIR`` moves it;
``FUSEGRAD_CACHE_DIR=off`` disables it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from fusegrad.codegen.llvm.kernel import tuning
from fusegrad.config import config
from fusegrad.dlpack import register_ir_compiler
from fusegrad.runtime import disk_cache
from fusegrad.version import __version__

__all__ = ["JitModule", "KernelRecord", "compile_ir", "kernel_symbol", "kernel_key",
           "find_kernel", "build_kernel", "link_kernels", "cache_key", "host_identity", "stats",
           "compile_target", "target_identity"]

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
_objects: _LRU = _LRU(MEMORY_CACHE_ENTRIES)         # KernelRecord by kernel key; bytes by IR
stats = {"memory_hits": 0, "disk_hits": 0, "compiles": 0, "compile_ms": 0.0}


@functools.lru_cache(maxsize=1)
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.lru_cache(maxsize=1)
def _host_cpu() -> tuple[str, str]:
    """The host CPU's LLVM name and feature string (asking LLVM costs ~0.5 ms a time)."""
    _init()
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def _target_machine():
    """A new target machine for the host (an MCJIT engine takes ownership of the one it is
    given, so engines get their own; :func:`_codegen_machine` is the shared one)."""
    cpu, features = _host_cpu()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic",
                                        codemodel="default")


@functools.lru_cache(maxsize=1)
def host_identity() -> str:
    """Everything besides the IR that decides the machine code."""
    llvm_version = ".".join(map(str, llvm.llvm_version_info))
    return "|".join([__version__, llvmlite.__version__, llvm_version, *_host_cpu()])


@functools.lru_cache(maxsize=1)
def _host_codegen_machine():
    # Making a target machine costs milliseconds; optimizing and emitting object code reuse
    # one (under ``_lock``).
    return _target_machine()


# The CPU that object code is generated for when it is not the host: (name, feature string),
# set only inside ``compile_target`` (ahead-of-time builds for another CPU of the same
# architecture). Kernels are then cached under that target's identity, never the host's.
_target: tuple[str, str] | None = None


@functools.lru_cache(maxsize=8)
def _named_codegen_machine(cpu: str, features: str):
    _init()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic",
                                        codemodel="default")


def _codegen_machine():
    if _target is None:
        return _host_codegen_machine()
    return _named_codegen_machine(*_target)


def target_identity() -> str:
    """:func:`host_identity`, or the same for the CPU of an enclosing ``compile_target``."""
    if _target is None:
        return host_identity()
    _init()
    llvm_version = ".".join(map(str, llvm.llvm_version_info))
    return "|".join([__version__, llvmlite.__version__, llvm_version, *_target])


# LLVM CPU names with AVX-512, for targets named without a feature list.
_AVX512_CPUS = frozenset({"x86-64-v4", "skylake-avx512", "cascadelake", "cooperlake",
                          "cannonlake", "icelake-client", "icelake-server", "tigerlake",
                          "rocketlake", "sapphirerapids", "emeraldrapids", "graniterapids",
                          "graniterapids-d", "diamondrapids", "znver4", "znver5"})


def target_has_avx512() -> bool:
    """Whether the CPU code is generated for (the host, or that of an enclosing
    ``compile_target``) has AVX-512F."""
    cpu, features = _host_cpu() if _target is None else _target
    flags = features.split(",")
    if "-avx512f" in flags:
        return False
    return "+avx512f" in flags or cpu in _AVX512_CPUS


_AVX512_BF16_CPUS = frozenset({"cooperlake", "sapphirerapids", "emeraldrapids", "graniterapids",
                               "graniterapids-d", "diamondrapids", "znver4", "znver5"})


def target_has_avx512_bf16() -> bool:
    """Whether the CPU code is generated for has AVX512_BF16 (``vdpbf16ps``)."""
    cpu, features = _host_cpu() if _target is None else _target
    flags = features.split(",")
    if "-avx512bf16" in flags or not target_has_avx512():
        return False
    return "+avx512bf16" in flags or cpu in _AVX512_BF16_CPUS


@contextlib.contextmanager
def compile_target(cpu: str, features: str = ""):
    """Generate object code for CPU ``cpu`` (an LLVM CPU name such as ``x86-64-v3``) with
    ``features`` (LLVM's ``+avx2,-avx512f`` form) instead of the host while inside. Used by
    ahead-of-time builds: one artifact built on a large machine serves a fleet of smaller
    ones. Not for concurrent use with other compiles in the same process."""
    global _target
    _init()
    if not llvm.Target.from_default_triple().name:
        raise ValueError("no native LLVM target")
    previous = _target
    with _lock:
        _target = (cpu, features)
    try:
        yield
    finally:
        with _lock:
            _target = previous


def cache_key(ir_text: str) -> str:
    return hashlib.sha256((target_identity() + "\n" + ir_text).encode()).hexdigest()


def _prefer_wide_vectors(ir_text: str) -> str:
    # llvmlite.ir cannot attach string attributes; LLVM otherwise treats AVX-512 hosts as
    # 256-bit. Every defined function gets "prefer-vector-width"="512".
    return re.sub(r'^(define [^\n]*\))', r'\1 "prefer-vector-width"="512"', ir_text, flags=re.M)


def _optimize(mod, tm, speed_level: int = 3) -> None:
    """The new pass manager's pipeline at ``speed_level``: 3 vectorizes; 1 (for kernels too
    small for vectors to pay) costs LLVM a third of the time.

    The loop unroller stays off at every level. The vectorizer already interleaves the
    vector body (several accumulators), and runtime unrolling of the vector and remainder
    loops on top of that made the MLP training step's first compile 35% slower (the
    transformer step's 46%) with no measurable change in step time. Short constant loops,
    which only the unroller made vectorizable, ask for it themselves (see
    ``KernelPrinter.loop`` in fusegrad.codegen.llvm.kernel)."""
    pto = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    wide = speed_level >= 2
    pto.loop_vectorization = wide
    pto.slp_vectorization = wide
    pto.loop_unrolling = False
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
        hit = self.addresses.get(name)
        if hit is None:             # another function of a linked kernel (a phase)
            hit = self.addresses[name] = self._engine.get_function_address(name)
        return hit


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


def _compile_object(ir_text: str, keep_ir: bool = False,
                    speed_level: int = 3) -> tuple[bytes, str | None]:
    """Parse, verify, optimize and emit object code; also the optimized IR if asked."""
    tm = _codegen_machine()
    mod = llvm.parse_assembly(ir_text)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    with _quiet_missed_vectorization():
        _optimize(mod, tm, speed_level)
    optimized = str(mod) if keep_ir or config.debug >= 4 else None
    return tm.emit_object(mod), optimized


# LLVM prints "warning: ... loop not vectorized: the optimizer was unable to perform the
# requested transformation" (and "remark: ... loop not vectorized: value that could not be
# identified as reduction ...") to the process's stderr when a loop that the kernel asks to
# vectorize (KernelPrinter.loop) cannot be: expected, and nothing a user can act on.
_MISSED = b"loop not vectorized"


_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _quiet_missed_vectorization():
    """Run LLVM with file descriptor 2 captured; pass on everything it held but LLVM's
    missed-vectorization warnings (a write from another thread meanwhile comes out after)."""
    with _stderr_lock, tempfile.TemporaryFile() as capture:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, AttributeError, ValueError):
            saved = None        # no file descriptor 2 (an embedded interpreter): as it is
        if saved is None:
            yield
            return
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().splitlines(keepends=True)
                    if _MISSED not in line]
            if kept:
                os.write(2, b"".join(kept))


def _read_disk(key: str) -> bytes | None:
    if not config.cache_dir:
        return None
    return disk_cache.read_entry(config.cache_dir, key, config.cache_max_bytes)


def _write_disk(key: str, obj: bytes) -> None:
    if config.cache_dir:
        disk_cache.write_entry(config.cache_dir, key, obj, config.cache_max_bytes,
                               config.cache_max_age_days * 86400.0)


def compile_ir(ir_text: str, names: list[str], keep_ir: bool = False,
               speed_level: int = 3) -> JitModule:
    """Optimize (at ``speed_level``, see :func:`_optimize`) and compile ``ir_text``; return
    the loaded module (cached)."""
    carried = _carried.get(module_key(ir_text, speed_level))
    ir_text = _prefer_wide_vectors(ir_text)
    key = cache_key(ir_text if speed_level == 3 else f"{ir_text}\n; speed level {speed_level}")
    with _lock:
        hit = _memory.get(key)
        if hit is not None and (not keep_ir or hit.optimized_ir is not None):
            stats["memory_hits"] += 1
            return hit
        start = time.perf_counter()
        obj = None if keep_ir else carried or _read_disk(key)
        if obj is not None:
            jm = JitModule(_engine_with([obj]), names, None, "disk")
            stats["disk_hits"] += 1
        else:
            obj, optimized = _compile_object(ir_text, keep_ir, speed_level)
            _write_disk(key, obj)
            jm = JitModule(_engine_with([obj]), names, optimized, "compiled")
            stats["compiles"] += 1
        stats["compile_ms"] += (time.perf_counter() - start) * 1e3
        _memory[key] = jm
        return jm


# Object code of modules that ahead-of-time artifacts carry (native helper loops), by
# :func:`module_key`: compile_ir loads them from here before it looks in the disk cache.
_carried: dict[str, bytes] = {}


def module_key(ir_text: str, speed_level: int = 3) -> str:
    """A module's name in artifacts: its IR and speed level (the artifact's target is checked
    against the host when it is loaded, so the target is not part of it)."""
    return hashlib.sha256(f"{speed_level}\n{ir_text}".encode()).hexdigest()


def module_object(ir_text: str, speed_level: int = 3) -> bytes:
    """The object code :func:`compile_ir` loads for ``ir_text`` (for the current target; from
    the disk cache when it is there), for an ahead-of-time artifact to carry."""
    carried = _carried.get(module_key(ir_text, speed_level))
    text = _prefer_wide_vectors(ir_text)
    key = cache_key(text if speed_level == 3 else f"{text}\n; speed level {speed_level}")
    with _lock:
        obj = carried or _read_disk(key)
        if obj is None:
            obj, _ = _compile_object(text, False, speed_level)
            _write_disk(key, obj)
            stats["compiles"] += 1
    return obj


def carry_modules(objects: dict[str, bytes]) -> None:
    """Make the modules of an artifact (object code by :func:`module_key`) available to
    :func:`compile_ir`, which then loads them instead of compiling."""
    with _lock:
        _carried.update(objects)


KERNEL_PLACEHOLDER = "fg_kernel"
_RECORD_MAGIC = b"FGKERNEL1\n"


def kernel_symbol(ir_text: str, speed_level: int = 3) -> tuple[str, str]:
    """Name a one-kernel module's function by its code: ``ir_text`` defines its function as
    ``@"fg_kernel"``; returns the symbol and the text with that name in place, and with the
    optimization level it is to be compiled at recorded in a comment. Equal code gets the
    same symbol, so one engine can hold kernels from anywhere without clashes."""
    ir_text = f"; speed_level={speed_level}\n" + ir_text
    digest = hashlib.sha256(ir_text.encode()).hexdigest()[:24]
    symbol = f"fg_{digest}"
    # A prefix match: a split reduction's phases are @"fg_kernel_p0", ... (kernel_phases).
    return symbol, ir_text.replace(f'@"{KERNEL_PLACEHOLDER}', f'@"{symbol}')


@functools.lru_cache(maxsize=1)
def codegen_identity() -> str:
    """A digest of the code that turns a kernel into LLVM IR (codegen, the runtime's
    emission, fusion's views, dtypes, the IR printer): kernels are cached by a description
    of the kernel rather than by their IR (see :func:`kernel_key`), so a change to any of
    these files must miss the disk cache."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in codegen_files():
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def codegen_files() -> list[Path]:
    """The source files :func:`codegen_identity` digests."""
    root = Path(__file__).resolve().parent.parent
    # os.walk, not Path.rglob: a first call with a warm cache pays this (0.4 ms against 1.3)
    codegen = sorted(Path(d, f) for d, _, fs in os.walk(root / "codegen")
                     for f in fs if f.endswith(".py"))
    return codegen + [
        root / "runtime" / "cpu.py", root / "runtime" / "jit.py", root / "passes" / "fusion.py",
        root / "runtime" / "memory_plan.py", root / "ir" / "kernel_graph.py",
        root / "ops" / "lowering.py",      # each primitive's scalar code, shared with CUDA
        root / "dtypes.py", root / "ir" / "graph.py", root / "ir" / "printer.py"]


def kernel_key(description: str) -> str:
    """The cache key of a kernel described by ``description`` (everything its LLVM IR is
    made from, see ``fusegrad.runtime.cpu.kernel_description``): a warm cache then skips
    building the IR, which costs more than loading the machine code. The code generator's
    tunable constants are part of it: code made under others loops differently."""
    return hashlib.sha256("\n".join([target_identity(), codegen_identity(), tuning(),
                                     description]).encode()).hexdigest()


@dataclass(frozen=True)
class KernelRecord:
    """A compiled kernel: its symbol, its buffers (as indices into the values of its
    description, in the order of its table), and its object code."""

    symbol: str
    buffers: tuple[int, ...]
    obj: bytes

    def to_bytes(self) -> bytes:
        header = json.dumps({"symbol": self.symbol, "buffers": list(self.buffers)})
        return _RECORD_MAGIC + header.encode() + b"\n" + self.obj

    @staticmethod
    def from_bytes(blob: bytes) -> "KernelRecord | None":
        """The record in ``blob``, or None when it is not one (the disk cache checked its
        digest already; this guards against entries of another format)."""
        if not blob.startswith(_RECORD_MAGIC):
            return None
        header, sep, obj = blob[len(_RECORD_MAGIC):].partition(b"\n")
        try:
            meta = json.loads(header)
            symbol, buffers = meta["symbol"], tuple(meta["buffers"])
        except (ValueError, KeyError, TypeError):
            return None
        if not sep or not isinstance(symbol, str) or not re.fullmatch(r"fg_[0-9a-f]+", symbol) \
                or not all(isinstance(b, int) and b >= 0 for b in buffers):
            return None
        return KernelRecord(symbol, buffers, obj)


def find_kernel(key: str) -> KernelRecord | None:
    """The compiled kernel cached under ``key`` (memory, then disk), or None."""
    with _lock:
        hit = _objects.get(key)
        if hit is not None:
            stats["memory_hits"] += 1
            return hit
        blob = _read_disk(key)
        record = KernelRecord.from_bytes(blob) if blob is not None else None
        if record is not None:
            stats["disk_hits"] += 1
            _objects[key] = record
        return record


def build_kernel(key: str | None, ir_text: str, symbol: str,
                 buffers: tuple[int, ...]) -> KernelRecord:
    """Compile one kernel's module (from :func:`kernel_symbol`) and cache it under ``key``
    (in memory and on disk; not at all when ``key`` is None)."""
    level = _SPEED_LEVEL.search(ir_text)
    ir_text = _prefer_wide_vectors(ir_text)
    # Kernels that differ only where their IR does not show it (the length of a 1-D loop is
    # a runtime range) share object code within a process.
    ir_key = "ir:" + cache_key(ir_text)
    with _lock:
        obj = _objects.get(ir_key)
        if obj is not None:
            stats["memory_hits"] += 1
        else:
            start = time.perf_counter()
            obj, _ = _compile_object(ir_text, speed_level=int(level.group(1)) if level else 3)
            _objects[ir_key] = obj
            stats["compiles"] += 1
            stats["compile_ms"] += (time.perf_counter() - start) * 1e3
        record = KernelRecord(symbol, tuple(buffers), obj)
        if key is not None:
            _objects[key] = record
            _write_disk(key, record.to_bytes())
        return record


def link_kernels(records: list[KernelRecord]) -> JitModule:
    """One engine holding the machine code of ``records`` (the same set of kernels linked
    before gives the same engine)."""
    unique = {r.symbol: r for r in records}
    group = "link:" + ",".join(sorted(unique))
    with _lock:
        hit = _memory.get(group)
        if hit is not None:
            return hit
        jm = JitModule(_engine_with([r.obj for r in unique.values()]), list(unique), None,
                       "linked")
        _memory[group] = jm
        return jm


_SPEED_LEVEL = re.compile(r"^; speed_level=(\d)$", re.M)


def clear_memory_cache() -> None:
    """Forget every compiled kernel and engine held in memory (programs keep theirs)."""
    with _lock:
        _memory.clear()
        _objects.clear()


register_ir_compiler(compile_ir)
