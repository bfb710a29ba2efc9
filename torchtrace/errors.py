"""The exceptions torchtrace raises on bad input, and the messages the core raises or warns with as torch does."""


class UnsupportedOperationError(NotImplementedError):
    """A torch callable was applied to a tracer that needs a gradient, and no rule is registered."""


class GradientMismatch(AssertionError):
    """tt.check / tt.gradcheck found a gradient that disagrees with the reference."""


NON_LEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad attribute won't be "
    "populated during autograd.backward(). If you indeed want the .grad field to be populated for a non-leaf Tensor, "
    "use .retain_grad() on the non-leaf Tensor. If you access the non-leaf Tensor by mistake, make sure you access "
    "the leaf Tensor instead.")


def saved_inference_tensor(rule_name: str) -> RuntimeError:
    """A rule saved a tensor made under torch.inference_mode (it has no version counter)."""
    return RuntimeError(f"{rule_name}: a tensor made under torch.inference_mode cannot be saved for backward (it "
                        "has no version counter). Make it outside inference_mode, or use a clone made outside it "
                        "(t = t.clone() after the with block).")


def instantiated_function(name: str) -> TypeError:
    """Sq(x) instead of Sq.apply(x)."""
    return TypeError(f"{name} should not be instantiated: the methods of a Function are static. Call "
                     f"{name}.apply(...) with forward's arguments (as for torch's autograd Functions).")
