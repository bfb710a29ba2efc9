"""Learning-rate schedulers: torch's own, re-exported (tt.optim.lr_scheduler.StepLR is torch.optim.lr_scheduler.StepLR).

A schedule only rewrites `group["lr"]` (and momentum / betas) between steps; no gradient is involved, so there is
nothing for torchtrace to differentiate. Every torchtrace.optim optimizer is a torch.optim.Optimizer, which is
all torch's schedulers ask for. The list of names is torch's own (`__all__`), so it is written nowhere here.
"""
import torch.optim.lr_scheduler as _torch_schedulers

__all__ = list(_torch_schedulers.__all__)
globals().update({name: getattr(_torch_schedulers, name) for name in __all__})
