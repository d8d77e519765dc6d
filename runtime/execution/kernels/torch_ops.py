"""The torch backend: importing this module registers a torch kernel for every op the numpy
backend has, family by family (`torch_elementwise`, `torch_math`, `torch_nn`, `torch_conv`,
`torch_tensor`, `torch_optim`, `torch_control`), each written after its numpy twin and checked against it in
tests/test_torch_kernels.py. Torch itself is optional: without it this import fails with an
`ImportError` naming the ``[torch]`` extra, and nothing outside these modules imports torch.

Scope values are numpy, with either backend. A torch kernel views its inputs as tensors
(`torch.from_numpy`: shared memory on the CPU, one copy to a GPU), computes on the executor's
device, and stores its outputs back as numpy (`Tensor.numpy()`: the same memory on the CPU).
Why numpy at the boundary rather than tensors in the scope:

- On the CPU it costs nothing: both conversions are views (about half a microsecond each), no
  data is copied.
- Everything that reads a scope keeps working unchanged and needs no torch: `Scope.get` returns
  numpy arrays as promised, `Executor.run` fetches numpy, `LoDTensor` and `SelectedRows` hold
  numpy, and the wire sends a value's C-contiguous buffer as raw bytes whichever backend made it.
- Backends mix freely: a startup program run by numpy, a torch trainer talking to a numpy
  pserver, a checkpoint written by one and read by the other.

The cost is on a GPU: each op uploads its inputs and downloads its outputs. That is correct but
transfer-bound; keeping device tensors in the scope would need `Scope.get`, `LoDTensor`,
`SelectedRows` and the wire encoder to convert them on the way out.

Kernels are device-agnostic: they create tensors through `torch_common.tensor`, which places them
on the device the executor bound the plan to (`torch_common.on_device`); the CPU is the default.
"""

from runtime.execution.kernels import (torch_control, torch_conv, torch_elementwise, torch_math,
                                       torch_nn, torch_optim, torch_tensor)
from runtime.execution.kernels.torch_common import DeviceError, on_device, resolve_device

__all__ = ["DeviceError", "on_device", "resolve_device", "torch_control", "torch_conv",
           "torch_elementwise", "torch_math", "torch_nn", "torch_optim", "torch_tensor"]
