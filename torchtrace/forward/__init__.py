"""Forward mode: tangents carried through one forward pass (dual numbers), and Jacobians in either mode.

- `dual.py`: the pass, an observer of the recording that gives each result its tangent;
- `table.py`: the tangent table (each gradient rule's `result:` line), filled by the family modules below;
- `custom.py`: a user Function's own `jvp`;
- `transpose.py`: J v = d/du < J^T u, v >, for ops without a tangent rule and as the lesson of notebook 06a;
- `api.py`: tt.jvp and tt.jacobian.
"""
from torchtrace.forward import linalg, nn_layers, pointwise, reductions, shapes  # noqa: F401  (fill the table)
from torchtrace.forward.api import TransposedOpsWarning, jacobian, jvp

__all__ = ["jvp", "jacobian", "TransposedOpsWarning"]
