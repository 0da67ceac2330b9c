"""``fusegrad.utils.checkpoint``: a checkpointed region's gradients are the unchecked run's
exactly (the same ops in the same order), its random numbers are the forward's when it runs
again, its graph keeps fewer values alive, and its warnings and errors are torch 2.13's."""

from __future__ import annotations

import gc
import os
import sys
import warnings

import numpy as np
import pytest

import fusegrad as fg
from fusegrad.autograd.engine import Node, _Saved
from fusegrad.utils.checkpoint import CheckpointError, checkpoint, checkpoint_sequential

FREED = "Trying to backward through the graph a second time"
VARIANTS = [True, False]


def _mlp(width: int = 16, depth: int = 3, dropout: float = 0.0):
    layers = []
    for _ in range(depth):
        layers += [fg.nn.Linear(width, width), fg.nn.Tanh()]
        if dropout:
            layers.append(fg.nn.Dropout(dropout))
    return fg.nn.Sequential(*layers)


def _grads(model, run, x, seed: int = 1) -> list:
    """The output and every gradient of ``(run(x) ** 2).sum()``, from a fresh ``.grad``."""
    model.zero_grad(set_to_none=True)
    x.grad = None
    fg.manual_seed(seed)
    y = run(x)
    (y * y).sum().backward()
    return [y.detach()] + [x.grad] + [p.grad for p in model.parameters()]


def _assert_equal(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            np.testing.assert_array_equal(g.numpy(), w.numpy())


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_mlp_gradients_equal_the_unchecked_run(use_reentrant):
    fg.manual_seed(0)
    model = _mlp()
    x = fg.randn(8, 16, requires_grad=True)
    want = _grads(model, model, x)
    got = _grads(model, lambda a: checkpoint(model, a, use_reentrant=use_reentrant), x)
    _assert_equal(got, want)


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_dropout_reruns_with_the_forward_random_state(use_reentrant):
    fg.manual_seed(0)
    model = _mlp(dropout=0.5)
    x = fg.randn(8, 16, requires_grad=True)
    want = _grads(model, model, x)
    got = _grads(model, lambda a: checkpoint(model, a, use_reentrant=use_reentrant), x)
    _assert_equal(got, want)
    # the caller's random stream goes on as if the region had not run again
    fg.manual_seed(1)
    y = checkpoint(model, x, use_reentrant=use_reentrant)
    after_forward = fg.rand(3)
    fg.manual_seed(1)
    y = checkpoint(model, x, use_reentrant=use_reentrant)
    y.sum().backward()
    np.testing.assert_array_equal(fg.rand(3).numpy(), after_forward.numpy())


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_without_preserve_rng_state_the_rerun_draws_new_masks(use_reentrant):
    fg.manual_seed(0)
    model = _mlp(width=64, depth=1, dropout=0.5)
    x = fg.randn(16, 64, requires_grad=True)
    want = _grads(model, model, x)
    got = _grads(model, lambda a: checkpoint(model, a, use_reentrant=use_reentrant,
                                             preserve_rng_state=False), x)
    _assert_equal(got[:1], want[:1])            # the forward is the same
    assert not np.array_equal(got[1].numpy(), want[1].numpy())


def test_keyword_arguments_and_inputs_that_do_not_require_grad():
    fg.manual_seed(0)
    lin = fg.nn.Linear(4, 4)
    x = fg.randn(3, 4)                          # no gradient of its own
    scale = fg.randn(4, requires_grad=True)

    def f(x, *, scale, shift=0.0):
        return lin(x) * scale + shift
    y = f(x, scale=scale, shift=2.0)
    want = fg.autograd.grad((y * y).sum(), [lin.weight, lin.bias, scale])
    y = checkpoint(f, x, scale=scale, shift=2.0, use_reentrant=False)
    got = fg.autograd.grad((y * y).sum(), [lin.weight, lin.bias, scale])
    _assert_equal(list(got), list(want))


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_non_tensor_inputs_and_outputs(use_reentrant):
    fg.manual_seed(0)
    lin = fg.nn.Linear(4, 4)
    x = fg.randn(3, 4, requires_grad=True)

    def f(x, power, name):
        h = lin(x) ** power
        return 3, h, name, h.argmax(dim=1), h.sum(dim=1)

    def loss(out):
        return (out[1] * out[1]).sum() + out[4].sum()
    want_out = f(x, 2, "a")
    want = fg.autograd.grad(loss(want_out), [x, lin.weight, lin.bias], retain_graph=True)
    out = checkpoint(f, x, 2, "a", use_reentrant=use_reentrant)
    assert out[0] == 3 and out[2] == "a" and not out[3].requires_grad
    assert out[3].tolist() == want_out[3].tolist()
    if use_reentrant:
        loss(out).backward()
        got = [x.grad, lin.weight.grad, lin.bias.grad]
    else:
        got = fg.autograd.grad(loss(out), [x, lin.weight, lin.bias])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)


def test_nested_structures_of_outputs():
    fg.manual_seed(0)
    lin = fg.nn.Linear(4, 4)
    x = fg.randn(3, 4, requires_grad=True)
    out = checkpoint(lambda x: {"y": [lin(x), x * 2], "n": 1}, x, use_reentrant=False)
    assert out["n"] == 1
    (out["y"][0].sum() + out["y"][1].sum()).backward()
    want = np.broadcast_to(lin.weight.sum(0).detach().numpy() + 2, (3, 4))
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-6)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
@pytest.mark.parametrize("outer,inner", [(True, True), (False, False), (True, False)])
def test_nested_checkpoints(outer, inner):
    fg.manual_seed(0)
    a, b = _mlp(depth=2), _mlp(depth=2)
    model = fg.nn.Sequential(a, b)
    x = fg.randn(8, 16, requires_grad=True)

    def run(x):
        return checkpoint(lambda h: checkpoint(b, a(h), use_reentrant=inner), x,
                          use_reentrant=outer)
    _assert_equal(_grads(model, run, x), _grads(model, model, x))


@pytest.mark.parametrize("use_reentrant", VARIANTS)
@pytest.mark.parametrize("segments", [1, 2, 3, 6])
def test_checkpoint_sequential_matches_the_sequential(segments, use_reentrant):
    fg.manual_seed(0)
    model = _mlp(depth=3, dropout=0.25)             # 9 modules
    x = fg.randn(8, 16, requires_grad=True)
    want = _grads(model, model, x)
    got = _grads(model, lambda a: checkpoint_sequential(model, segments, a,
                                                        use_reentrant=use_reentrant), x)
    _assert_equal(got, want)
    got = _grads(model, lambda a: checkpoint_sequential(list(model), segments, a,
                                                        use_reentrant=use_reentrant), x)
    _assert_equal(got, want)


def test_non_reentrant_differentiates_parameters_with_autograd_grad():
    fg.manual_seed(0)
    model = _mlp()
    x = fg.randn(4, 16)
    want = fg.autograd.grad(model(x).sum(), list(model.parameters()))
    y = checkpoint(model, x, use_reentrant=False)
    assert y.requires_grad
    got = fg.autograd.grad(y.sum(), list(model.parameters()))
    _assert_equal(list(got), list(want))
    assert all(p.grad is None for p in model.parameters())


def test_reentrant_refuses_autograd_grad_and_backward_inputs():
    fg.manual_seed(0)
    model = _mlp()
    x = fg.randn(4, 16, requires_grad=True)
    msg = "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad()"
    with pytest.raises(RuntimeError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        fg.autograd.grad(checkpoint(model, x, use_reentrant=True).sum(), x)
    with pytest.raises(RuntimeError, match="passing an `inputs` parameter to .backward()"):
        checkpoint(model, x, use_reentrant=True).sum().backward(inputs=[x])


def test_reentrant_without_an_input_that_requires_grad_warns_and_gives_no_gradients():
    fg.manual_seed(0)
    model = _mlp()
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        y = checkpoint(model, fg.randn(4, 16), use_reentrant=True)
    assert not y.requires_grad


def test_reentrant_output_without_history_raises_in_backward():
    x = fg.randn(3, requires_grad=True)
    y = checkpoint(lambda a: a.detach() * 2, x, use_reentrant=True)
    assert y.requires_grad
    with pytest.raises(RuntimeError, match="none of output has requires_grad=True, this "
                                           r"checkpoint\(\) is not necessary"):
        y.sum().backward()


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_second_backward_raises_unless_the_graph_is_retained(use_reentrant):
    fg.manual_seed(0)
    model = _mlp()
    x = fg.randn(4, 16, requires_grad=True)
    loss = checkpoint(model, x, use_reentrant=use_reentrant).sum()
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * first.numpy())
    with pytest.raises(RuntimeError, match=FREED):
        loss.backward()


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_an_input_written_in_place_before_backward_raises(use_reentrant):
    lin = fg.nn.Linear(3, 3)
    x = fg.randn(2, 3, requires_grad=True)
    h = x * 1
    y = checkpoint(lin, h, use_reentrant=use_reentrant)
    with fg.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_hooks_and_retained_gradients_outside_the_region_run_once():
    fg.manual_seed(0)
    lin = fg.nn.Linear(3, 3)
    calls = []
    lin.weight.register_hook(lambda g: calls.append("weight"))
    x = fg.randn(2, 3, requires_grad=True)
    h = x * 2
    h.retain_grad()
    h.register_hook(lambda g: calls.append("h"))
    y = checkpoint(lin, h, use_reentrant=False)
    y.sum().backward()
    assert sorted(calls) == ["h", "weight"]
    np.testing.assert_allclose(h.grad.numpy(), lin.weight.sum(0).detach().numpy()[None].repeat(
        2, 0), rtol=1e-6)


def test_under_no_grad_the_region_just_runs():
    lin = fg.nn.Linear(3, 3)
    x = fg.randn(2, 3, requires_grad=True)
    with fg.no_grad():
        for use_reentrant in VARIANTS:
            y = checkpoint(lin, x, use_reentrant=use_reentrant)
            assert y.grad_fn is None and not y.requires_grad


def test_determinism_check_names_the_output_that_changed():
    calls = []

    def f(x):
        calls.append(1)
        return x[: len(calls)] * 2
    x = fg.randn(4, requires_grad=True)
    y = checkpoint(f, x, use_reentrant=False)
    with pytest.raises(CheckpointError, match="tensor at position 0:\nsaved metadata: "):
        y.sum().backward()
    calls.clear()
    with pytest.raises(ValueError, match=r"determinism_check should be one of \['default', "
                                         r"'none'\], but got x"):
        checkpoint(f, x, use_reentrant=False, determinism_check="x")


def test_context_fn_wraps_the_forward_and_the_recomputation():
    import contextlib
    seen = []

    def context_fn():
        @contextlib.contextmanager
        def ctx(name):
            seen.append(name)
            yield
        return ctx("forward"), ctx("recompute")
    x = fg.randn(3, requires_grad=True)
    checkpoint(lambda a: a * a, x, use_reentrant=False, context_fn=context_fn).sum().backward()
    assert seen == ["forward", "recompute"]


def _bytes_held(root) -> int:
    """Bytes of the arrays that ``root``'s graph keeps alive (its tensors, nodes and saved
    values, not the code the nodes refer to)."""
    from fusegrad.utils.checkpoint import _Region
    seen, total, stack = set(), 0, [root]
    arrays = {}
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            base = o
            while isinstance(base.base, np.ndarray):
                base = base.base
            arrays[id(base)] = base.nbytes
            continue
        if isinstance(o, (tuple, list, dict, fg.Tensor, Node, _Saved, _Region)):
            stack.extend(gc.get_referents(o))
    total = sum(arrays.values())
    return total


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_the_forward_keeps_fewer_values_alive(use_reentrant):
    fg.manual_seed(0)
    model = _mlp(width=64, depth=4)
    x = fg.randn(32, 64, requires_grad=True)
    params = sum(p.numel() * 4 for p in model.parameters())
    activation = 32 * 64 * 4
    plain = _bytes_held((model(x) ** 2).sum()) - params
    checked = _bytes_held((checkpoint(model, x, use_reentrant=use_reentrant) ** 2).sum()) - params
    # unchecked: each Linear's input and the last tanh's output (each other tanh's output is
    # the next Linear's input); checked: the region's input and output (the loss's operand)
    assert plain >= 5 * activation
    assert checked <= 2 * activation + 64


def _transformer(checkpointed, use_reentrant=False):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
    try:
        from char_transformer import make_model
    finally:
        sys.path.pop(0)
    fg.manual_seed(0)
    model = make_model(fg, vocab=20, block=8, n_embd=16, n_head=2, n_layer=2)
    if checkpointed:
        class Checkpointed(fg.nn.Module):
            def __init__(self, block):
                super().__init__()
                self.block = block

            def forward(self, x):
                return checkpoint(self.block, x, use_reentrant=use_reentrant)
        model.blocks = fg.nn.ModuleList([Checkpointed(b) for b in model.blocks])
    opt = fg.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss
    return step


def _losses(step, n: int = 3) -> list[float]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        x = fg.tensor(rng.integers(0, 20, (4, 8)))
        y = fg.tensor(rng.integers(0, 20, (4, 8)))
        out.append(float(step(x, y)))
    return out


@pytest.mark.parametrize("use_reentrant", VARIANTS)
def test_transformer_with_checkpointed_blocks_has_the_same_losses(use_reentrant):
    want = _losses(_transformer(False))
    assert _losses(_transformer(True, use_reentrant)) == want


@pytest.mark.slow
def test_compiled_transformer_step_with_checkpointed_blocks_has_the_same_losses():
    plain = fg.compile(_transformer(False), fullgraph=True)
    checked = fg.compile(_transformer(True), fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # compiled, checkpoint warns of nothing
        want, got = _losses(plain), _losses(checked)
    # The recomputed blocks run in kernels of their own, which may round differently (a
    # multiply and an add contracted or not): per step and block, the error bound of a dot
    # product of the longest length (64, the MLP's hidden width), n * eps relative to the
    # loss, a mean of cross-entropies of about log(20); 3 steps of 2 blocks.
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(got, want, rtol=0, atol=3 * 2 * 64 * eps * np.log(20))
    eager = _losses(_transformer(False))
    np.testing.assert_allclose(got, eager, rtol=1e-5)
    # The checkpointed step's program needs less working memory: the blocks' activations
    # are recomputed in the backward instead of held from the forward.
    x = y = fg.zeros(4, 8, dtype=fg.int64)
    arena = [c.lower(x, y).program.plan.arena_bytes for c in (plain, checked)]
    assert arena[1] < arena[0]


def test_compiled_region_gives_the_eager_values_and_gradients():
    fg.manual_seed(0)
    model = _mlp(depth=2)
    x = fg.randn(4, 16, requires_grad=True)

    def f(x):
        y = checkpoint(model, x, use_reentrant=False)
        return (y * y).sum()
    want = _grads(model, lambda a: model(a), x)
    compiled = fg.compile(f)
    model.zero_grad(set_to_none=True)
    x.grad = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = compiled(x)
    loss.backward()
    np.testing.assert_allclose(float(loss), float((want[0] ** 2).sum()), rtol=1e-5)
    for g, w in zip([x.grad] + [p.grad for p in model.parameters()], want[1:]):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)


def _example_model(lib, checkpointed: bool, weights: dict | None = None):
    """examples/char_transformer.py's model on ``lib`` (fusegrad or torch), blocks through
    checkpoint when ``checkpointed``, loaded with ``weights`` (name -> array) if given."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
    try:
        from char_transformer import make_model
    finally:
        sys.path.pop(0)
    lib.manual_seed(0)
    model = make_model(lib, vocab=20, block=8, n_embd=16, n_head=2, n_layer=2,
                       checkpoint=checkpointed)
    if weights is not None:
        model.load_state_dict({k: lib.tensor(v) for k, v in weights.items()})
    opt = lib.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss
    return model, step


def _example_losses(lib, step, n: int = 3) -> list[float]:
    rng = np.random.default_rng(0)
    return [step(lib.tensor(rng.integers(0, 20, (4, 8))),
                 lib.tensor(rng.integers(0, 20, (4, 8)))).item() for _ in range(n)]


def test_the_examples_checkpointed_transformer_matches_torch():
    torch = pytest.importorskip("torch")
    model, step = _example_model(fg, True)
    weights = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    got = _example_losses(fg, step)
    assert got == _example_losses(fg, _example_model(fg, False, weights)[1])
    want = _example_losses(torch, _example_model(torch, True, weights)[1])
    # The same float32 ops in another library's kernels: per step, a dot product's bound
    # (n * eps, n = 64, the MLP's hidden width) per block, relative to the loss; 3 steps.
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(got, want, rtol=3 * 2 * (64 + 8) * eps)


def test_utils_namespace_has_checkpoint_as_torch():
    assert fg.utils.checkpoint.checkpoint is checkpoint
    assert fg.utils.checkpoint.checkpoint_sequential is checkpoint_sequential


# torch's warnings and errors, message for message

def _message(fn) -> tuple[str, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
        except Exception as e:      # noqa: BLE001 - the exception is what is compared
            return type(e).__name__, str(e)
    return "warning", " | ".join(f"{w.category.__name__}: {w.message}" for w in caught)


def _cases(lib, cp):
    lin = lib.nn.Linear(3, 3)
    x = lib.randn(2, 3, requires_grad=True)
    return {
        "no use_reentrant": lambda: cp.checkpoint(lin, x),
        "sequential no use_reentrant": lambda: cp.checkpoint_sequential([lin, lin], 2, x),
        "no input requires grad": lambda: cp.checkpoint(lin, x.detach(), use_reentrant=True),
        "reentrant kwargs": lambda: cp.checkpoint(lin, x, use_reentrant=True, foo=1, bar=2),
        "sequential kwargs": lambda: cp.checkpoint_sequential([lin], 1, x, use_reentrant=False,
                                                              foo=1),
        "reentrant debug": lambda: cp.checkpoint(lin, x, use_reentrant=True, debug=True),
        "reentrant context_fn": lambda: cp.checkpoint(lin, x, use_reentrant=True,
                                                      context_fn=cp.noop_context_fn.__call__),
        "determinism_check": lambda: cp.checkpoint(lin, x, use_reentrant=False,
                                                   determinism_check="all"),
        "reentrant grad": lambda: lib.autograd.grad(
            cp.checkpoint(lin, x, use_reentrant=True).sum(), x),
        "reentrant backward inputs": lambda: cp.checkpoint(
            lin, x, use_reentrant=True).sum().backward(inputs=[x]),
        "unnecessary": lambda: cp.checkpoint(lambda a: a.detach() * 2, x,
                                             use_reentrant=True).sum().backward(),
        "freed": lambda: [loss.backward() for loss in
                          [cp.checkpoint(lin, x, use_reentrant=False).sum()] * 2],
        "sequential zero segment size": lambda: cp.checkpoint_sequential(
            [lin, lin], 3, x, use_reentrant=False),
        "sequential zero segments": lambda: cp.checkpoint_sequential(
            [lin, lin], 0, x, use_reentrant=False),
        "detach_variable list": lambda: cp.detach_variable([x]),
    }


def test_warnings_and_errors_are_torchs():
    torch = pytest.importorskip("torch")
    import torch.utils.checkpoint as torch_cp

    import fusegrad.utils.checkpoint as fg_cp
    ours, theirs = _cases(fg, fg_cp), _cases(torch, torch_cp)
    for name in ours:
        assert _message(ours[name]) == _message(theirs[name]), name


def test_non_reentrant_gradient_of_the_gradient():
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    y = checkpoint(lambda a: (a ** 3).sum(), x, use_reentrant=False)
    (g,) = fg.autograd.grad(y, x, create_graph=True)
    assert g.tolist() == [3.0, 12.0]
    g.sum().backward()
    assert x.grad.tolist() == [6.0, 12.0]


def test_an_argument_returned_unchanged_keeps_its_own_history():
    lin = fg.nn.Linear(2, 2)
    x = fg.tensor([1.0, 2.0], requires_grad=True)
    out = checkpoint(lambda a: (a, lin(a)), x, use_reentrant=False)
    assert out[0] is x
    (out[0].sum() + out[1].sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), 1 + lin.weight.sum(0).detach().numpy(),
                               rtol=1e-6)


def test_debug_is_said_to_be_unimplemented_not_ignored():
    lin = fg.nn.Linear(3, 3)
    x = fg.randn(2, 3, requires_grad=True)
    with pytest.warns(UserWarning, match=r"checkpoint\(debug=True\) is not implemented"):
        y = checkpoint(lin, x, use_reentrant=False, debug=True)
    y.sum().backward()
    assert x.grad is not None
