"""Matmul kernels through cuBLASLt: which kernels it can take, and the calls that run them.

A CUDA program's matmul kernel (:class:`fusegrad.ir.kernel_graph.Kernel` of kind
``matmul``) runs as one ``cublasLtMatmul`` when its operands are buffers (or transposed,
sliced or batched views of them) of a floating dtype: :func:`plan_blas` says how, or None,
and then the generated tiled kernel (:mod:`fusegrad.codegen.gpu_lowering`) runs it instead.

- **Row-major through column-major**: cuBLAS is column-major, and a row-major ``C = A @ B``
  is the column-major ``C^T = B^T A^T``; a row-major matrix read as column-major is its
  transpose, so the call passes ``B`` as cuBLAS's first operand and ``A`` as its second, and
  a transposed view (strides ``(1, ld)``) becomes cuBLAS's ``CUBLAS_OP_T``.
- **Fused epilogues**: a bias add over the rows (``x @ w.t() + b``) is
  ``CUBLASLT_EPILOGUE_BIAS``; a ReLU or tanh-approximated GELU of the result is
  ``..._RELU``/``..._GELU`` (``_AUX`` when the pre-activation is kept for the backward:
  cuBLASLt writes it beside the result). Activations are recognised by what they compute,
  not by how the trace spelled them: the nodes between the product and a value that depend
  on nothing else are run on probe values and compared with ReLU and GELU. What cuBLASLt
  does not fuse runs after it as an elementwise kernel over the product in memory (the rest
  of the matmul kernel, :attr:`BlasMatmul.rest`).
- **TF32**: float32 products use ``CUBLAS_COMPUTE_32F_FAST_TF32`` when
  ``fusegrad.backends.cuda.matmul.allow_tf32`` is set (or
  ``fusegrad.set_float32_matmul_precision("high")``), else ``CUBLAS_COMPUTE_32F``, read at
  each call as torch does.
- **The library**: ``libcublasLt`` from the ``nvidia-cublas`` wheel (``pip install
  'fusegrad[cuda]'``), ``FUSEGRAD_CUBLASLT``, ``CUDA_HOME`` or the loader's path, through
  ctypes: the dozen functions below, their signatures those of ``cublasLt.h`` (checked
  against the library's symbols by the tests where the wheel is installed).
  ``FUSEGRAD_CUDA_BLAS=kernel`` keeps every matmul in the generated kernel.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import threading
from dataclasses import dataclass

import numpy as np

from fusegrad import dtypes
from fusegrad.config import config
from fusegrad.ir.graph import Literal, Node, Value
from fusegrad.ir.kernel_graph import Kernel, KernelGraph, View, identity_view
from fusegrad.runtime.cuda_compile import find_cuda_library
from fusegrad.symint import SymInt, evaluate_dim, known_multiple

__all__ = ["find_cublaslt", "load_cublaslt", "cublaslt_for", "plan_blas", "gemm_at", "tf32_allowed",
           "BlasMatmul", "Gemm", "CublasLt", "SIGNATURES", "EPILOGUE", "COMPUTE", "DATA_TYPE"]

# cudaDataType_t (library_types.h)
DATA_TYPE = {dtypes.float32: 0, dtypes.float64: 1, dtypes.float16: 2, dtypes.bfloat16: 14}
# cublasComputeType_t (cublas_api.h)
COMPUTE = {"32F": 68, "32F_FAST_TF32": 77, "64F": 70}
# cublasLtEpilogue_t (cublasLt.h)
EPILOGUE = {"DEFAULT": 1, "RELU": 2, "BIAS": 4, "RELU_BIAS": 6, "GELU": 32, "GELU_AUX": 160,
            "GELU_BIAS": 36, "GELU_AUX_BIAS": 164}
# cublasLtMatmulDescAttributes_t, cublasLtMatrixLayoutAttribute_t,
# cublasLtMatmulPreferenceAttributes_t (cublasLt.h)
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE, DESC_BIAS_POINTER = 3, 4, 7, 8
DESC_EPILOGUE_AUX_POINTER, DESC_EPILOGUE_AUX_LD = 11, 12
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
PREF_MAX_WORKSPACE_BYTES = 1
PREF_MIN_ALIGNMENT = {"A": 5, "B": 6, "C": 7, "D": 8}
OP_N, OP_T = 0, 1
STATUS_SUCCESS, STATUS_NOT_SUPPORTED = 0, 15

WORKSPACE_BYTES = 32 << 20      # what torch gives cuBLASLt on Hopper


class HeuristicResult(ctypes.Structure):
    """``cublasLtMatmulHeuristicResult_t``: the algorithm (``cublasLtMatmulAlgo_t``, 8
    words) and what it needs."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


_P = ctypes.c_void_p
_OUT = ctypes.POINTER(ctypes.c_void_p)
_I = ctypes.c_int
# name -> (result type, argument types), as cublasLt.h declares them (cublasStatus_t is int).
SIGNATURES: dict[str, tuple] = {
    "cublasLtGetVersion": (ctypes.c_size_t, []),
    "cublasLtGetStatusString": (ctypes.c_char_p, [_I]),
    "cublasLtCreate": (_I, [_OUT]),
    "cublasLtDestroy": (_I, [_P]),
    "cublasLtMatmulDescCreate": (_I, [_OUT, _I, _I]),
    "cublasLtMatmulDescSetAttribute": (_I, [_P, _I, _P, ctypes.c_size_t]),
    "cublasLtMatmulDescDestroy": (_I, [_P]),
    "cublasLtMatrixLayoutCreate": (_I, [_OUT, _I, ctypes.c_uint64, ctypes.c_uint64,
                                        ctypes.c_int64]),
    "cublasLtMatrixLayoutSetAttribute": (_I, [_P, _I, _P, ctypes.c_size_t]),
    "cublasLtMatrixLayoutDestroy": (_I, [_P]),
    "cublasLtMatmulPreferenceCreate": (_I, [_OUT]),
    "cublasLtMatmulPreferenceSetAttribute": (_I, [_P, _I, _P, ctypes.c_size_t]),
    "cublasLtMatmulPreferenceDestroy": (_I, [_P]),
    "cublasLtMatmulAlgoGetHeuristic": (_I, [_P, _P, _P, _P, _P, _P, _P, _I,
                                            ctypes.POINTER(HeuristicResult),
                                            ctypes.POINTER(_I)]),
    "cublasLtMatmul": (_I, [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P,
                            ctypes.c_size_t, _P]),
}


def find_cublaslt(driver_version: int | None = None) -> str | None:
    """Path of ``libcublasLt`` (``FUSEGRAD_CUBLASLT``, the ``nvidia-cublas`` wheels,
    ``CUDA_HOME``, the loader's path), the driver's CUDA major first; None without one."""
    return find_cuda_library("cublasLt", "FUSEGRAD_CUBLASLT", driver_version)


def load_cublaslt(path: str) -> ctypes.CDLL:
    """``libcublasLt`` at ``path`` with :data:`SIGNATURES`' types on its functions."""
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


_lock = threading.Lock()


def cublaslt_for(drv) -> "CublasLt | None":
    """The cuBLASLt of driver ``drv`` (made once, kept on the driver), or None:
    ``FUSEGRAD_CUDA_BLAS=kernel``, no library found, or one that does not load. A driver
    with a ``cublaslt_library`` of its own (the simulated driver's stand-in, or None for
    none) uses that one."""
    if config.cuda_blas == "kernel":
        return None
    with _lock:
        if "_cublaslt" in vars(drv):
            return drv._cublaslt
        lib = getattr(drv, "cublaslt_library", None)
        if lib is None and not hasattr(drv, "cublaslt_library"):
            version = getattr(drv, "driver_version", None)
            try:
                path = find_cublaslt(version() if callable(version) else None)
                lib = load_cublaslt(path) if path else None
            except (OSError, AttributeError):     # a library too old for these symbols
                lib = None
        drv._cublaslt = CublasLt(lib, drv) if lib is not None else None
        return drv._cublaslt


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Gemm:
    """A row-major batched ``D = epilogue(A @ B (+ bias))`` as cuBLASLt is asked for it:
    ``m x k`` times ``k x n``, ``batch`` times at the given element strides; an operand
    with ``trans_*`` is stored transposed (its strides ``(1, ld)``). ``align_*`` is the
    byte alignment of each pointer (at most 256), for the algorithm heuristic."""

    dtype: object
    m: int
    n: int
    k: int
    batch: int
    trans_a: bool
    trans_b: bool
    lda: int
    ldb: int
    stride_a: int
    stride_b: int
    epilogue: str = "DEFAULT"
    align_a: int = 256
    align_b: int = 256

    @property
    def ldc(self) -> int:
        return self.n

    @property
    def stride_c(self) -> int:
        return self.m * self.n


@dataclass
class BlasMatmul:
    """How matmul kernel ``kernel`` runs through cuBLASLt: ``gemm`` reads ``a`` and ``b``
    (buffer values and element offsets) and writes ``out``'s buffer (``written_slot_of``:
    the product's when ``out`` has none of its own), adding ``bias`` and keeping the
    pre-activation in ``aux``'s buffer; ``rest`` is the elementwise kernel of what is left
    of the kernel's epilogue (None when nothing is)."""

    kernel: Kernel
    gemm: Gemm
    a: tuple[Value, int]
    b: tuple[Value, int]
    out: Value
    product: Value
    bias: tuple[Value, int] | None = None
    aux: Value | None = None
    rest: Kernel | None = None


def _matrix(view: View) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of the last two axes of ``view``, or None when they
    are not a column- or row-major matrix."""
    r, c = view.shape[-2:]
    s0, s1 = view.strides[-2:]
    if c == 1:
        s1 = 1
    if r == 1:
        s0 = max(c, 1) if s1 == 1 else s0
    if s1 == 1 and s0 >= max(c, 1):
        return False, s0
    if s0 == 1 and s1 >= max(r, 1):
        return True, s1
    return None


def _batch_stride(view: View, batch_shape: tuple[int, ...]) -> int | None:
    """The one element stride between consecutive matrices of ``view`` over the output's
    ``batch_shape``; 0 when it has a single matrix (broadcast); None when its batch axes do
    not collapse to one stride."""
    shape, strides = view.shape[:-2], view.strides[:-2]
    if math.prod(shape) == 1:
        return 0
    if tuple(shape) != tuple(batch_shape):
        return None
    dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
    for (_, s0), (d1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * d1:
            return None
    return dims[-1][1]


def _alignment(offset, itemsize: int) -> int:
    """Byte alignment of an allocation's start plus ``offset`` elements (allocations start
    on 512 bytes), capped at 256; of a symbolic offset, the alignment it has at every size."""
    nbytes = offset * itemsize
    align = 256
    while align > 1 and not known_multiple(nbytes, align):
        align //= 2
    return align


def gemm_at(g: Gemm, bindings: dict) -> Gemm:
    """``g`` with its symbolic sizes, leading dimensions and strides evaluated under
    ``bindings`` (symbol -> size): one call's problem. cuBLASLt's plan (its heuristic's
    algorithm) is then made per size and kept, as torch's is."""
    return dataclasses.replace(g, **{f.name: evaluate_dim(getattr(g, f.name), bindings)
                                     for f in dataclasses.fields(g)
                                     if isinstance(getattr(g, f.name), SymInt)})


def _relu(x: np.ndarray) -> np.ndarray:
    return np.where(x <= 0, np.zeros_like(x), x)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return 0.5 * x64 * (1 + np.tanh(0.7978845608028654 * (x64 + 0.044715 * x64 ** 3)))


# Probe values for recognising an activation: both signs, zero, small and large magnitudes.
_PROBE = np.concatenate([np.linspace(-6, 6, 97), [0.0, 1e-3, -1e-3, 20.0, -20.0, 0.5, -0.5]])


def _activation(kernel: Kernel, start: Value, dt) -> tuple[str, Value, set[Node]] | None:
    """("RELU" | "GELU", the value, the nodes computing it) when a value of ``kernel`` in
    ``dt`` is ReLU or tanh-GELU of ``start`` and its nodes read nothing but ``start``,
    each other and literals; the first such value in the kernel's order."""
    np_dt = dt.np_dtype
    env: dict[Value, np.ndarray] = {start: _PROBE.astype(np_dt)}
    deps: dict[Value, set[Node]] = {start: set()}
    for node in kernel.nodes:
        if node.op in ("matmul",) or not node.inputs:
            continue
        if not all(isinstance(x, Literal) or x in env for x in node.inputs):
            continue
        if any(isinstance(x, Value) and x.type.shape != start.type.shape for x in node.inputs):
            continue
        args = [np.asarray(x.value, dtype=x.dtype.np_dtype) if isinstance(x, Literal)
                else env[x] for x in node.inputs]
        try:
            with np.errstate(all="ignore"):
                out = np.asarray(node.prim.impl(*args, **node.attrs))
        except Exception:
            continue
        if out.shape != env[start].shape:
            continue
        env[node.output] = out
        deps[node.output] = {node}.union(*(deps[x] for x in node.inputs if isinstance(x, Value)))
        if node.output.type.dtype is not dt:
            continue
        x = env[start]
        if np.array_equal(out, _relu(x)):
            return "RELU", node.output, deps[node.output]
        tol = 8 * np.finfo(np_dt).eps
        if np.allclose(out.astype(np.float64), _gelu_tanh(x), rtol=tol, atol=tol):
            return "GELU", node.output, deps[node.output]
    return None


def plan_blas(kernel: Kernel, kg: KernelGraph) -> BlasMatmul | None:
    """How cuBLASLt runs matmul kernel ``kernel``, or None when it cannot (an operand
    computed inside the kernel, a dtype cuBLASLt has no float GEMM for, a layout that is
    not a strided batch of matrices); see the module docstring."""
    mm = next(n for n in kernel.nodes if n.op == "matmul")
    dt = mm.output.type.dtype
    if dt not in DATA_TYPE:
        return None
    internal = set(kernel.nodes)
    views = []
    for v in mm.inputs:
        if not isinstance(v, Value) or v.producer in internal or v.type.dtype is not dt:
            return None
        view = kg.views.get(v) or identity_view(v)
        if view.base.producer in internal or len(view.shape) < 2:
            return None
        views.append(view)
    va, vb = views
    out_shape = mm.output.type.shape
    batch_shape, (m, n), k = out_shape[:-2], out_shape[-2:], va.shape[-1]
    la, lb = _matrix(va), _matrix(vb)
    sa, sb = _batch_stride(va, batch_shape), _batch_stride(vb, batch_shape)
    if la is None or lb is None or sa is None or sb is None or 0 in (m, n, k):
        return None
    batch = math.prod(batch_shape)
    if batch > 1 and sb == 0 and not la[0] and sa == m * la[1]:
        m, batch, sa = m * batch, 1, 0      # a batch of rows times one matrix: one GEMM
    elif batch > 1 and (sa == 0 or sb == 0):
        return None       # a broadcast batch (a stride of 0): the generated kernel
    item = dt.itemsize
    gemm = Gemm(dt, m, n, k, batch, la[0], lb[0], la[1], lb[1], sa, sb,
                align_a=_alignment(va.offset, item), align_b=_alignment(vb.offset, item))

    users: dict[Value, list[Node]] = {}
    for node in kernel.nodes:
        for x in node.inputs:
            if isinstance(x, Value):
                users.setdefault(x, []).append(node)
    outputs = set(kernel.outputs)
    out, fused, bias, aux, epilogue = mm.output, {mm}, None, None, []
    add = users.get(out, [None])[0]
    if out not in outputs and len(users.get(out, [])) == 1 and add.op == "add":
        other = add.inputs[1] if add.inputs[0] is out else add.inputs[0]
        if isinstance(other, Value) and other is not out and other.producer not in internal \
                and other.type.dtype is dt and other.type.shape[-1:] == (n,) \
                and math.prod(other.type.shape) == n and add.output.type.shape == out_shape:
            view = kg.views.get(other) or identity_view(other)
            # (a bias at an offset that is not 16-byte aligned: the generated kernel adds it)
            if view.base.producer not in internal and (view.strides[-1] == 1 or n == 1) \
                    and _alignment(view.offset, item) >= 16:
                bias, out = (view.base, view.offset), add.output
                fused.add(add)
                epilogue.append("BIAS")
    act = _activation(kernel, out, dt)
    if act is not None:
        name, value, nodes = act
        inner = {node.output for node in nodes} - {value}
        private = all(v not in outputs and all(u in nodes for u in users.get(v, []))
                      for v in inner)
        keep = out in outputs
        if private and not keep and all(u in nodes for u in users.get(out, [])):
            fused |= nodes
            out = value
            epilogue.insert(0, name)
        elif private and keep and name == "GELU" and known_multiple(n, 8) and gemm.batch == 1:
            # cuBLASLt keeps the pre-activation for the backward (its leading dimension
            # must be a multiple of 8; one matrix, so no aux batch stride to set)
            fused |= nodes
            aux, out = out, value
            epilogue.insert(0, "GELU_AUX")
    gemm = dataclasses.replace(gemm, epilogue="_".join(epilogue) or "DEFAULT")
    rest_outputs = [v for v in kernel.outputs if v is not out and v is not aux]
    rest = None
    if rest_outputs:
        nodes = [node for node in kernel.nodes if node not in fused]
        rest = Kernel(f"{kernel.name}e", "elementwise", nodes, kernel.shape, (),
                      list(kernel.inputs) + [out], rest_outputs,
                      {v: "full" for v in rest_outputs})
    return BlasMatmul(kernel, gemm, (va.base, va.offset), (vb.base, vb.offset), out, mm.output,
                      bias, aux, rest)


# --------------------------------------------------------------------------- calls


def tf32_allowed() -> bool:
    """Whether float32 products may use TF32 now (torch's switches, read at each call)."""
    return config.float32_matmul_precision != "highest"


class CublasLt:
    """cuBLASLt on one driver: a handle and a workspace per device, and the descriptors
    and algorithm of each :class:`Gemm` made once (per compute type)."""

    def __init__(self, lib, drv):
        self.lib, self.drv = lib, drv
        self.handles: dict[int, int] = {}
        self.workspaces: dict[int, int] = {}
        self.plans: dict[tuple, tuple] = {}
        self.workspace_bytes = getattr(lib, "workspace_bytes", WORKSPACE_BYTES)

    def _check(self, status: int, what: str) -> None:
        if status != STATUS_SUCCESS:
            text = self.lib.cublasLtGetStatusString(status)
            text = text.decode() if isinstance(text, bytes) else text
            raise RuntimeError(f"CUDA error: {text or status} when calling `{what}`")

    def _call(self, name: str, *args) -> None:
        self._check(getattr(self.lib, name)(*args), name)

    def _new(self, name: str, *args) -> int:
        out = ctypes.c_void_p()
        self._call(name, ctypes.pointer(out), *args)
        return out.value

    def _set(self, name: str, obj: int, attr: int, value) -> None:
        self._call(name, obj, attr, ctypes.addressof(value), ctypes.sizeof(value))

    def _device(self, device: int) -> tuple[int, int]:
        if device not in self.handles:
            self.handles[device] = self._new("cublasLtCreate")
            self.workspaces[device] = self.drv.malloc(self.workspace_bytes) \
                if self.workspace_bytes else 0
        return self.handles[device], self.workspaces[device]

    def _layout(self, dt: int, rows: int, cols: int, ld: int, batch: int, stride: int) -> int:
        layout = self._new("cublasLtMatrixLayoutCreate", dt, rows, cols, ld)
        if batch > 1:
            self._set("cublasLtMatrixLayoutSetAttribute", layout, LAYOUT_BATCH_COUNT,
                      ctypes.c_int32(batch))
            self._set("cublasLtMatrixLayoutSetAttribute", layout, LAYOUT_STRIDED_BATCH_OFFSET,
                      ctypes.c_int64(stride))
        return layout

    def _plan(self, device: int, g: Gemm, compute: str) -> tuple:
        """(descriptor, layouts of cuBLAS's A, B, D, algorithm) of ``g``: the row-major
        problem as the column-major ``D^T = B^T A^T`` (see the module docstring)."""
        key = (device, g, compute)
        found = self.plans.get(key)
        if found is not None:
            return found
        handle, _ = self._device(device)
        dt = DATA_TYPE[g.dtype]
        scale = DATA_TYPE[dtypes.float64] if g.dtype is dtypes.float64 else \
            DATA_TYPE[dtypes.float32]
        desc = self._new("cublasLtMatmulDescCreate", COMPUTE[compute], scale)
        set_desc = "cublasLtMatmulDescSetAttribute"
        self._set(set_desc, desc, DESC_TRANSA, ctypes.c_int32(OP_T if g.trans_b else OP_N))
        self._set(set_desc, desc, DESC_TRANSB, ctypes.c_int32(OP_T if g.trans_a else OP_N))
        self._set(set_desc, desc, DESC_EPILOGUE, ctypes.c_uint32(EPILOGUE[g.epilogue]))
        # cuBLAS's A is our B: stored n x k (k x n when transposed), column-major.
        rows, cols = (g.k, g.n) if g.trans_b else (g.n, g.k)
        layout_a = self._layout(dt, rows, cols, g.ldb, g.batch, g.stride_b)
        # cuBLAS's B is our A: stored k x m (m x k when transposed).
        rows, cols = (g.m, g.k) if g.trans_a else (g.k, g.m)
        layout_b = self._layout(dt, rows, cols, g.lda, g.batch, g.stride_a)
        layout_d = self._layout(dt, g.n, g.m, g.ldc, g.batch, g.stride_c)
        pref = self._new("cublasLtMatmulPreferenceCreate")
        set_pref = "cublasLtMatmulPreferenceSetAttribute"
        self._set(set_pref, pref, PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(self.workspace_bytes))
        # cuBLAS's A and B are our B and A; C and D are the output (256-byte aligned).
        for which, align in (("A", g.align_b), ("B", g.align_a), ("C", 256), ("D", 256)):
            self._set(set_pref, pref, PREF_MIN_ALIGNMENT[which], ctypes.c_uint32(align))
        result, count = HeuristicResult(), ctypes.c_int(0)
        self._call("cublasLtMatmulAlgoGetHeuristic", handle, desc, layout_a, layout_b,
                   layout_d, layout_d, pref, 1, ctypes.pointer(result), ctypes.pointer(count))
        self._call("cublasLtMatmulPreferenceDestroy", pref)
        if count.value < 1:
            self._check(STATUS_NOT_SUPPORTED, f"cublasLtMatmulAlgoGetHeuristic for {g}")
        found = self.plans[key] = (desc, layout_a, layout_b, layout_d, result)
        return found

    def matmul(self, device: int, g: Gemm, a: int, b: int, d: int, bias: int = 0, aux: int = 0,
               stream: int = 0) -> None:
        """``d = epilogue(a @ b + bias)`` on ``stream`` (row-major device pointers); the
        pre-activation goes to ``aux`` for a ``GELU_AUX`` epilogue."""
        compute = "64F" if g.dtype is dtypes.float64 else \
            "32F_FAST_TF32" if g.dtype is dtypes.float32 and tf32_allowed() else "32F"
        desc, layout_a, layout_b, layout_d, algo = self._plan(device, g, compute)
        handle, workspace = self._device(device)
        set_desc = "cublasLtMatmulDescSetAttribute"
        if bias:
            self._set(set_desc, desc, DESC_BIAS_POINTER, ctypes.c_void_p(bias))
        if aux:
            self._set(set_desc, desc, DESC_EPILOGUE_AUX_POINTER, ctypes.c_void_p(aux))
            self._set(set_desc, desc, DESC_EPILOGUE_AUX_LD, ctypes.c_int64(g.ldc))
        scalar = ctypes.c_double if g.dtype is dtypes.float64 else ctypes.c_float
        alpha, beta = scalar(1.0), scalar(0.0)
        self._call("cublasLtMatmul", handle, desc, ctypes.addressof(alpha), b, layout_a, a,
                   layout_b, ctypes.addressof(beta), d, layout_d, d, layout_d,
                   ctypes.addressof(algo.algo), workspace, self.workspace_bytes, stream)
