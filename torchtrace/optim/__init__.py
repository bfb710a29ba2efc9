"""torchtrace.optim: optimizers and learning-rate schedulers with torch.optim's signatures and update rules."""
from torchtrace.optim import lr_scheduler
from torchtrace.optim.adagrad import Adagrad
from torchtrace.optim.adam import Adam, AdamW
from torchtrace.optim.lr_scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CyclicLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
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
           "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "OneCycleLR", "ReduceLROnPlateau",
           "ConstantLR", "LinearLR", "PolynomialLR", "CosineAnnealingWarmRestarts", "CyclicLR", "SequentialLR"]
