"""``fusegrad.compile(model)`` returns an ``OptimizedModule``, as ``torch.compile`` does: the
model is its ``_orig_mod``, its state-dict keys and parameter names carry the ``_orig_mod.``
prefix, and checkpoints move between compiled and plain models the way torch's do."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.nn.modules.utils import consume_prefix_in_state_dict_if_present
from tests.drift import assert_rounding_close


def mlp(seed: int = 0):
    fg.manual_seed(seed)
    return fg.nn.Sequential(fg.nn.Linear(4, 3), fg.nn.ReLU(), fg.nn.Linear(3, 1))


KEYS = ["0.weight", "0.bias", "2.weight", "2.bias"]
PREFIXED = ["_orig_mod." + k for k in KEYS]
x = fg.tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))


def test_compiled_module_wraps_the_model_as_torchs_optimized_module():
    model = mlp()
    compiled = fg.compile(model)
    assert type(compiled).__name__ == "OptimizedModule"
    assert isinstance(compiled, fg.nn.Module) and isinstance(compiled, fg._dynamo.OptimizedModule)
    assert compiled._orig_mod is model
    assert list(compiled.state_dict()) == PREFIXED
    assert [n for n, _ in compiled.named_parameters()] == PREFIXED
    assert [n for n, _ in compiled.named_modules()] == ["", "_orig_mod", "_orig_mod.0",
                                                         "_orig_mod.1", "_orig_mod.2"]
    assert repr(compiled) == "OptimizedModule(\n  (_orig_mod): " + \
        repr(model).replace("\n", "\n  ") + "\n)"
    assert len(compiled) == 3


def test_attributes_are_the_original_modules():
    model = mlp()
    compiled = fg.compile(model)
    assert compiled.training and model.training
    compiled.eval()
    assert not model.training and not compiled.training
    model.train()
    assert compiled.training
    compiled.note = "kept"                       # written on the original, as torch's
    assert model.note == "kept" and "note" not in compiled.__dict__
    del compiled.note
    assert not hasattr(model, "note")
    with pytest.raises(AttributeError, match="'Sequential' object has no attribute 'nope'"):
        _ = compiled.nope
    # The compiled function's own attributes, where the model has no such name.
    compiled(x)
    assert compiled.compiles == 1 and compiled.recompile_reasons == []


def test_checkpoint_of_a_compiled_model_loads_into_a_fresh_compiled_model():
    trained = fg.compile(mlp(0))
    buffer = io.BytesIO()
    fg.save(trained.state_dict(), buffer)
    buffer.seek(0)
    fresh = fg.compile(mlp(1))
    assert not np.allclose(fresh(x).detach().numpy(), trained(x).detach().numpy())
    result = fresh.load_state_dict(fg.load(buffer))
    assert repr(result) == "<All keys matched successfully>"
    np.testing.assert_array_equal(fresh(x).detach().numpy(), trained(x).detach().numpy())


def test_checkpoint_of_a_compiled_model_loads_into_a_plain_model_torchs_way():
    trained = fg.compile(mlp(0))
    # The plain models below run eagerly, as trained._orig_mod does: equal bit for bit (the
    # compiled call may sum its products in another order).
    want = trained._orig_mod(x).detach().numpy()
    assert_rounding_close(trained(x), want, terms=4 + 3)     # the two products' inner sizes
    plain = mlp(1)
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "_orig_mod.0.weight"'):
        plain.load_state_dict(trained.state_dict())
    state = trained.state_dict()
    consume_prefix_in_state_dict_if_present(state, "_orig_mod.")
    assert list(state) == KEYS
    plain.load_state_dict(state)
    np.testing.assert_array_equal(plain(x).detach().numpy(), want)
    other = mlp(2)
    other.load_state_dict(trained._orig_mod.state_dict())
    np.testing.assert_array_equal(other(x).detach().numpy(), want)
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "_orig_mod.0.weight"'):
        fg.compile(mlp(3)).load_state_dict(other.state_dict())


def test_copies_of_a_compiled_model_compile_their_own_copy():
    compiled = fg.compile(mlp())
    compiled(x)
    for twin in (copy.deepcopy(compiled), pickle.loads(pickle.dumps(compiled))):
        assert type(twin) is type(compiled) and twin._orig_mod is not compiled._orig_mod
        np.testing.assert_array_equal(twin(x).detach().numpy(), compiled(x).detach().numpy())
        assert twin.compiles == 1


def test_compiled_model_state_dict_and_checkpoints_match_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    tcompiled = torch.compile(tmodel)
    compiled = fg.compile(mlp(5))
    assert list(compiled.state_dict()) == list(tcompiled.state_dict())
    assert [n for n, _ in compiled.named_parameters()] == \
        [n for n, _ in tcompiled.named_parameters()]
    assert [n for n, _ in compiled.named_modules()] == [n for n, _ in tcompiled.named_modules()]
    assert repr(compiled) == repr(tcompiled)
    # torch's compiled checkpoint into fusegrad's compiled model, and back.
    compiled.load_state_dict(tcompiled.state_dict())
    tx = torch.from_numpy(x.numpy())
    with torch.no_grad():
        want = tcompiled._orig_mod(tx).numpy()
    np.testing.assert_allclose(compiled(x).detach().numpy(), want, rtol=1e-6, atol=1e-7)
    tfresh = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(),
                                               torch.nn.Linear(3, 1)))
    tfresh.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                            for k, v in compiled.state_dict().items()})
    with torch.no_grad():
        np.testing.assert_allclose(tfresh._orig_mod(tx).numpy(), want, rtol=1e-6, atol=1e-7)
