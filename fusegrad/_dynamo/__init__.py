"""torch._dynamo's names that programs written for torch use with ``torch.compile``:
``OptimizedModule`` (what compiling a module returns) and ``utils.counters``."""

from fusegrad._dynamo import utils
from fusegrad._dynamo.eval_frame import OptimizedModule

__all__ = ["OptimizedModule", "utils"]
