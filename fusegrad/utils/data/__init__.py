"""``fusegrad.utils.data``: datasets, samplers and the DataLoader, under torch.utils.data's
names and with its semantics."""

from fusegrad.torch_api import missing_attribute as _missing_attribute
from fusegrad.utils.data._worker import WorkerInfo, get_worker_info
from fusegrad.utils.data.collate import default_collate, default_convert
from fusegrad.utils.data.dataloader import DataLoader
from fusegrad.utils.data.dataset import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    Subset,
    TensorDataset,
    random_split,
)
from fusegrad.utils.data.sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = [
    "Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "ChainDataset", "Subset",
    "random_split", "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
    "WeightedRandomSampler",
    "BatchSampler", "DistributedSampler", "DataLoader", "default_collate", "default_convert",
    "get_worker_info", "WorkerInfo",
]


def __getattr__(name: str):
    raise _missing_attribute("torch.utils.data", "fusegrad.utils.data", name)
