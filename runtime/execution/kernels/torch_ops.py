"""The torch backend: importing this module registers a torch kernel for every op the numpy
backend has, family by family (`torch_elementwise`, `torch_math`, `torch_nn`, `torch_conv`,
`torch_tensor`, `torch_optim`, `torch_control`, `torch_text`), each written after its numpy twin and checked against it in
tests/execution/test_torch_kernels.py. Torch itself is optional: without it this import fails with an
`ImportError` naming the ``[torch]`` extra, and nothing outside these modules imports torch.

The scope holds torch tensors with this backend, on the executor's device: a kernel reads
tensors and stores tensors, so a step converts nothing between ops. Numpy appears only at the
edges (`torch_common`): a value fed, received from a pserver, initialized by a numpy-shared kernel
or restored from a checkpoint is numpy until the first kernel reading it converts it (once; the
tensor replaces it in the scope), and whatever leaves the kernels (a fetch, a send, a
checkpoint, the pserver's bookkeeping) goes through `Scope.get`, which converts to numpy. On the
CPU both are views of the same memory; on a GPU they are copies through pinned host memory, the
only transfers of a step. Integer and bool arrays (ids, labels, masks) stay numpy: the kernels
do their index bookkeeping on the host, as the numpy backend does. Backends still mix freely: a
numpy kernel reads numpy whatever the scope holds (`KernelContext.view`).

Kernels are device-agnostic: they create tensors through `torch_common.tensor`, which places them
on the device the executor bound the plan to (`torch_common.on_device`); the CPU is the default.
"""

from runtime.execution.kernels import (torch_control, torch_conv, torch_elementwise, torch_math,
                                       torch_nn, torch_optim, torch_tensor, torch_text)
from runtime.execution.kernels.torch_common import (DeviceError, on_device, resolve_device,
                                                    set_threads)

__all__ = ["DeviceError", "on_device", "resolve_device", "set_threads", "torch_control", "torch_conv",
           "torch_elementwise", "torch_math", "torch_nn", "torch_optim", "torch_tensor",
           "torch_text"]
