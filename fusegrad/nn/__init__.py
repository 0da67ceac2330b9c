"""``fusegrad.nn``: modules, parameters, initializers and functional ops with torch.nn's API.

>>> import fusegrad as torch
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> loss = torch.nn.CrossEntropyLoss()(model(torch.randn(3, 4)), torch.tensor([0, 1, 1]))
"""

from fusegrad.nn import functional, init, utils  # noqa: F401
from fusegrad.nn.modules import *  # noqa: F401,F403
from fusegrad.nn.modules import __all__ as _modules_all
from fusegrad.nn.parameter import Parameter
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["Parameter", "functional", "init", "utils"] + list(_modules_all)


def __getattr__(name: str):
    raise _missing_attribute("torch.nn", "fusegrad.nn", name)
