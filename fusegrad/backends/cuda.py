"""torch.backends.cuda: ``matmul.allow_tf32``, the switch for TF32 in float32 matmuls on CUDA
(one setting with :func:`fusegrad.set_float32_matmul_precision`: True is ``"high"``, False
``"highest"``)."""

from __future__ import annotations

from fusegrad.config import config

__all__ = ["matmul", "cuBLASModule"]


class cuBLASModule:
    """torch.backends.cuda.matmul: the cuBLAS switches (``allow_tf32``); any other
    attribute raises torch's error."""

    def __getattr__(self, name: str):
        if name == "allow_tf32":
            return config.float32_matmul_precision != "highest"
        raise AttributeError(f"Unknown attribute {name}")

    def __setattr__(self, name: str, value) -> None:
        if name == "allow_tf32":
            config.float32_matmul_precision = "high" if value else "highest"
            return
        raise AttributeError(f"Unknown attribute {name}")


matmul = cuBLASModule()
