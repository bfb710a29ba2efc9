"""What every graph tool checks first: a plain torch tensor reached it. torchtrace records only computations on
tracers, so such a tensor has no torchtrace graph (torch's autograd may have one: a `SumBackward0` is torch's)."""
from typing import Any, Iterable, List

import torch

from torchtrace.tracer import tracer

SHOW_ON_PLAIN_TENSORS = ("A plain tensor's own .backward(show=True) fails with \"unexpected keyword argument 'show'\" "
                         "for the same reason: show= belongs to tracers.")


def plain_tensor_message(tool: str, output: torch.Tensor) -> str:
    """What went wrong and the two ways to fix it: tt.tracer for hand-made leaves, tt.port for a torch model."""
    if output.grad_fn is not None:
        made = f"torch's autograd recorded it ({type(output.grad_fn).__name__})"
    else:
        made = "torch's autograd tracks it" if output.requires_grad else "nothing recorded it"
    return (f"{tool} got a plain torch.Tensor ({made}); torchtrace records only what is computed from tracers. "
            "Make your leaves tracers, x = tt.tracer(data, requires_grad=True), or port a torch model before its "
            f"forward, model = tt.port(model), so that its parameters are tracers. {SHOW_ON_PLAIN_TENSORS}")


def require_tracers(tool: str, outputs: Iterable[object]) -> None:
    """Raise a TypeError naming tt.tracer and tt.port when one of `outputs` is a plain torch tensor."""
    for output in outputs:
        if isinstance(output, torch.Tensor) and not isinstance(output, tracer):
            raise TypeError(plain_tensor_message(tool, output))


def output_list(tool: str, output: Any) -> List[torch.Tensor]:
    """The outputs a graph tool starts from: one tensor, or a non-empty list or tuple of them (a TypeError else)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (list, tuple)) and output and all(isinstance(o, torch.Tensor) for o in output):
        return list(output)
    raise TypeError(f"{tool} takes the output tracer whose graph to show (or a list of them), not "
                    f"{type(output).__name__}{' ' + repr(output) if isinstance(output, (list, tuple)) else ''}")
