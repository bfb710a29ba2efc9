"""torchtrace.optim: optimizers with torch.optim's signatures and hand-written update rules; torch's schedulers."""
from torchtrace.optim import lr_scheduler
from torchtrace.optim.adagrad import Adagrad
from torchtrace.optim.adam import Adam, AdamW
from torchtrace.optim.optimizer import Optimizer
from torchtrace.optim.rmsprop import RMSprop
from torchtrace.optim.sgd import SGD

globals().update({name: getattr(lr_scheduler, name) for name in lr_scheduler.__all__})  # tt.optim.StepLR, ...
__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "lr_scheduler", *lr_scheduler.__all__]
