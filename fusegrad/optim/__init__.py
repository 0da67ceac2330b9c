"""``fusegrad.optim``: torch.optim's optimizers (SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta,
Adamax, NAdam, RAdam, Rprop, ASGD, LBFGS, Adafactor, Muon; SparseAdam, which refuses the dense
gradients that are all fusegrad has) with its API and update formulas, and ``lr_scheduler``."""

from fusegrad.optim import lr_scheduler
from fusegrad.optim.adadelta import Adadelta
from fusegrad.optim.adafactor import Adafactor
from fusegrad.optim.adagrad import Adagrad
from fusegrad.optim.adam import Adam, AdamW
from fusegrad.optim.adamax import Adamax
from fusegrad.optim.asgd import ASGD
from fusegrad.optim.lbfgs import LBFGS
from fusegrad.optim.muon import Muon
from fusegrad.optim.nadam import NAdam
from fusegrad.optim.optimizer import Optimizer
from fusegrad.optim.radam import RAdam
from fusegrad.optim.rmsprop import RMSprop
from fusegrad.optim.rprop import Rprop
from fusegrad.optim.sgd import SGD
from fusegrad.optim.sparse_adam import SparseAdam
from fusegrad.torch_api import missing_attribute as _missing_attribute

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax",
           "NAdam", "RAdam", "Rprop", "ASGD", "LBFGS", "Adafactor", "Muon", "SparseAdam",
           "lr_scheduler"]


def __getattr__(name: str):
    raise _missing_attribute("torch.optim", "fusegrad.optim", name)
