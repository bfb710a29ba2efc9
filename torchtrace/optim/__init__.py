"""torchtrace.optim: optimizers with torch.optim's signatures and hand-written update rules; torch's schedulers."""
from torchtrace.optim import lr_scheduler
from torchtrace.optim.adagrad import Adagrad
from torchtrace.optim.adam import Adam, AdamW
from torchtrace.optim.lr_scheduler import (
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
from torchtrace.optim.optimizer import Optimizer
from torchtrace.optim.rmsprop import RMSprop
from torchtrace.optim.sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "lr_scheduler", "LRScheduler", "LambdaLR",
           "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR", "SequentialLR",
           "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR", "CosineAnnealingWarmRestarts",
           "OneCycleLR", "PolynomialLR"]
