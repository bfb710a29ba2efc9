"""The curvature lab: second derivatives of a loss, from Hessian-vector products.

- `hvp.py`: tt.hvp (forward-over-reverse or reverse-over-reverse) and tt.hessian;
- `model_loss.py`: a model's loss over its data as a function of (a module's) parameters, flat;
- `lanczos.py`, `power.py`: top eigenvalues from HVPs; `hutchinson.py`: the trace; `density.py`: SLQ;
- `spectrum.py`: tt.spectrum, which puts those together on a model;
- `landscape.py`: tt.landscape, 1-D and 2-D slices of the loss, with a training path;
- `progress.py`: the progress bar of long runs.
"""
from torchtrace.curvature.density import Density
from torchtrace.curvature.hutchinson import Estimate
from torchtrace.curvature.hvp import HVPReport, hessian, hvp
from torchtrace.curvature.landscape import Landscape, landscape
from torchtrace.curvature.spectrum import Spectrum, spectrum

__all__ = ["hvp", "hessian", "spectrum", "landscape", "HVPReport", "Spectrum", "Landscape", "Density", "Estimate"]
