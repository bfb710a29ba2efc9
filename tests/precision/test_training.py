"""tt.precision.training: the scale and the skipped steps of a GradScaler loop are torch's own, step for step, with
torchtrace's optimizers and torch's; a skipped step names the rule that first made the inf and the parameters it
reached."""
import contextlib
import copy
import warnings

import pytest
import torch
from precision_models import Forced

import torchtrace as tt

STEPS = 50
FORCED = {7, 8, 30}  # the steps whose backward overflows float16 at the multiplication by `boost`


def _batches():
    generator = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 4, generator=generator), torch.randn(16, 1, generator=generator)) for _ in range(STEPS)]


def _loop(model, optimizer, watch=None):
    """50 float16 steps with GradScaler (growing every 5 good steps); returns each step's (scale, skipped)."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=5)
    called = []
    real_step = optimizer.step

    def counted(*args, **kwargs):  # GradScaler skips a step by not calling optimizer.step()
        called.append(True)
        return real_step(*args, **kwargs)

    optimizer.step = counted
    seen = []
    context = watch(model, optimizer, scaler) if watch else None
    with context if context is not None else contextlib.nullcontext():
        for step, (x, y) in enumerate(_batches()):
            model.boost = 1e4 if step in FORCED else 1.0
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x)
            before, scale = len(called), scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            seen.append((scale, len(called) == before))
    return seen, context


def _torch_run(model):
    reference = copy.deepcopy(model)
    return _loop(reference, torch.optim.SGD(reference.parameters(), lr=0.05))[0]


@pytest.mark.parametrize("optimizer", ("torchtrace", "torch"))
def test_scales_and_skips_equal_torch_gradscaler_over_50_steps(optimizer):
    torch.manual_seed(0)
    model = Forced()
    expected = _torch_run(model)
    traced = tt.port(copy.deepcopy(model))
    make = tt.optim.SGD if optimizer == "torchtrace" else torch.optim.SGD
    seen, watched = _loop(traced, make(traced.parameters(), lr=0.05), tt.precision.training)
    assert seen == expected
    assert [(s.scale, s.skipped) for s in watched.steps] == expected
    skipped = [i for i, (_, skip) in enumerate(expected) if skip]
    assert FORCED <= set(skipped) and watched.skipped == skipped
    assert len({scale for scale, _ in expected}) > 3  # the scale grew and was backed off several times
    for step in watched.steps:
        if step.index in FORCED:
            first = step.first_inf
            assert (first.rule, first.module) == ("Mul", "model") and first.line.startswith("precision_models.py:")
            assert "forced overflow" in first.code
            assert first.parameters == ["first.weight", "first.bias"]
        if not step.skipped:
            assert step.first_inf is None


def test_the_loop_is_left_as_it_was():
    model = tt.port(Forced())
    optimizer = tt.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with tt.precision.training(model, optimizer, scaler) as p:
        pass
    assert "step" not in vars(scaler) and "step" not in vars(optimizer) and p.steps == []


def test_a_disabled_scaler_is_said_it_would_skip_nothing():
    model = tt.port(Forced())
    optimizer = tt.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match=r"the GradScaler is disabled .* torch.amp.GradScaler\('cpu'\)"):
        with tt.precision.training(model, optimizer, torch.amp.GradScaler("cpu", enabled=False)):
            pass
    with warnings.catch_warnings():  # an enabled one: no warning
        warnings.simplefilter("error")
        with tt.precision.training(model, optimizer, torch.amp.GradScaler("cpu")):
            pass


def test_an_inf_made_where_a_float32_gradient_is_cast_to_float16_is_named():
    """Cross entropy runs in float32 under autocast; its gradient (about 2^25 at this scale) overflows where it is
    cast back to the float16 logits, as torch's ToCopyBackward casts it (torch's logits.grad is not finite there):
    the skipped step names it."""
    torch.manual_seed(0)
    base = torch.nn.Linear(8, 3)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    reference = copy.deepcopy(base)
    with torch.autocast("cpu", dtype=torch.float16):
        logits = reference(x)
        logits.retain_grad()
        loss = torch.nn.functional.cross_entropy(logits, y)
    (loss * 2.0 ** 30).backward()
    assert not torch.isfinite(logits.grad).all()
    model = tt.port(copy.deepcopy(base))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 30)
    with tt.precision.training(model, optimizer, scaler) as p:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    (step,) = p.steps
    assert step.skipped and step.first_inf is not None and step.first_inf.rule == "CrossEntropy"
