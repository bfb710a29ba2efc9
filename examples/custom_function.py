"""Writing a new gradient rule: derive it, implement it as a tt.Function, register it, verify it.

The op: z = logaddexp(a, b) = log(e^a + e^b), a smooth maximum. torchtrace ships a rule for it; we write our
own to show how, and registering it replaces the built-in one.

    dz/da = e^a / (e^a + e^b) = e^(a - z)        dz/db = e^(b - z)

Both use only the inputs and the output, which is all a rule may save (so that gradients of gradients
work too). The steps:

1. call an op torchtrace has no rule for (the Bessel function torch.special.bessel_j0) on a tracer: torchtrace
   refuses, naming the callable (it never guesses a gradient);
2. write the rule as a `tt.Function` and try it with `.apply`;
3. see how `tt.check` catches a wrong rule and names the node whose gradient diverges;
4. `tt.register` the rule for every alias (torch.logaddexp, Tensor.logaddexp): ordinary torch code now
   differentiates through it; verify it against torch autograd (`tt.check`) and finite differences
   (`tt.gradcheck`), broadcasting included, and check a second derivative against the formula.

    python examples/custom_function.py
"""
import argparse
from typing import Any, Dict, Optional, Sequence

import torch

import torchtrace as tt


class LogAddExp(tt.Function):
    """z = log(e^a + e^b)  ->  dz/da = e^(a - z), dz/db = e^(b - z)"""

    @staticmethod
    def forward(ctx, input, other):
        z = torch.logaddexp(input, other)  # forward runs on plain tensors: torch computes the value
        ctx.save_for_backward(input, other, z)  # only inputs and outputs are saved
        return z

    @staticmethod
    def backward(ctx, grad):
        a, b, z = ctx.saved_tensors
        grad_a = grad * torch.exp(a - z) if ctx.needs_input_grad[0] else None
        grad_b = grad * torch.exp(b - z) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b  # the engine sums broadcast dimensions away: no shape handling here


class BuggyLogAddExp(LogAddExp):
    """A wrong rule, as one might first write it: dz/db = e^(a - z) (copied from the line above)."""

    @staticmethod
    def backward(ctx, grad):
        a, b, z = ctx.saved_tensors
        return grad * torch.exp(a - z), grad * torch.exp(a - z)


def smooth_max_loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Ordinary torch code: broadcasting, a method call, and the input `a` used twice."""
    return (torch.logaddexp(a, b) * a).sum() + a.logaddexp(b.exp()).mean()


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="accepted for uniformity: this example is small")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    a, b = torch.randn(4, 3), torch.randn(3)  # b broadcasts against a
    result: Dict[str, Any] = {}

    print("1. an op without a rule is refused:")
    x, y = tt.tracer(a, requires_grad=True), tt.tracer(b, requires_grad=True)
    try:
        torch.special.bessel_j0(x)
        result["refusal"] = None
        print("   torch.special.bessel_j0 now has a rule: this step needs another op without one")
    except tt.UnsupportedOperationError as error:
        result["refusal"] = str(error)
        print("   UnsupportedOperationError:", str(error).splitlines()[0])

    print("2. the rule, applied directly:")
    z = LogAddExp.apply(x, y)
    z.sum().backward(show=True)
    expected = torch.exp(a - torch.logaddexp(a, b))
    print(f"   x.grad == e^(a - z): {torch.allclose(x.grad, expected)}")

    print("3. tt.check against torch autograd catches a wrong rule:")
    tt.register(torch.logaddexp, torch.Tensor.logaddexp, BuggyLogAddExp)
    try:
        tt.check(smooth_max_loss, a, b)
        result["bug_report"] = None
    except tt.GradientMismatch as mismatch:
        result["bug_report"] = str(mismatch)
        print("   GradientMismatch:", str(mismatch).replace("\n", "\n   "))

    print("4. the right rule, registered for every alias and verified:")
    tt.register(torch.logaddexp, torch.Tensor.logaddexp, LogAddExp)
    report = tt.check(smooth_max_loss, a, b, check_inputs=[(torch.randn(2, 5), torch.randn(2, 1))])
    print("  ", report)
    result["check"] = report
    result["gradcheck"] = tt.gradcheck(smooth_max_loss, a, b)
    print(f"   tt.gradcheck (finite differences, float64): {result['gradcheck']}")

    # d2z/da2 = s (1 - s) with s = e^(a - z) = sigmoid(a - b): backward's own ops are recorded (create_graph)
    x = tt.tracer(a, requires_grad=True)
    (first,) = tt.grad(torch.logaddexp(x, b).sum(), x, create_graph=True)
    (second,) = tt.grad(first.sum(), x)
    s = torch.sigmoid(a - b)
    result["second_derivative_error"] = (second - s * (1 - s)).abs().max().item()
    print(f"   second derivative vs s(1 - s): max |diff| = {result['second_derivative_error']:.2e}")
    return result


if __name__ == "__main__":
    main()
