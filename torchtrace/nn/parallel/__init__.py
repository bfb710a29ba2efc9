"""torchtrace.nn.parallel: data parallelism on torch.distributed for models whose parameters are tracers."""
from torchtrace.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
