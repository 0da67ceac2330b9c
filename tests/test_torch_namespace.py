"""`import fusegrad as torch` reaches torch's submodules; missing torch names say they are missing."""

from __future__ import annotations

import importlib
import math
import pickle

import numpy as np
import pytest

import fusegrad as torch
from fusegrad.torch_api import NAMESPACES, torch_names

SUBMODULES = ["nn", "nn.functional", "nn.init", "nn.utils", "nn.utils.rnn", "optim", "optim.lr_scheduler",
              "utils", "utils.data", "linalg", "autograd", "autograd.functional",
              "autograd.forward_ad"]


@pytest.mark.parametrize("path", SUBMODULES)
def test_submodule_is_an_attribute_chain(path):
    obj = torch
    for part in path.split("."):
        obj = getattr(obj, part)
    assert obj is importlib.import_module(f"fusegrad.{path}")


@pytest.mark.parametrize("path", SUBMODULES)
def test_submodule_imports_by_dotted_name(path):
    module = importlib.import_module(f"fusegrad.{path}")
    assert module.__name__ == f"fusegrad.{path}"


def test_script_style_imports():
    import fusegrad.optim.lr_scheduler
    from fusegrad.autograd.functional import jacobian
    from fusegrad.nn import functional as F
    from fusegrad.nn.utils import clip_grad_norm_
    from fusegrad.optim.lr_scheduler import StepLR
    from fusegrad.utils.data import DataLoader, TensorDataset

    assert fusegrad.optim.lr_scheduler.StepLR is StepLR is torch.optim.lr_scheduler.StepLR
    assert F.relu is torch.nn.functional.relu
    assert DataLoader is torch.utils.data.DataLoader and TensorDataset is torch.utils.data.TensorDataset
    assert clip_grad_norm_ is torch.nn.utils.clip_grad_norm_
    assert jacobian is torch.autograd.functional.jacobian


def test_a_training_script_runs_under_the_torch_name():
    nn, F = torch.nn, torch.nn.functional
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    for x, y in torch.utils.data.DataLoader(data, batch_size=4):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)


# --------------------------------------------------------------------------- linalg


def test_linalg_vector_norms_match_numpy():
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    x = torch.tensor(a)
    for ord in (2, 1, 3, math.inf, -math.inf, 0):
        np.testing.assert_allclose(torch.linalg.vector_norm(x, ord).numpy(),
                                   np.linalg.norm(a.ravel(), ord), rtol=1e-5)
        np.testing.assert_allclose(torch.linalg.vector_norm(x, ord, dim=1).numpy(),
                                   np.linalg.norm(a, ord, axis=1), rtol=1e-5)
    assert torch.linalg.vector_norm(x, dim=0, keepdim=True).shape == (1, 4)


def test_linalg_matrix_norms_match_numpy():
    a = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    x = torch.tensor(a)
    for ord in ("fro", "nuc", 2, -2, 1, -1, math.inf, -math.inf):
        np.testing.assert_allclose(torch.linalg.matrix_norm(x, ord).numpy(),
                                   np.linalg.norm(a, ord, axis=(-2, -1)), rtol=1e-5)
    np.testing.assert_allclose(torch.linalg.matrix_norm(x, 1, keepdim=True).numpy(),
                               np.linalg.norm(a, 1, axis=(-2, -1), keepdims=True), rtol=1e-5)
    with pytest.raises(RuntimeError, match="Order 3 not supported"):
        torch.linalg.matrix_norm(x, 3)


def test_linalg_norm_dispatch_and_vecdot():
    a = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    b = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    x = torch.tensor(a)
    np.testing.assert_allclose(torch.linalg.norm(x).numpy(), np.linalg.norm(a), rtol=1e-5)
    np.testing.assert_allclose(torch.linalg.norm(x, 1).numpy(), np.linalg.norm(a, 1), rtol=1e-5)
    np.testing.assert_allclose(torch.linalg.norm(x, dim=1).numpy(), np.linalg.norm(a, axis=1),
                               rtol=1e-5)
    np.testing.assert_allclose(torch.linalg.vecdot(x, torch.tensor(b)).numpy(),
                               (a * b).sum(-1), rtol=1e-5, atol=1e-6)
    assert torch.linalg.matmul is torch.matmul


def test_linalg_vector_norm_gradient():
    a = np.array([3.0, -4.0], dtype=np.float32)
    x = torch.tensor(a, requires_grad=True)
    torch.linalg.vector_norm(x).backward()
    np.testing.assert_allclose(x.grad.numpy(), a / 5.0, rtol=1e-6)


# --------------------------------------------------------------------------- missing names

NOT_YET = [  # (fusegrad object, torch namespace, a torch name fusegrad lacks)
    (torch, "torch", "stft"),
    (torch.nn, "torch.nn", "AdaptiveLogSoftmaxWithLoss"),
    (torch.nn.functional, "torch.nn.functional", "ctc_loss"),
    (torch.optim, "torch.optim", "swa_utils"),
    (torch.linalg, "torch.linalg", "lstsq"),
    (torch.nn.init, "torch.nn.init", "orthogonal_"),
    (torch.nn.utils, "torch.nn.utils", "skip_init"),
    (torch.utils.data, "torch.utils.data", "StackDataset"),
]


@pytest.mark.parametrize("owner,namespace,name", NOT_YET, ids=[n for _, n, _ in NOT_YET])
def test_torch_name_fusegrad_lacks_says_not_implemented_yet(owner, namespace, name):
    assert name in torch_names(namespace)
    with pytest.raises(AttributeError) as info:
        getattr(owner, name)
    message = str(info.value)
    assert message == (f"{owner.__name__} has no attribute '{name}': {namespace}.{name} is not "
                       f"implemented in fusegrad yet (see docs/supported.md for what is)")
    assert not hasattr(owner, name)


@pytest.mark.parametrize("owner", [torch, torch.nn, torch.nn.functional, torch.optim, torch.linalg,
                                   torch.nn.init, torch.nn.utils, torch.utils.data,
                                   torch.optim.lr_scheduler])
def test_typo_gives_the_plain_message(owner):
    with pytest.raises(AttributeError, match=rf"^module '{owner.__name__}' has no attribute 'relux'$"):
        owner.relux  # noqa: B018
    assert not hasattr(owner, "relux")
    assert not hasattr(owner, "__wrapped__")


def test_from_import_of_a_missing_name_is_an_import_error():
    with pytest.raises(ImportError):
        from fusegrad import stft  # noqa: F401


def test_tensor_method_fusegrad_lacks():
    t = torch.ones(2)
    assert "stft" in torch_names("torch.Tensor")
    with pytest.raises(AttributeError, match=r"^'Tensor' object has no attribute 'stft': "
                                             r"torch.Tensor.stft is not implemented in fusegrad yet"):
        t.stft  # noqa: B018
    with pytest.raises(AttributeError, match=r"^'Tensor' object has no attribute 'sumx'$"):
        t.sumx  # noqa: B018
    assert not hasattr(t, "stft") and not hasattr(t, "sumx")
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(AttributeError, match=r"^'Parameter' object has no attribute 'stft': "):
        p.stft  # noqa: B018


def test_tensor_existing_attributes_and_protocols_still_work():
    t = torch.ones(2, 3, requires_grad=True)
    assert t.shape == (2, 3) and t.grad is None and t.sum().item() == 6.0
    t.note = "kept"  # __dict__ attributes still work
    assert t.note == "kept"
    assert getattr(t, "missing", 5) == 5
    u = pickle.loads(pickle.dumps(torch.ones(2)))
    np.testing.assert_array_equal(u.numpy(), [1.0, 1.0])


def test_property_raising_attribute_error_keeps_its_message():
    class Odd(torch.Tensor):
        @property
        def broken(self):
            raise AttributeError("the real reason")

    t = Odd(np.ones(2, dtype=np.float32))
    with pytest.raises(AttributeError, match="the real reason"):
        t.broken  # noqa: B018


def test_existing_names_are_torch_names_where_torch_has_them():
    # The namespaces' lists are not empty and cover names fusegrad implements.
    for namespace in NAMESPACES:
        assert torch_names(namespace), namespace
    assert {"relu", "cross_entropy", "softmax"} <= torch_names("torch.nn.functional")
    assert {"Linear", "Module", "Sequential"} <= torch_names("torch.nn")
    assert {"backward", "view", "shape"} <= torch_names("torch.Tensor")


def test_tensor_placeholders_do_not_shadow_real_attributes():
    t = torch.ones(2)
    t.stft = "mine"  # an instance attribute wins over the placeholder (a non-data descriptor)
    assert t.stft == "mine"
    assert not hasattr(torch.Tensor, "stft")

    class WithStft(torch.Tensor):
        def stft(self):
            return "subclass"

    assert WithStft(np.ones(2, dtype=np.float32)).stft() == "subclass"
    # Every torch Tensor name is either a working fusegrad attribute or says it is missing.
    for name in sorted(torch_names("torch.Tensor")):
        try:
            getattr(torch.ones(1), name)
        except AttributeError as e:
            assert "is not implemented in fusegrad yet" in str(e), name
        except Exception:
            pass  # a property that needs a different tensor (e.g. .T on 3-D) is implemented



def test_optimizers_say_which_torch_methods_they_lack():
    opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    with pytest.raises(AttributeError, match="torch.optim.Optimizer.register_step_pre_hook is "
                                             "not implemented"):
        _ = opt.register_step_pre_hook
    assert not hasattr(opt, "no_such_name")
