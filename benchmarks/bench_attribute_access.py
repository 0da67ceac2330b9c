"""Attribute reads on tensors with and without the placeholders that give a missing torch Tensor
name its "not implemented yet" message (fusegrad.torch_api.install_tensor_placeholders), and
with a class-level ``Tensor.__getattr__`` instead, the design they replace: on CPython, defining
``__getattr__`` slows every read, found or not.

    python benchmarks/bench_attribute_access.py
"""

from __future__ import annotations

import timeit

import fusegrad as fg
from fusegrad.tensor import Tensor
from fusegrad.torch_api import _NotImplementedYet

STATEMENTS = ["t.shape", "t.dtype", "t.grad", "t.requires_grad", "t._data", "t.sum", "t.note"]


def measure(number: int = 200_000, repeat: int = 7) -> dict[str, float]:
    """Best-of-``repeat`` nanoseconds per access for each statement."""
    t = fg.ones(3, requires_grad=True)
    t.note = 1
    return {s: min(timeit.repeat(s, globals={"t": t}, number=number, repeat=repeat)) / number * 1e9
            for s in STATEMENTS}


def main() -> None:
    placeholders = {n: v for n, v in Tensor.__dict__.items() if isinstance(v, _NotImplementedYet)}
    with_placeholders = measure()
    for name in placeholders:
        delattr(Tensor, name)
    try:
        bare = measure()
        Tensor.__getattr__ = lambda self, name: object.__getattribute__(self, name)
        with_getattr = measure()
        del Tensor.__getattr__
    finally:
        for name, value in placeholders.items():
            setattr(Tensor, name, value)
    print(f"ns per read      {'bare':>8}{'placeholders':>14}{'__getattr__':>13}")
    for s in STATEMENTS:
        print(f"{s:<17}{bare[s]:>8.1f}{with_placeholders[s]:>14.1f}{with_getattr[s]:>13.1f}")


if __name__ == "__main__":
    main()
