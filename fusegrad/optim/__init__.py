"""``fusegrad.optim``: SGD, Adam and AdamW with torch.optim's API and update formulas."""

from fusegrad.optim.adam import Adam, AdamW
from fusegrad.optim.optimizer import Optimizer
from fusegrad.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]
