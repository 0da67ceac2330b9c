"""``fusegrad.func``: torch.func's composable function transforms.

``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``, ``jacfwd`` and ``hessian`` are
built on fusegrad's define-by-run autograd (:mod:`fusegrad.autograd.functional`) with
``create_graph``, so they nest and compose: ``jacrev(jacrev(f))``, a Hessian-vector product
``jvp(grad(f), (x,), (v,))``, per-example gradients ``vmap(grad(loss), in_dims=(None, 0))``
over :func:`functional_call`. Forward mode (``jvp``, ``jacfwd``) is computed exactly by
reverse mode until forward-mode rules exist. ``vmap`` runs the function once on batched
tensors, each primitive through its batching rule. All of them run under
:func:`fusegrad.compile`, which traces them into one graph (a compiled ``vmap`` is one batched
graph).

>>> from fusegrad.func import grad, vmap
>>> vmap(grad(lambda x: (x ** 3).sum()))(fusegrad.tensor([[1., 2.], [3., 4.]]))
tensor([[ 3., 12.],
        [27., 48.]])
"""

from fusegrad.func._functional_call import functional_call, stack_module_state
from fusegrad.func._transforms import grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp
from fusegrad.func._vmap import vmap
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "vmap",
           "functional_call", "stack_module_state"]


def __getattr__(name: str):
    raise _missing_attribute("torch.func", "fusegrad.func", name)
