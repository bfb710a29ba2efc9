"""Tangents of ops that move, copy, pick or sum elements: linear ops, so ẏ = op(ẋ) (derivatives.yaml's
`auto_linear`); and of ops that pick elements by a data-dependent index: ẏ = ẋ at those indices."""
import torch

from torchtrace.autograd.views import collect, spread
from torchtrace.forward.call import Call, NoTangent
from torchtrace.forward.kinds import linear, product
from torchtrace.forward.table import declare, tangent

declare("""BFloat16 BroadcastTo Cat Chunk Clone ColumnStack Contiguous Cpu Cuda DiagonalScatter Diagonal Double Dsplit
           Dstack ExpandAs Expand Flatten Flip Fliplr Flipud Float Half Hsplit Hstack MT Movedim Narrow Permute Ravel
           Repeat ReshapeAs Reshape Roll SelectScatter Select SliceScatter SplitWithSizes Split Squeeze Stack SumToSize
           Swapaxes TProperty T Transpose TensorSplit Tile To TypeAs Type Unbind Unflatten Unfold UnsafeChunk
           UnsafeSplitWithSizes UnsafeSplit Unsqueeze ViewAs View Vsplit Vstack Adjoint LinalgDiagonal
           CloneCopy DiagonalCopy ExpandCopy NarrowCopy PermuteCopy SelectCopy SliceCopy SplitCopy SplitWithSizesCopy
           SqueezeCopy TCopy TransposeCopy UnbindCopy UnfoldCopy UnsqueezeCopy ViewCopy Slice
           Atleast1dList Atleast1d Atleast2dList Atleast2d Atleast3dList Atleast3d BlockDiag BroadcastTensors
           CartesianProd Combinations DiagEmbed Diag Diagflat MeshgridList Meshgrid RepeatInterleave Rot90 Tril Triu
           Conj ConjPhysical Real ResolveConj ResolveNeg FftShift IfftShift
           Gather GetItem IndexAdd IndexCopy IndexPut IndexSelect MaskedScatter MaskedSelect Put ScatterAdd Take
           TakeAlongDim UnsafeMaskedIndexPutAccumulate Diff
           Sum Mean Cumsum Trace""",
        "ẏ = op(ẋ): the op is linear in its floating arguments", linear())
declare("Zero CopyInto PackPaddedSequence PadPackedSequence", "ẏ = op(ẋ): zeroing, copying and packing are linear",
        linear())
declare("FillDiagonal", "y = x with v on the diagonal  ->  ẏ = ẋ with 0 there", linear(fills=(1,)))
declare("PadSequence", "y = the sequences padded with a value  ->  ẏ = the tangents padded with 0", linear(fills=(2,)))
declare("Fill", "y = v everywhere  ->  ẏ = v̇ (0 for a number)", linear(fills=(1, "value")))
declare("MaskedFill", "y = x with v where mask  ->  ẏ = ẋ with v̇ where mask", linear(fills=(2, "value")))
declare("IndexFill", "y = x with v at index  ->  ẏ = ẋ with v̇ at index", linear(fills=(3, "value")))
declare("UnsafeMaskedIndex", "y = x[indices], fill where masked  ->  ẏ = ẋ[indices], 0 where masked",
        linear(fills=(3, "fill")))
declare("ConstantPadNd", "y = pad(x, value)  ->  ẏ = pad(ẋ, 0)", linear(fills=(2, "value")))
declare("Pad", "y = pad(x) (constant value, reflect, replicate, circular)  ->  ẏ = pad(ẋ) with value 0",
        linear(fills=(3, "value")))
declare("Trapezoid CumulativeTrapezoid Gradient", "ẏ = op(ẏ_samples) with the sample points fixed (linear in y)",
        linear((0,)))
declare("Kron", "ż = ȧ ⊗ b + a ⊗ ḃ", product((0, 1)))


@tangent("Scatter", "y = x with src (or a value) written at index  ->  ẏ = ẋ with ṡrc (0 for a value) there")
def _scatter(call: Call) -> torch.Tensor:
    if call.kwargs.get("reduce") is not None:
        raise NoTangent
    return linear(fills=(3, "value"))(call)


@tangent("ScatterReduce IndexReduce", "sum / mean reductions are linear: ẏ = op(ẋ, ṡrc); prod, amax, amin are not")
def _scatter_reduce(call: Call) -> torch.Tensor:
    if call.arg(4, "reduce") not in ("sum", "mean"):
        raise NoTangent
    return linear()(call)


@tangent("Nansum", "y = Σ x (NaNs skipped)  ->  ẏ = Σ ẋ where x is not NaN")
def _nansum(call: Call) -> torch.Tensor:
    call.only(0)
    x = call.args[0]
    return call.run(call.dot(0).masked_fill(x.isnan(), 0), *call.args[1:], **call.kwargs)


@tangent("Nanmean", "y = mean of the x that are not NaN  ->  ẏ = mean of ẋ at those places")
def _nanmean(call: Call) -> torch.Tensor:
    call.only(0)
    x = call.args[0]
    return call.run(call.dot(0).masked_fill(x.isnan(), float("nan")), *call.args[1:], **call.kwargs)


def _laid_out_like(x: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """ẋ stored in memory as x is (same strides and storage offset), zeros elsewhere in the storage."""
    size = x.untyped_storage().nbytes() // x.element_size()
    buffer = torch.zeros(size, dtype=dx.dtype, device=dx.device)
    buffer.as_strided(x.size(), x.stride(), x.storage_offset()).copy_(dx)
    return buffer


@tangent("AsStrided AsStridedCopy", "y = x's storage read with size/stride/offset  ->  ẏ = ẋ's, stored as x is")
def _as_strided(call: Call) -> torch.Tensor:
    call.only(0)
    x = call.args[0]
    size, stride = call.arg(1, "size"), call.arg(2, "stride")
    offset = call.arg(3, "storage_offset")
    start = x.storage_offset() if offset is None else offset
    return _laid_out_like(x, call.dot(0)).as_strided(size, stride, start).clone()


declare("SetItem", "y = x with y[index] = v  ->  ẏ = ẋ with ẏ[index] = v̇ (0 for a number)", linear(fills=(2,)))


@tangent("ViewOfBase", "v = the view's elements of base (by memory position)  ->  v̇ = the same elements of ḃase")
def _view_of_base(call: Call) -> torch.Tensor:
    call.only(0)
    return collect(call.ctx, call.dot(0))


@tangent("WriteIntoView", "base' = base with the view's elements replaced by r  ->  ḃase' = ḃase there replaced by ṙ")
def _write_into_view(call: Call) -> torch.Tensor:
    call.only(0, 1)
    base, written = call.args[:2]
    dbase = call.dot(0) if call.dot(0) is not None else torch.zeros_like(base)
    dwritten = call.dot(1) if call.dot(1) is not None else torch.zeros_like(written)
    return dbase.masked_fill(call.ctx.covered, 0) + spread(call.ctx, dwritten.expand(written.shape))
