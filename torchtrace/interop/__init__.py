"""Bridges to torch machinery that torchtrace cannot follow by itself (installed once when torchtrace loads).

- A torch autograd Function on tracers runs its own forward/backward as a torchtrace node (function_bridge.py).
- torch.utils.checkpoint on tracers recomputes in backward (checkpoint.py).
- torch.vmap / torch.func transforms / torch.compile / autograd.grad on tracers: a clear error (transforms.py,
  patches.py).
- torch.load(weights_only=True) of saved tracers and parameters (serialization.py).
"""
from torchtrace.interop import checkpoint, patches, serialization, transforms

patches.install()
transforms.install()
checkpoint.install()
serialization.install()
