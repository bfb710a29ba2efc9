"""The exceptions torchtrace raises on bad input."""


class UnsupportedOperationError(NotImplementedError):
    """A torch callable was applied to a tracer that needs a gradient, and no rule is registered."""


class GradientMismatch(AssertionError):
    """tt.check / tt.gradcheck found a gradient that disagrees with the reference."""
