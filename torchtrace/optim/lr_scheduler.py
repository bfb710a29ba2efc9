"""Learning-rate schedulers: torch's own, re-exported (tt.optim.lr_scheduler.StepLR is torch.optim.lr_scheduler.StepLR).

A schedule only rewrites `group["lr"]` (and momentum / betas) between steps; no gradient is involved, so there is
nothing for torchtrace to differentiate. Every torchtrace.optim optimizer is a torch.optim.Optimizer, which is
all torch's schedulers ask for.
"""
from torch.optim.lr_scheduler import (
    ChainedScheduler,
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CyclicLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    OneCycleLR,
    PolynomialLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
           "ExponentialLR", "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR",
           "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR"]
