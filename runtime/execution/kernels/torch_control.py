"""Torch kernels of the initializer, counter and control ops.

`increment` and `sparse_delta` compute in torch like any op. The others have nothing to compute on a device, so
the torch backend registers the numpy backend's own kernels for them:

- the random initializers (`uniform_random`, `gaussian_random`, `truncated_gaussian_random`)
  must draw exactly the numpy backend's numbers (same generator, same seed rule), so that a
  scenario trains identically with either backend and a torch trainer agrees with a numpy
  pserver on every initial value;
- `fill_constant` and `assign_value` build their values from attributes alone, as the random
  ones do;
- `conditional_block` reads a host-side condition and runs a sub-block (whose ops are torch's);
- `sum_grad` only hands Out@GRAD on to every input, without computing;
- `split_byref` and `split_selected_rows` only cut a value into row blocks;
- the distributed lookup table's `split_ids`, `merge_ids`, `lookup_sparse_table`, `fake_init`
  and `save` only cut, gather, place or write rows.

They read numpy (`torch_common.on_host`: a tensor input is converted for them, not kept) and
store numpy, which the next torch kernel reading it converts.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.execution.kernels import numpy_control, numpy_dist, numpy_math, numpy_nn
from runtime.execution.kernels.common import batch_size_like_shape
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import Kernel
from runtime.execution.kernels.torch_common import (device, dtype_of, input_t, kernel, np_dtype,
                                                    on_host, put, to_host, torch_dtype)
from runtime.execution.tensor import SelectedRows

SHARED_WITH_NUMPY: dict[str, Kernel] = {
    "fill_constant": numpy_control.fill_constant,
    "assign_value": numpy_control.assign_value,
    "uniform_random": numpy_control.uniform_random,
    "gaussian_random": numpy_control.gaussian_random,
    "truncated_gaussian_random": numpy_control.truncated_gaussian_random,
    "conditional_block": numpy_control.conditional_block,
    "sum_grad": numpy_math.sum_grad,
    "split_byref": numpy_dist.split_byref,
    "split_selected_rows": numpy_dist.split_selected_rows,
    "ref_by_trainer_id": numpy_dist.ref_by_trainer_id,
    "split_ids": numpy_dist.split_ids,
    "merge_ids": numpy_dist.merge_ids,
    "lookup_sparse_table": numpy_nn.lookup_table,
    "lookup_sparse_table_read": numpy_nn.lookup_table,
    "fake_init": numpy_dist.fake_init,
    "save": numpy_dist.save,
}

for _op_type, _kernel in SHARED_WITH_NUMPY.items():
    kernel(_op_type)(on_host(_kernel))


@kernel("sparse_delta")
def sparse_delta(ctx: KernelContext) -> None:
    """Geo's delta of a sparse table: ``(X - Y) * scale`` in the rows where X and Y differ
    (as `numpy_dist.sparse_delta`)."""
    x, y = input_t(ctx, "X"), input_t(ctx, "Y")
    if x.shape != y.shape:
        raise ValueError(f"X {list(x.shape)} and Y {list(y.shape)} differ in shape")
    diff = x - y
    rows = torch.nonzero((diff != 0).reshape(diff.shape[0], -1).any(dim=1)).reshape(-1)
    values = diff[rows] * float(ctx.attr("scale", 1.0))
    ctx.set_output("Out", SelectedRows(to_host(rows), to_host(values), int(x.shape[0])))


@kernel("fill_constant_batch_size_like")
def fill_constant_batch_size_like(ctx: KernelContext) -> None:
    """As `numpy_control.fill_constant_batch_size_like`, made on the device; only Input's
    shape and LoD are read."""
    shape = batch_size_like_shape(ctx, tuple(ctx.input("Input").shape), ctx.lod("Input"))
    dtype = np_dtype(ctx.attr("dtype", "float32"))
    put(ctx, "Out", torch.full(shape, dtype.type(ctx.attr("value", 0.0)).item(),
                               dtype=torch_dtype(dtype), device=device()))


@kernel("increment")
def increment(ctx: KernelContext) -> None:
    """X + step, the step cast to X's dtype first (an int64 counter stays int64)."""
    x = ctx.input("X")
    step = np.asarray(ctx.attr("step", 1.0)).astype(dtype_of(x)).item()
    put(ctx, "Out", input_t(ctx, "X") + step)
