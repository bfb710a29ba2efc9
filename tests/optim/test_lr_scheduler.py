"""torchtrace.optim.lr_scheduler against torch.optim.lr_scheduler: the same lr (and momentum) sequence, step by step."""
import pytest
import torch

import torchtrace as tt
import torchtrace.optim as tto
from torchtrace.optim import lr_scheduler as ours_sched

torch_sched = torch.optim.lr_scheduler


def two_groups(make_tensor, lrs=(0.1, 0.03)) -> list:
    return [{"params": [make_tensor()], "lr": lrs[0]}, {"params": [make_tensor()], "lr": lrs[1]}]


def optimizers(name: str, **options):
    """The same optimizer (two param groups) in torchtrace (on tracers) and in torch (on tensors)."""
    ours = getattr(tto, name)(two_groups(lambda: tt.tracer(torch.zeros(2), requires_grad=True)), **options)
    theirs = getattr(torch.optim, name)(two_groups(lambda: torch.zeros(2, requires_grad=True)), **options)
    return ours, theirs


def momenta(optimizer) -> list:
    return [(g.get("momentum"), g.get("betas")) for g in optimizer.param_groups]


def assert_same_sequence(ours, theirs, ours_opt, theirs_opt, steps: int, metrics=None) -> int:
    """Step both side by side; returns how many distinct lr lists were seen (so a test can tell the lr moved)."""
    assert ours.get_last_lr() == theirs.get_last_lr()
    seen = {tuple(ours.get_last_lr())}
    for i in range(steps):
        ours_opt.step()
        theirs_opt.step()
        if metrics is None:
            ours.step()
            theirs.step()
        else:
            ours.step(metrics[i])
            theirs.step(metrics[i])
        assert ours.get_last_lr() == theirs.get_last_lr(), f"step {i}"
        assert [g["lr"] for g in ours_opt.param_groups] == [g["lr"] for g in theirs_opt.param_groups]
        assert momenta(ours_opt) == momenta(theirs_opt), f"step {i}"
        assert ours.last_epoch == theirs.last_epoch
        seen.add(tuple(ours.get_last_lr()))
    return len(seen)


CASES = [
    ("StepLR", dict(step_size=7, gamma=0.5)),
    ("StepLR", dict(step_size=1)),
    ("MultiStepLR", dict(milestones=[10, 30, 30, 60], gamma=0.3)),
    ("ExponentialLR", dict(gamma=0.97)),
    ("CosineAnnealingLR", dict(T_max=25, eta_min=0.001)),
    ("CosineAnnealingLR", dict(T_max=40)),
    ("LambdaLR", dict(lr_lambda=lambda epoch: 1 / (1 + epoch))),
    ("LambdaLR", dict(lr_lambda=[lambda epoch: 0.95**epoch, lambda epoch: 1 + (epoch % 10)])),
    ("OneCycleLR", dict(max_lr=1.0, total_steps=120)),
    ("OneCycleLR", dict(max_lr=[0.5, 2.0], epochs=12, steps_per_epoch=10, anneal_strategy="linear")),
    ("OneCycleLR", dict(max_lr=1.0, total_steps=119, three_phase=True, pct_start=0.25, div_factor=10.0)),
    ("OneCycleLR", dict(max_lr=1.0, total_steps=120, cycle_momentum=False, final_div_factor=100.0)),
    ("OneCycleLR", dict(max_lr=0.3, total_steps=120, base_momentum=[0.8, 0.7], max_momentum=0.9)),
    ("ConstantLR", dict()),
    ("ConstantLR", dict(factor=0.25, total_iters=40)),
    ("LinearLR", dict()),
    ("LinearLR", dict(start_factor=0.05, end_factor=0.7, total_iters=60)),
    ("LinearLR", dict(start_factor=1.0, end_factor=0.0, total_iters=100)),
    ("PolynomialLR", dict(total_iters=50, power=2.0)),
    ("PolynomialLR", dict(total_iters=90, power=0.5)),
    ("CosineAnnealingWarmRestarts", dict(T_0=10)),
    ("CosineAnnealingWarmRestarts", dict(T_0=7, T_mult=2, eta_min=0.001)),
    ("CyclicLR", dict(base_lr=0.01, max_lr=0.1, step_size_up=9)),
    ("CyclicLR", dict(base_lr=[0.01, 0.001], max_lr=[0.2, 0.05], step_size_up=6, step_size_down=14,
                      mode="triangular2")),
    ("CyclicLR", dict(base_lr=0.01, max_lr=0.1, step_size_up=8, mode="exp_range", gamma=0.98,
                      base_momentum=[0.8, 0.75], max_momentum=0.95)),
    ("CyclicLR", dict(base_lr=0.01, max_lr=0.1, step_size_up=5, cycle_momentum=False,
                      scale_fn=lambda x: 0.5 ** x, scale_mode="iterations")),
]
OPTIMIZERS = [("SGD", dict(momentum=0.9)), ("Adam", dict())]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=[name for name, _ in OPTIMIZERS])
@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}{i}" for i, (n, _) in enumerate(CASES)])
def test_lr_sequence_matches_torch(name, options, optimizer):
    ours_opt, theirs_opt = optimizers(*optimizer[:1], **optimizer[1])
    ours = getattr(ours_sched, name)(ours_opt, **options)
    theirs = getattr(torch_sched, name)(theirs_opt, **options)
    distinct = assert_same_sequence(ours, theirs, ours_opt, theirs_opt, 119 if name == "OneCycleLR" else 110)
    assert distinct > (1 if name == "ConstantLR" else 3)  # the lr moved (ConstantLR has two values)


def test_one_cycle_lr_reaches_its_peak_and_its_floor():
    ours_opt, _ = optimizers("SGD", momentum=0.9)
    schedule = ours_sched.OneCycleLR(ours_opt, max_lr=1.0, total_steps=100)
    seen = [schedule.get_last_lr()[0]]
    for _ in range(99):
        ours_opt.step()
        schedule.step()
        seen.append(schedule.get_last_lr()[0])
    assert seen[0] == pytest.approx(1.0 / 25) and max(seen) == pytest.approx(1.0)
    assert seen[-1] == pytest.approx(1.0 / 25 / 1e4)
    assert min(g["momentum"] for g in ours_opt.param_groups) == pytest.approx(0.95)


def test_chained_schedulers_compose_like_torchs():
    ours_opt, theirs_opt = optimizers("SGD")
    ours = [ours_sched.ExponentialLR(ours_opt, gamma=0.9), ours_sched.MultiStepLR(ours_opt, milestones=[5, 8])]
    theirs = [torch_sched.ExponentialLR(theirs_opt, gamma=0.9), torch_sched.MultiStepLR(theirs_opt, milestones=[5, 8])]
    for _ in range(12):
        ours_opt.step()
        theirs_opt.step()
        for a, b in zip(ours, theirs):
            a.step()
            b.step()
        assert [g["lr"] for g in ours_opt.param_groups] == [g["lr"] for g in theirs_opt.param_groups]


PLATEAU_METRICS = [1.0, 0.9, 0.9, 0.95, 0.9, 0.91, 0.8, 0.8, 0.85, 0.8, 0.79999, 0.9, 0.9, 0.7, 0.7, 0.7, 0.7,
                   0.71] * 7


@pytest.mark.parametrize("options", [
    dict(),
    dict(patience=2, factor=0.5),
    dict(patience=1, factor=0.5, cooldown=2, min_lr=[0.01, 0.001]),
    dict(mode="max", patience=0, threshold=0.05),
    dict(patience=1, threshold_mode="abs", threshold=0.05, min_lr=1e-4),
    dict(mode="max", threshold_mode="abs", patience=3, eps=1e-3, factor=0.9),
])
def test_reduce_lr_on_plateau_matches_torch(options):
    ours_opt, theirs_opt = optimizers("SGD")
    ours = ours_sched.ReduceLROnPlateau(ours_opt, **options)
    theirs = torch_sched.ReduceLROnPlateau(theirs_opt, **options)
    distinct = assert_same_sequence(ours, theirs, ours_opt, theirs_opt, len(PLATEAU_METRICS), metrics=PLATEAU_METRICS)
    assert distinct > 3  # the lrs were reduced several times, min_lr and cooldown included
    assert ours.num_bad_epochs == theirs.num_bad_epochs and ours.best == theirs.best


def test_reduce_lr_on_plateau_accepts_a_0d_tensor_metric():
    ours_opt, _ = optimizers("SGD")
    schedule = ours_sched.ReduceLROnPlateau(ours_opt, patience=0)
    schedule.step(tt.tracer(1.0))
    schedule.step(torch.tensor(2.0))
    assert schedule.get_last_lr() == pytest.approx([0.01, 0.003])


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_every_optimizer_follows_the_schedule(name):
    ours_opt, theirs_opt = optimizers(name, lr=0.1)
    ours = ours_sched.StepLR(ours_opt, step_size=3, gamma=0.5)
    theirs = torch_sched.StepLR(theirs_opt, step_size=3, gamma=0.5)
    assert assert_same_sequence(ours, theirs, ours_opt, theirs_opt, 10) == 4


@pytest.mark.parametrize("optimizer, schedule", [
    (("SGD", dict(lr=0.01, momentum=0.9, nesterov=True)), ("OneCycleLR", dict(max_lr=0.02, total_steps=100))),
    (("Adam", dict(lr=0.01)), ("OneCycleLR", dict(max_lr=0.05, total_steps=100, three_phase=True))),
    (("RMSprop", dict(lr=0.01, momentum=0.5)), ("CosineAnnealingLR", dict(T_max=30, eta_min=1e-3))),
    (("AdamW", dict(lr=0.02)), ("StepLR", dict(step_size=10, gamma=0.5))),
])
def test_training_under_a_schedule_matches_torch(optimizer, schedule):
    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(5, dtype=torch.float64, generator=gen), torch.randn(5, dtype=torch.float64, generator=gen)]
    target = torch.randn(5, dtype=torch.float64, generator=gen)
    ours = [tt.tracer(v, requires_grad=True) for v in init]
    theirs = [v.clone().requires_grad_(True) for v in init]
    runs = []
    for params, optim_module, sched_module in ((ours, tto, ours_sched), (theirs, torch.optim, torch_sched)):
        opt = getattr(optim_module, optimizer[0])(params, **optimizer[1])
        runs.append((params, opt, getattr(sched_module, schedule[0])(opt, **schedule[1])))
    for _ in range(100):
        for params, opt, sched in runs:
            opt.zero_grad()
            w, b = params
            ((w * b - target) ** 2).sum().backward()
            opt.step()
            sched.step()
    assert all(torch.isfinite(p).all() for p in theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach().as_subclass(torch.Tensor), b.detach(), atol=1e-10, rtol=0)


@pytest.mark.parametrize("name, options", [
    ("StepLR", dict(step_size=4)),
    ("CosineAnnealingLR", dict(T_max=7)),
    ("OneCycleLR", dict(max_lr=1.0, total_steps=60)),
    ("LambdaLR", dict(lr_lambda=lambda epoch: 0.9**epoch)),
])
def test_state_dict_round_trip(name, options):
    opt, _ = optimizers("SGD", momentum=0.9)
    uninterrupted = getattr(ours_sched, name)(opt, **options)
    for _ in range(40):
        opt.step()
        uninterrupted.step()

    first_opt, _ = optimizers("SGD", momentum=0.9)
    first = getattr(ours_sched, name)(first_opt, **options)
    for _ in range(20):
        first_opt.step()
        first.step()
    saved_opt, saved = first_opt.state_dict(), first.state_dict()
    assert "optimizer" not in saved

    resumed_opt, _ = optimizers("SGD", momentum=0.9)
    resumed_opt.load_state_dict(saved_opt)
    resumed = getattr(ours_sched, name)(resumed_opt, **options)
    resumed.load_state_dict(saved)
    for _ in range(20):
        resumed_opt.step()
        resumed.step()
    assert resumed.get_last_lr() == uninterrupted.get_last_lr() and resumed.last_epoch == 40


def test_lambda_lr_state_dict_keeps_callable_objects_and_skips_functions():
    class Decay:
        def __init__(self, rate):
            self.rate = rate

        def __call__(self, epoch):
            return self.rate**epoch

    opt, _ = optimizers("SGD")
    schedule = ours_sched.LambdaLR(opt, [Decay(0.5), lambda epoch: 1.0])
    saved = schedule.state_dict()
    assert saved["lr_lambdas"] == [{"rate": 0.5}, None]
    other = ours_sched.LambdaLR(opt, [Decay(0.9), lambda epoch: 1.0])
    other.load_state_dict(saved)
    assert other.lr_lambdas[0].rate == 0.5


def test_resuming_with_last_epoch_needs_initial_lr():
    opt, _ = optimizers("SGD")
    with pytest.raises(KeyError, match="initial_lr"):
        ours_sched.StepLR(opt, step_size=2, last_epoch=5)
    ours_opt, theirs_opt = optimizers("SGD")
    ours_sched.StepLR(ours_opt, 3), torch_sched.StepLR(theirs_opt, 3)  # sets each group's initial_lr
    ours2, theirs2 = ours_sched.StepLR(ours_opt, 3, last_epoch=4), torch_sched.StepLR(theirs_opt, 3, last_epoch=4)
    assert ours2.last_epoch == theirs2.last_epoch and ours2.get_last_lr() == theirs2.get_last_lr()
    assert_same_sequence(ours2, theirs2, ours_opt, theirs_opt, 10)


@pytest.mark.parametrize("make, error, message", [
    (lambda opt: ours_sched.StepLR(object(), 2), TypeError, "object is not an Optimizer"),
    (lambda opt: ours_sched.LambdaLR(opt, [lambda e: 1.0]), ValueError, "Expected 2 lr_lambdas, but got 1"),
    (lambda opt: ours_sched.OneCycleLR(opt, max_lr=1.0), ValueError, "either total_steps OR"),
    (lambda opt: ours_sched.OneCycleLR(opt, max_lr=1.0, total_steps=0), ValueError, "positive integer total_steps"),
    (lambda opt: ours_sched.OneCycleLR(opt, max_lr=1.0, epochs=2, steps_per_epoch=0), ValueError,
     "positive integer steps_per_epoch"),
    (lambda opt: ours_sched.OneCycleLR(opt, 1.0, 10, pct_start=2.0), ValueError, "between 0 and 1 pct_start"),
    (lambda opt: ours_sched.OneCycleLR(opt, 1.0, 10, anneal_strategy="exp"), ValueError, "anneal_strategy"),
    (lambda opt: ours_sched.OneCycleLR(opt, [1.0], 10), ValueError, "max_lr must have the same length"),
    (lambda opt: ours_sched.ReduceLROnPlateau(opt, factor=1.0), ValueError, "Factor should be < 1.0"),
    (lambda opt: ours_sched.ReduceLROnPlateau(opt, mode="up"), ValueError, "mode up is unknown"),
    (lambda opt: ours_sched.ReduceLROnPlateau(opt, threshold_mode="x"), ValueError, "threshold mode x is unknown"),
    (lambda opt: ours_sched.ReduceLROnPlateau(opt, min_lr=[0.1]), ValueError, "expected 2 min_lrs, got 1"),
])
def test_refused_arguments(make, error, message):
    opt, _ = optimizers("SGD")
    with pytest.raises(error, match=message):
        make(opt)


def test_one_cycle_lr_needs_a_momentum_to_cycle_and_stops_at_total_steps():
    opt, _ = optimizers("Adagrad")
    with pytest.raises(ValueError, match="optimizer must support momentum or beta1"):
        ours_sched.OneCycleLR(opt, max_lr=1.0, total_steps=10)
    schedule = ours_sched.OneCycleLR(opt, max_lr=1.0, total_steps=3, cycle_momentum=False)
    for _ in range(3):
        schedule.step()
    with pytest.raises(ValueError, match="Tried to step 4 times. The specified number of total steps is 3"):
        schedule.step()


def sequential(module, optimizer):
    s = module
    return s.SequentialLR(optimizer, [s.LinearLR(optimizer, start_factor=0.1, total_iters=10),
                                      s.CosineAnnealingLR(optimizer, T_max=30, eta_min=0.001),
                                      s.StepLR(optimizer, step_size=7, gamma=0.5),
                                      s.ExponentialLR(optimizer, gamma=0.97)], milestones=[10, 40, 70])


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=[name for name, _ in OPTIMIZERS])
def test_sequential_lr_matches_torch(optimizer):
    ours_opt, theirs_opt = optimizers(*optimizer[:1], **optimizer[1])
    ours, theirs = sequential(ours_sched, ours_opt), sequential(torch_sched, theirs_opt)
    assert assert_same_sequence(ours, theirs, ours_opt, theirs_opt, 120) > 50


def test_cosine_warm_restarts_fractional_epochs_match_torch():
    ours_opt, theirs_opt = optimizers("SGD")
    ours = ours_sched.CosineAnnealingWarmRestarts(ours_opt, T_0=3, T_mult=2)
    theirs = torch_sched.CosineAnnealingWarmRestarts(theirs_opt, T_0=3, T_mult=2)
    for epoch in range(12):
        for i in range(5):
            ours.step(epoch + i / 5)
            theirs.step(epoch + i / 5)
            assert ours.get_last_lr() == theirs.get_last_lr()
    with pytest.raises(ValueError, match="Expected non-negative epoch"):
        ours.step(-1)


NEW = ["ConstantLR", "LinearLR", "PolynomialLR", "CosineAnnealingWarmRestarts", "CyclicLR", "SequentialLR"]


@pytest.mark.parametrize("name", NEW)
def test_new_schedulers_are_exported(name):
    assert getattr(tto, name) is getattr(ours_sched, name)


@pytest.mark.parametrize("name, options", [c for c in CASES if c[0] in NEW[:5]] + [("SequentialLR", None)],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_state_dict_round_trip_continues_the_sequence(name, options):
    """Save optimizer and scheduler, rebuild both and load (torch's resume recipe) on each side: same sequence."""
    def make(module, optimizer):
        return sequential(module, optimizer) if name == "SequentialLR" else getattr(module, name)(optimizer, **options)

    ours_opt, theirs_opt = optimizers("SGD", momentum=0.9)
    ours, theirs = make(ours_sched, ours_opt), make(torch_sched, theirs_opt)
    assert_same_sequence(ours, theirs, ours_opt, theirs_opt, 37)
    fresh_ours, fresh_theirs = optimizers("SGD", momentum=0.9)
    fresh_ours.load_state_dict(ours_opt.state_dict())
    fresh_theirs.load_state_dict(theirs_opt.state_dict())
    resumed_ours, resumed_theirs = make(ours_sched, fresh_ours), make(torch_sched, fresh_theirs)
    resumed_ours.load_state_dict(ours.state_dict())
    resumed_theirs.load_state_dict(theirs.state_dict())
    assert resumed_ours.last_epoch == theirs.last_epoch == 37
    assert assert_same_sequence(resumed_ours, resumed_theirs, fresh_ours, fresh_theirs, 30) > 1


def test_new_scheduler_argument_errors_match_torch():
    ours_opt, _ = optimizers("SGD")
    with pytest.raises(ValueError, match="Constant multiplicative factor expected to be between 0 and 1"):
        ours_sched.ConstantLR(ours_opt, factor=2.0)
    with pytest.raises(ValueError, match="Starting multiplicative factor expected to be greater than 0"):
        ours_sched.LinearLR(ours_opt, start_factor=0.0)
    with pytest.raises(ValueError, match="Expected positive integer T_0"):
        ours_sched.CosineAnnealingWarmRestarts(ours_opt, T_0=0)
    with pytest.raises(ValueError, match="mode is invalid and scale_fn is None"):
        ours_sched.CyclicLR(ours_opt, 0.01, 0.1, mode="sawtooth")
    adagrad = tto.Adagrad([tt.tracer(torch.zeros(2), requires_grad=True)])
    with pytest.raises(ValueError, match="optimizer must support momentum or beta1"):
        ours_sched.CyclicLR(adagrad, 0.01, 0.1)
    with pytest.raises(ValueError, match="number of milestones to be equal to 2"):
        ours_sched.SequentialLR(ours_opt, [ours_sched.StepLR(ours_opt, 3)], milestones=[3, 5])
