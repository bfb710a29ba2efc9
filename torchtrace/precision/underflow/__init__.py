"""The doctor's underflow check, a package of its own below both the doctor and tt.precision: it reads graph nodes
only, so the doctor can use it while tt.precision uses the doctor's recording."""
from torchtrace.precision.underflow.watch import UnderflowWatch

__all__ = ["UnderflowWatch"]
