"""The tracer tensor: construction, flags, aliases, repr, hooks, grad mode, errors."""
import copy
import io
import pickle

import numpy as np
import pytest
import torch

import torchtrace as tt


def torch_requires_grad(t: torch.Tensor) -> bool:
    with torch._C.DisableTorchFunctionSubclass():
        return torch.Tensor.requires_grad.__get__(t)


@pytest.mark.parametrize("data, dtype", [
    ([1, 2, 3], torch.float32),
    (3, torch.float32),
    ([[1.5, 2.0]], torch.float32),
    (np.arange(3, dtype=np.float64), torch.float64),
    (torch.tensor([1, 2]), torch.int64),
    (torch.tensor([1.0], dtype=torch.float16), torch.float16),
])
def test_construction_dtype(data, dtype):
    t = tt.tracer(data)
    assert isinstance(t, tt.tracer) and isinstance(t, torch.Tensor)
    assert t.dtype == dtype


def test_construction_copies_but_as_tracer_shares():
    base = torch.zeros(3)
    copied, shared = tt.tracer(base), tt.as_tracer(base)
    base += 1
    assert copied.tolist() == [0.0, 0.0, 0.0]
    assert shared.tolist() == [1.0, 1.0, 1.0]


def test_construction_dtype_and_requires_grad():
    t = tt.tracer([1, 2], dtype=torch.float64, requires_grad=True)
    assert t.dtype == torch.float64 and t.requires_grad and t.is_leaf


@pytest.mark.parametrize("factory, args", [
    (tt.zeros, (2, 3)), (tt.ones, (2,)), (tt.rand, (2, 2)), (tt.randn, (4,)),
    (tt.zeros_like, (torch.ones(2),)), (tt.ones_like, (torch.ones(2),)),
])
def test_factories(factory, args):
    t = factory(*args, requires_grad=True)
    assert isinstance(t, tt.tracer) and t.requires_grad and t.is_leaf and t.grad is None


def test_from_numpy_shares_memory():
    array = np.zeros(3)
    t = tt.from_numpy(array)
    array[0] = 5
    assert t.tolist()[0] == 5


def test_torch_autograd_stays_off_underneath():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    assert x.requires_grad and y.requires_grad
    assert not torch_requires_grad(x) and not torch_requires_grad(y) and not torch_requires_grad(x.grad)
    assert type(x.grad) is torch.Tensor


def test_integer_tracer_refuses_requires_grad():
    with pytest.raises(RuntimeError, match="Only floating point tracers can require gradients.*int64"):
        tt.tracer(torch.tensor([1, 2]), requires_grad=True)
    with pytest.raises(RuntimeError, match="floating point"):
        tt.tracer(torch.tensor([True])).requires_grad_()


def test_repr_names_the_node():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    assert repr(x) == "tracer([1., 2.], requires_grad=True)"
    assert repr(x * 2) == "tracer([2., 4.], grad_fn=<MulBackward>)"
    assert repr(tt.tracer([1.0])) == "tracer([1.])"


def test_grad_fn_and_next_functions():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = x * 2 + x
    assert y.grad_fn.name == "AddBackward" and not y.is_leaf and x.grad_fn is None
    names = [fn.name for fn, _ in y.grad_fn.next_functions]
    assert names == ["MulBackward", "AccumulateGrad"]


def test_results_stay_tracers():
    x = tt.tracer([1.0, -2.0])
    assert all(isinstance(r, tt.tracer) for r in [x * 2, x > 0, x + x, -x])
    assert x.shape == torch.Size([2]) and x.tolist() == [1.0, -2.0] and x.sum().item() == -1.0
    assert isinstance(x.numpy(), np.ndarray)


def test_snippet_a_of_the_original_readme():
    a = tt.tracer([1, 2, 3, 4])
    a.requires_grad_()
    b = a.Sum()
    b.backward()
    assert torch.equal(a.grad, torch.tensor([1.0, 1.0, 1.0, 1.0]))
    assert b.grad_fn.name == "SumBackward"


def test_sum_of_a_non_leaf_which_the_original_crashed_on():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    (x + x).Sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_detach_cuts_the_graph():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    d = (x * 2).detach()
    assert isinstance(d, tt.tracer) and not d.requires_grad and d.is_leaf


def test_retain_grad_on_non_leaf():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    y = x * 3
    y.retain_grad()
    (y * y).sum().backward()
    assert y.retains_grad
    assert torch.allclose(y.grad, 2 * y.detach().as_subclass(torch.Tensor))
    with pytest.warns(UserWarning, match="not a leaf Tensor"):
        assert (x * 3).grad is None


def test_hooks_replace_gradients_and_can_be_removed():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    seen = []
    handle = x.register_hook(lambda g: g * 10)
    y = x * 2
    y.register_hook(lambda g: seen.append(g.clone()))
    y.sum().backward()
    assert x.grad.tolist() == [20.0, 20.0] and seen[0].tolist() == [1.0, 1.0]
    handle.remove()
    x.grad = None
    (x * 2).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_hook_on_tracer_without_grad_is_refused():
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        tt.tracer([1.0]).register_hook(print)


@pytest.mark.parametrize("context", [tt.no_grad, torch.no_grad])
def test_no_grad_stops_recording(context):
    x = tt.tracer([1.0], requires_grad=True)
    with context():
        y = x * 2
        with tt.enable_grad():
            z = x * 2
    assert y.grad_fn is None and not y.requires_grad and z.grad_fn is not None
    assert tt.is_grad_enabled()


def test_no_grad_as_decorator():
    @tt.no_grad()
    def double(t):
        return t * 2

    assert double(tt.tracer([1.0], requires_grad=True)).grad_fn is None


def test_leaf_updates_in_place_under_no_grad():
    w = tt.tracer([1.0, 2.0], requires_grad=True)
    (w * w).sum().backward()
    with torch.no_grad():
        w.add_(w.grad, alpha=-0.5)
    assert w.tolist() == [0.0, 0.0] and w.is_leaf and w.requires_grad


def test_unsupported_op_names_the_callable():
    x = tt.tracer([0.5], requires_grad=True)
    with pytest.raises(tt.UnsupportedOperationError, match=r"bessel_j0.*tt.register") as info:
        torch.special.bessel_j0(x)
    assert isinstance(info.value, NotImplementedError)
    assert torch.special.bessel_j0(tt.tracer([0.5])).grad_fn is None  # no gradient needed: it just runs


def test_pickle_and_deepcopy_drop_the_graph():
    x = tt.tracer([1.0, 2.0], requires_grad=True)
    for copied in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x)):
        assert isinstance(copied, tt.tracer) and copied.requires_grad and copied.tolist() == [1.0, 2.0]
    with pytest.raises(RuntimeError, match="graph leaves"):  # as torch: a non-leaf refuses deepcopy
        copy.deepcopy(x * 2)
    buffer = io.BytesIO()
    torch.save({"w": x.as_subclass(torch.Tensor)}, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["w"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("make", [torch.tensor, tt.tracer])
def test_copies_and_pickles_keep_what_torchs_keep(make):
    """Side by side with torch: a deepcopy keeps views of one copy sharing its memory, a leaf's .grad and the user's
    attributes; a parameter's deepcopy keeps neither; pickling a non-leaf gives a leaf that requires grad, and a
    pickled parameter keeps its attributes (torchtrace lost all of these)."""
    x = make([1.0, 2.0, 3.0])
    a, b = copy.deepcopy([x, x[1:]])
    a[1] = 100.0
    assert b[0].item() == 100.0
    w = make([1.0, 2.0], requires_grad=True)
    (w * w).sum().backward()
    w.tag = "decay"
    copied = copy.deepcopy(w)
    assert copied.grad.tolist() == [2.0, 4.0] and copied.tag == "decay" and copied.requires_grad
    y = pickle.loads(pickle.dumps(make([1.0, 2.0], requires_grad=True) * 2))
    assert y.requires_grad and y.is_leaf and y.tolist() == [2.0, 4.0]
    linear = torch.nn.Linear(2, 2)
    model = linear if make is torch.tensor else tt.port(linear)
    model.weight.no_decay = True
    (model(torch.ones(1, 2)) ** 2).sum().backward()
    assert not hasattr(copy.deepcopy(model).weight, "no_decay") and copy.deepcopy(model).weight.grad is None
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=False).weight.no_decay is True


@pytest.mark.parametrize("make", [torch.tensor, tt.tracer])
def test_torch_loads_saved_tracers_with_its_default_weights_only(make):
    """torch.load's default (weights_only=True) reads parameters, a detached output, dicts of them and
    state_dict(keep_vars=True) as torch's own tensors; for tracers it raised an UnpicklingError naming torchtrace's
    rebuild functions (declared safe at import now), whatever the user had allowlisted."""
    linear = torch.nn.Linear(4, 2)
    model = linear if make is torch.tensor else tt.port(linear)
    model.weight.note = "decay"
    leaf = make([1.0, 2.0], requires_grad=True)
    saved = {"weight": model.weight, "output": model(torch.ones(1, 4)).detach(), "parameters":
             dict(model.named_parameters()), "state": model.state_dict(keep_vars=True), "non-leaf": leaf * 2}
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert type(loaded["weight"]) is type(model.weight) and loaded["weight"].note == "decay"
    assert loaded["weight"].requires_grad and not loaded["output"].requires_grad
    assert torch.equal(loaded["output"], saved["output"]) and torch.equal(loaded["state"]["bias"], model.bias)
    assert all(type(p) is type(model.weight) for p in loaded["parameters"].values())
    assert loaded["non-leaf"].requires_grad and loaded["non-leaf"].is_leaf and loaded["non-leaf"].tolist() == [2, 4]


def test_as_tracer_refuses_what_is_not_a_tensor_and_names_tt_tracer():
    """A list raised AttributeError: 'list' object has no attribute 'detach'."""
    for data in ([1.0, 2.0], None, 3.0):
        with pytest.raises(TypeError, match=r"tt.tracer\(data\)"):
            tt.as_tracer(data)


def test_as_tracer_refuses_a_tensor_that_requires_grad_in_torch_autograd():
    """It detached it silently: no gradient reached a torch leaf, or the leaves of a tensor torch computed (a
    Jacobian of a function wrapping its input came back all zeros)."""
    leaf = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    for tensor, says in ((leaf, "a torch leaf"), (leaf * 2, "grad_fn=MulBackward0")):
        with pytest.raises(RuntimeError, match=f"requires grad in torch autograd \\({says}\\).*tensor.detach\\(\\)"):
            tt.as_tracer(tensor)
    wrapped = tt.as_tracer(leaf.detach(), requires_grad=True)
    (wrapped * wrapped).sum().backward()
    assert wrapped.grad.tolist() == [2.0, 4.0, 6.0] and leaf.grad is None


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_requires_grad_must_be_a_bool_as_torch(flag):
    """'yes', 1 or None were taken as a truth value; torch refuses each (TypeError for the argument, RuntimeError for
    the attribute), and so does torchtrace, in the same words."""
    for make in (lambda: torch.tensor([1.0], requires_grad=flag), lambda: tt.tracer([1.0], requires_grad=flag),
                 lambda: torch.ones(1).requires_grad_(flag), lambda: tt.tracer([1.0]).requires_grad_(flag),
                 lambda: tt.as_tracer(torch.ones(1), requires_grad=flag)):
        with pytest.raises(TypeError, match="argument 'requires_grad'.*must be bool, not"):
            make()
    for x in (torch.ones(1), tt.tracer([1.0])):
        with pytest.raises(RuntimeError, match="requires_grad must be a bool"):
            x.requires_grad = flag
        assert not x.requires_grad


@pytest.mark.parametrize("make", [torch.tensor, tt.tracer])
def test_a_non_leafs_requires_grad_attribute_is_fixed_as_torchs(make):
    """torch refuses setting a non-leaf's requires_grad attribute, True as well as False (y.requires_grad = True
    passed silently); requires_grad_() with True stays allowed, a no-op, on both."""
    y = make([1.0, 2.0], requires_grad=True) * 2
    for flag in (True, False):
        with pytest.raises(RuntimeError, match="only change requires_grad"):
            y.requires_grad = flag
    assert y.requires_grad_() is y and y.requires_grad
    leaf = make([1.0, 2.0])
    leaf.requires_grad = True
    assert leaf.requires_grad
