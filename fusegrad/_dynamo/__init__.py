"""torch._dynamo's names that programs written for torch use with ``torch.compile``:
``utils.counters``."""

from fusegrad._dynamo import utils

__all__ = ["utils"]
