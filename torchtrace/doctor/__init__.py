"""The gradient doctor: tt.diagnose (what is wrong with a backward, by rule and line; .training for a loop) and
tt.diff (two backward passes aligned rule by rule)."""
from torchtrace.doctor.diagnose import diagnose
from torchtrace.doctor.diff import diff
from torchtrace.doctor.training import training

diagnose.training = training  # type: ignore[attr-defined]  (tt.diagnose.training(model, optimizer))

__all__ = ["diagnose", "diff", "training"]
