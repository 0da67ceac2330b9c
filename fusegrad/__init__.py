"""fusegrad: PyTorch-style tensors and autograd, compiled to fused native kernels.

>>> import fusegrad as fg
>>> x = fg.tensor([1., 2., 3.], requires_grad=True)
>>> (x * x).sum().backward()
>>> x.grad
tensor([2., 4., 6.])
"""

from fusegrad import dtypes as _dtypes
from fusegrad._tensor_str import get_printoptions, set_printoptions
from fusegrad.autograd.grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from fusegrad.device import device
from fusegrad.dtypes import (
    bfloat16,
    complex64,
    complex128,
    float16,
    float32,
    float64,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    promote_types,
    set_default_dtype,
    uint8,
)
from fusegrad.ops import creation as _creation
from fusegrad.ops import functional as _F
from fusegrad.ops import methods as _methods  # noqa: F401  (installs Tensor methods)
from fusegrad.ops import registry as _public_ops
from fusegrad.ops.creation import (
    Generator,
    arange,
    as_tensor,
    default_generator,
    empty,
    empty_like,
    eye,
    from_dlpack,
    from_numpy,
    full,
    full_like,
    get_rng_state,
    initial_seed,
    linspace,
    logspace,
    manual_seed,
    normal,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randint_like,
    randn,
    randn_like,
    randperm,
    scalar_tensor,
    seed,
    set_rng_state,
    tensor,
    zeros,
    zeros_like,
)
from fusegrad.tensor import Size, Tensor

bool = _dtypes.bool_  # noqa: A001 - torch.bool
half, float, double = float16, float32, float64  # noqa: A001
cfloat, cdouble = complex64, complex128
short, int, long = int16, int32, int64  # noqa: A001
dtype = _dtypes.DType

# Functional forms of the tensor ops (fusegrad.exp(x), fusegrad.cat([...]), ...), from the
# op registry: each op records there, where it is defined, whether torch has it at top level.
globals().update(_public_ops.torch_functions())


def is_tensor(obj) -> "bool":
    """True for fusegrad tensors (parameters included)."""
    return isinstance(obj, Tensor)


def numel(x: Tensor) -> "int":
    return x.numel()


def is_floating_point(x: Tensor) -> "bool":
    return x.is_floating_point()


def is_complex(x: Tensor) -> "bool":
    return x.is_complex()


def result_type(a, b) -> _dtypes.DType:
    return _dtypes.result_type(a, b)


def can_cast(from_: _dtypes.DType, to: _dtypes.DType) -> "bool":
    return from_.category <= to.category


from fusegrad import (  # noqa: E402
    autograd,  # noqa: E402
    backends,  # noqa: E402  (torch.backends: the TF32 switch)
    cuda,  # noqa: E402  (torch.cuda's queries; imports no CUDA package)
    ir,  # noqa: E402
    nn,  # noqa: E402
    optim,  # noqa: E402
)

# Ops registered above the ops layer (nn.functional's softmax) are installed now too.
globals().update(_public_ops.torch_functions())
_methods.install_registered_methods()

from fusegrad.backends import (  # noqa: E402
    get_float32_matmul_precision,
    set_float32_matmul_precision,
)
from fusegrad.tracer import (  # noqa: E402
    ConcretizationError,
    compile,
    grad,
    mark_dynamic,
    trace,
    value_and_grad,
    vjp,
)

# isort: split
# Checkpoints, safetensors, dtype limits and the kernel thread count.
from fusegrad import safetensors  # noqa: E402
from fusegrad.runtime.cpu import get_num_threads, set_num_threads  # noqa: E402
from fusegrad.runtime.errors import OutOfMemoryError  # noqa: E402
from fusegrad.serialization import load, save  # noqa: E402
from fusegrad.tracer import device_slots as _device_slots  # noqa: E402, F401  (fills the device slots)
from fusegrad.type_info import finfo, iinfo  # noqa: E402
from fusegrad.version import __version__  # noqa: E402

# isort: split
# torch.utils.data, reachable as fusegrad.utils.data (torch.optim.lr_scheduler comes with optim);
# data parallelism over MPI (mpi4py is imported only when a process group is made).
from fusegrad import (  # noqa: E402
    distributed,  # noqa: E402
    utils,  # noqa: E402
)

# isort: split
# Ahead-of-time artifacts: fusegrad.aot.compile / save / load.
from fusegrad import aot  # noqa: E402

# isort: split
# torch._dynamo's names that torch programs use with compile (OptimizedModule, utils.counters).
from fusegrad import _dynamo  # noqa: E402

# isort: split
# torch.linalg's norms and products, torch.special's names, torch.fft's transforms; a torch
# name fusegrad lacks raises an AttributeError that says so.
from fusegrad import fft, linalg, special  # noqa: E402

# isort: split
# torch.distributions (probability distributions built from the tensor ops above) and
# torch.profiler (op, kernel and record_function timings, tables and Chrome traces).
from fusegrad import distributions, profiler  # noqa: E402

# isort: split
# torch.func's transforms (grad, vjp, jvp, jacrev, hessian, vmap, functional_call) on autograd.
from fusegrad import func  # noqa: E402
from fusegrad.func import vmap  # noqa: E402

# isort: split
# Mixed precision: torch.autocast and its per-thread state, torch.amp (GradScaler), and the
# deprecated torch.cpu.amp / torch.cuda.amp spellings.
from fusegrad import amp, cpu  # noqa: E402
from fusegrad.amp import GradScaler  # noqa: E402
from fusegrad.amp.autocast_mode import (  # noqa: E402
    autocast,
    autocast_decrement_nesting,
    autocast_increment_nesting,
    clear_autocast_cache,
    get_autocast_cpu_dtype,
    get_autocast_dtype,
    get_autocast_gpu_dtype,
    is_autocast_cache_enabled,
    is_autocast_cpu_enabled,
    is_autocast_enabled,
    set_autocast_cache_enabled,
    set_autocast_cpu_dtype,
    set_autocast_cpu_enabled,
    set_autocast_dtype,
    set_autocast_enabled,
    set_autocast_gpu_dtype,
)
from fusegrad.cuda import amp as _cuda_amp  # noqa: E402, F401  (fusegrad.cuda.amp)
from fusegrad.torch_api import install_tensor_placeholders as _install_placeholders  # noqa: E402
from fusegrad.torch_api import missing_attribute as _missing_attribute  # noqa: E402

_install_placeholders(Tensor)


def __getattr__(name: str):
    raise _missing_attribute("torch", "fusegrad", name)
