"""torch's lr schedulers drive torchtrace optimizers: the same model trained by torch.optim on torch autograd and by
torchtrace.optim on tracers, under the same scheduler, follows the same trajectory (parameters and lr, every step)."""
import pytest
import torch
from test_optimizers import DATA, as_plain, initial_values, model_loss, torch_leaves, tracers

import torchtrace as tt
import torchtrace.optim as tto

S = torch.optim.lr_scheduler


def sequential(opt):
    return S.SequentialLR(opt, [S.LinearLR(opt, start_factor=0.1, total_iters=5), S.ExponentialLR(opt, gamma=0.9)],
                          milestones=[5])


def chained(opt):
    return S.ChainedScheduler([S.ExponentialLR(opt, gamma=0.95), S.MultiStepLR(opt, milestones=[8, 16])],
                              optimizer=opt)


SCHEDULERS = {  # every scheduler torch has, built on an optimizer
    "LambdaLR": lambda opt: S.LambdaLR(opt, lr_lambda=lambda epoch: 0.95**epoch),
    "MultiplicativeLR": lambda opt: S.MultiplicativeLR(opt, lr_lambda=lambda epoch: 0.97),
    "StepLR": lambda opt: S.StepLR(opt, step_size=7, gamma=0.5),
    "MultiStepLR": lambda opt: S.MultiStepLR(opt, milestones=[5, 12, 20], gamma=0.3),
    "ConstantLR": lambda opt: S.ConstantLR(opt, factor=0.25, total_iters=10),
    "LinearLR": lambda opt: S.LinearLR(opt, start_factor=0.1, total_iters=15),
    "ExponentialLR": lambda opt: S.ExponentialLR(opt, gamma=0.95),
    "SequentialLR": sequential,
    "CosineAnnealingLR": lambda opt: S.CosineAnnealingLR(opt, T_max=10, eta_min=1e-3),
    "ChainedScheduler": chained,
    "ReduceLROnPlateau": lambda opt: S.ReduceLROnPlateau(opt, patience=1, factor=0.5, threshold=0.05),
    "CyclicLR": lambda opt: S.CyclicLR(opt, base_lr=0.001, max_lr=0.05, step_size_up=4),
    "CosineAnnealingWarmRestarts": lambda opt: S.CosineAnnealingWarmRestarts(opt, T_0=5, T_mult=2),
    "OneCycleLR": lambda opt: S.OneCycleLR(opt, max_lr=0.05, total_steps=40),
    "PolynomialLR": lambda opt: S.PolynomialLR(opt, total_iters=20, power=2.0),
}
OPTIMIZERS = [("SGD", dict(lr=0.05, momentum=0.9)), ("Adam", dict(lr=0.02)), ("RMSprop", dict(lr=0.01, momentum=0.5)),
              ("AdamW", dict(lr=0.02)), ("Adagrad", dict(lr=0.1))]
NEEDS_MOMENTUM = {"CyclicLR", "OneCycleLR"}  # they cycle momentum / beta1 by default


def test_the_table_has_every_torch_scheduler():
    assert set(SCHEDULERS) == set(S.__all__) - {"LRScheduler"}  # a scheduler added to torch gets a row here


def group_values(opt) -> list:
    return [(g["lr"], g.get("momentum"), g.get("betas")) for g in opt.param_groups]


def train(optimizer_module, params, name, options, scheduler, steps=40):
    """Train under the schedule; return the lrs and parameters after every step."""
    opt = getattr(optimizer_module, name)([{"params": params[:2]}, {"params": params[2:], "lr": options["lr"] / 2}],
                                          **options)
    schedule = SCHEDULERS[scheduler](opt)
    seen = []
    for i in range(steps):
        opt.zero_grad()
        loss = model_loss(params, *DATA[i % len(DATA)])
        loss.backward()
        opt.step()
        schedule.step(loss.item()) if scheduler == "ReduceLROnPlateau" else schedule.step()
        seen.append((group_values(opt), [as_plain(p).clone() for p in params]))
    return seen


# every pair but Adagrad under a momentum-cycling scheduler: Adagrad has no momentum or beta1 to cycle (torch refuses)
PAIRS = [pytest.param(scheduler, optimizer, id=f"{scheduler}-{optimizer[0]}") for scheduler in sorted(SCHEDULERS)
         for optimizer in OPTIMIZERS if not (scheduler in NEEDS_MOMENTUM and optimizer[0] == "Adagrad")]


@pytest.mark.parametrize("scheduler, optimizer", PAIRS)
def test_training_under_every_scheduler_matches_torch(scheduler, optimizer):
    name, options = optimizer
    init = initial_values()
    ours = train(tto, tracers(init), name, options, scheduler)
    theirs = train(torch.optim, torch_leaves(init), name, options, scheduler)
    for step, ((our_groups, our_params), (their_groups, their_params)) in enumerate(zip(ours, theirs)):
        assert our_groups == their_groups, f"step {step}"
        for a, b in zip(our_params, their_params):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=f"step {step}")
    distinct = len({tuple(lr for lr, _, _ in groups) for groups, _ in ours})
    assert distinct >= (2 if scheduler == "ConstantLR" else 3), "the schedule did not move the lr"


def test_old_imports_are_torchs_schedulers():
    assert tto.lr_scheduler.StepLR is tto.StepLR is S.StepLR
    assert tto.ReduceLROnPlateau is S.ReduceLROnPlateau and tto.LRScheduler is S.LRScheduler
    assert set(tto.lr_scheduler.__all__) == set(S.__all__)


def test_a_torch_scheduler_refuses_what_is_not_an_optimizer():
    with pytest.raises(TypeError, match="is not an Optimizer"):
        S.StepLR(object(), step_size=2)


def test_optimizer_and_scheduler_resume_from_state_dicts():
    """torch's resume recipe on tracers: rebuild both, load both, and the run continues as if never stopped."""
    def make(params):
        opt = tto.SGD(params, lr=0.1, momentum=0.9)
        return opt, S.OneCycleLR(opt, max_lr=0.2, total_steps=30)

    def steps(params, opt, schedule, start, n):
        for i in range(start, start + n):
            opt.zero_grad()
            model_loss(params, *DATA[i % len(DATA)]).backward()
            opt.step()
            schedule.step()

    init = initial_values()
    straight = tracers(init)
    steps(straight, *make(straight), 0, 30)
    first = tracers(init)
    opt, schedule = make(first)
    steps(first, opt, schedule, 0, 12)
    resumed = tracers([as_plain(p) for p in first])
    opt2, schedule2 = make(resumed)
    opt2.load_state_dict(opt.state_dict())
    schedule2.load_state_dict(schedule.state_dict())
    steps(resumed, opt2, schedule2, 12, 18)
    for a, b in zip(resumed, straight):
        torch.testing.assert_close(as_plain(a), as_plain(b), atol=0, rtol=0)


def test_reduce_lr_on_plateau_takes_a_tracer_loss():
    opt = tto.SGD([tt.tracer(torch.zeros(2), requires_grad=True)], lr=0.1)
    schedule = S.ReduceLROnPlateau(opt, patience=0)
    schedule.step(tt.tracer(1.0))
    schedule.step(tt.tracer(2.0))
    assert schedule.get_last_lr() == pytest.approx([0.01])


@pytest.mark.parametrize("scheduler", sorted(NEEDS_MOMENTUM))
def test_momentum_cycling_schedulers_refuse_adagrad_as_torch(scheduler):
    init = initial_values()
    for optimizer_module, params in ((tto, tracers(init)), (torch.optim, torch_leaves(init))):
        with pytest.raises(ValueError, match="momentum"):
            SCHEDULERS[scheduler](optimizer_module.Adagrad(params, lr=0.1))
