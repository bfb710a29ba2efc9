"""tt.compile and to_code: a recorded run written out as plain torch code (forward, and backward from the rules)."""
from torchtrace.compiler.compiled import Compiled, compile, to_code

__all__ = ["compile", "to_code", "Compiled"]
