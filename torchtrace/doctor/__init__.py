"""The gradient doctor: tt.diagnose (what is wrong with a backward, by rule and line; .training for a loop) and
tt.diff (two backward passes aligned rule by rule)."""
from torchtrace.doctor.comparison import diff
from torchtrace.doctor.diagnosis import diagnose
from torchtrace.doctor.memory import memory
from torchtrace.doctor.training import training

diagnose.training = training  # type: ignore[attr-defined]  (tt.diagnose.training(model, optimizer))
diagnose.memory = memory  # type: ignore[attr-defined]  (tt.diagnose.memory(fn, *args))

__all__ = ["diagnose", "diff", "training", "memory"]
