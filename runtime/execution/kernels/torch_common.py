"""What every torch kernel module shares: the optional torch import, the device a kernel runs
on, and the conversions between the scope's numpy values and torch tensors.

Importing this module without torch installed raises an `ImportError` naming the ``[torch]``
extra. The device is a context variable: CPU unless a kernel was bound to another device with
`on_device(device)`, which the executor does when it builds a plan, so every op of a plan (and
of the sub-blocks it runs) computes on the executor's device.

`tensor` shares memory with a CPU array (copying only arrays torch cannot view) and `array` gives
a CPU tensor's memory back as numpy. Dtypes follow numpy, not torch: kernels convert operands in
the dtype numpy would compute in (`result_dtype`), promote integers to float64 where numpy does
(`as_float`), and store outputs in the numpy kernel's dtype (`put(..., dtype=)`).
"""

from __future__ import annotations

import functools
import warnings
from contextvars import ContextVar
from typing import Callable

import numpy as np

try:
    import torch
except ModuleNotFoundError as exc:  # pragma: no cover - exercised with torch hidden
    if exc.name != "torch":
        raise
    raise ImportError("kernel backend torch needs PyTorch, which is not installed: "
                      "pip install 'pslab[torch]'") from exc

from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.errors import ExecutionError
from runtime.execution.kernels.registry import Kernel, register
from runtime.execution.tensor import LoD, SelectedRows

Tensor = torch.Tensor
BACKEND = "torch"

_device: ContextVar[torch.device | None] = ContextVar("pslab_torch_device", default=None)
"""The device kernels compute on; None is the CPU (no copies at all)."""


class DeviceError(ExecutionError):
    """A torch device that cannot be used (no GPU, unknown name, index out of range)."""


def kernel(op_type: str) -> Callable[[Kernel], Kernel]:
    """Decorator: register the function as the torch kernel of `op_type`."""
    return register(op_type, BACKEND)


# -- devices ------------------------------------------------------------------------------------
def resolve_device(device: str) -> torch.device:
    """`device` ("cpu", "cuda", "cuda:N") as a torch device that this process can use."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise DeviceError(f"backend torch: unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise DeviceError(f"backend torch: device {device!r} is not supported; use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise DeviceError(
            f"backend torch device {device} requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, {build}): run on a machine with an NVIDIA GPU and driver "
            f"and a CUDA build of torch (https://pytorch.org/get-started/locally/), or use device cpu")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise DeviceError(f"backend torch: device {device} requested but only {count} CUDA device(s) exist")
    return dev


def on_device(device: str) -> Callable[[Kernel], Kernel]:
    """A function that binds a torch kernel to `device` (checked now, so a missing GPU fails
    before anything runs). The CPU needs no binding: it is every kernel's default."""
    dev = resolve_device(device)
    if dev.type == "cpu":
        return lambda k: k

    def bind(k: Kernel) -> Kernel:
        @functools.wraps(k)
        def run(ctx: KernelContext) -> None:
            token = _device.set(dev)
            try:
                k(ctx)
            finally:
                _device.reset(token)
        return run
    return bind


# -- numpy <-> torch ----------------------------------------------------------------------------
def _view(a: np.ndarray) -> Tensor:
    """A CPU tensor over `a`'s memory; arrays torch cannot view (negative strides, foreign byte
    order) are copied. Kernels never write into an input, so read-only arrays are viewed too."""
    try:
        if a.flags.writeable:
            return torch.from_numpy(a)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(a)
    except ValueError:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("=")))


def _as_array(value: object) -> np.ndarray:
    if value is None or isinstance(value, SelectedRows):
        raise TypeError(f"expected a dense array, got {value!r}")
    return np.asarray(value)


def tensor(value: np.ndarray, dtype: np.dtype | None = None) -> Tensor:
    """`value` (cast to numpy `dtype` when given) as a tensor on the kernel's device."""
    a = value if type(value) is np.ndarray else _as_array(value)
    if dtype is not None and a.dtype != dtype:
        a = a.astype(dtype)
    t = _view(a)
    dev = _device.get()
    return t if dev is None else t.to(dev)


def array(t: Tensor) -> np.ndarray:
    """The tensor as a numpy array: the CPU tensor's own memory, or a copy from the device."""
    return t.numpy() if _device.get() is None else t.cpu().numpy()


def device() -> torch.device:
    """The device kernels compute on now."""
    dev = _device.get()
    return torch.device("cpu") if dev is None else dev


@functools.cache
def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype."""
    return torch.from_numpy(np.empty(0, dtype)).dtype


def result_dtype(*dtypes: np.dtype) -> np.dtype:
    """numpy's promotion of array dtypes (what a numpy kernel computes in)."""
    return _result_type(tuple(np.dtype(d) for d in dtypes))


@functools.cache
def _result_type(dtypes: tuple[np.dtype, ...]) -> np.dtype:
    return np.result_type(*dtypes)


def as_float(t: Tensor) -> Tensor:
    """Integer and bool tensors as float64, as numpy promotes them for float math (torch would
    pick float32)."""
    return t if t.is_floating_point() else t.to(torch.float64)


# -- inputs and outputs -------------------------------------------------------------------------
def input_t(ctx: KernelContext, slot: str, dtype: np.dtype | None = None) -> Tensor:
    """The slot's dense value as a tensor on the device."""
    return tensor(ctx.input(slot), dtype)


def out_grad_t(ctx: KernelContext, like: str = "Out", slot: str = "Out@GRAD") -> Tensor:
    """The gradient flowing into an output; a missing one means zeros like input `like`."""
    g = ctx.input(slot)
    return torch.zeros_like(input_t(ctx, like)) if g is None else tensor(g)


def optional_t(ctx: KernelContext, slot: str) -> Tensor | None:
    """The slot's dense value as a tensor, None if the op has no var in the slot."""
    value = ctx.input(slot)
    return None if value is None else tensor(value)


def zeros(shape: tuple[int, ...], dtype: np.dtype) -> Tensor:
    return torch.zeros(shape, dtype=torch_dtype(np.dtype(dtype)), device=device())


def densify(rows: SelectedRows) -> Tensor:
    """A SelectedRows scattered into zeros on the device (repeated rows add up)."""
    values = tensor(rows.values)
    return zeros(rows.shape, rows.dtype).index_add_(0, tensor(rows.rows), values)


def put(ctx: KernelContext, slot: str, t: Tensor, index: int = 0, lod: LoD | None = None,
        dtype: np.dtype | None = None) -> None:
    """Store the tensor, cast to numpy `dtype` when given, as the slot's `index`-th output: a
    numpy array (a LoDTensor with `lod` when that is non-empty)."""
    if dtype is not None and t.dtype != torch_dtype(dtype):
        t = t.to(torch_dtype(dtype))
    ctx.set_output(slot, array(t), index=index, lod=lod)


__all__ = ["BACKEND", "DeviceError", "Tensor", "array", "as_float", "densify", "device", "input_t",
           "kernel", "on_device", "optional_t", "out_grad_t", "put", "resolve_device",
           "result_dtype", "tensor", "torch", "torch_dtype", "zeros"]
