"""What every torch kernel module shares: the optional torch import, the device a kernel runs
on, and the conversions between numpy values and torch tensors.

Importing this module without torch installed raises an `ImportError` naming the ``[torch]``
extra. The device is a context variable: CPU unless a kernel was bound to another device with
`on_device(device)`, which the executor does when it builds a plan, so every op of a plan (and
of the sub-blocks it runs) computes on the executor's device.

The scope holds torch tensors: a bound kernel's context views every stored value through
`native_value` (float numpy arrays become tensors on the device, once: the tensor replaces the
array in the scope) and kernels store tensors (`put`). Numpy appears only at the edges: what is
fed, received or initialized arrives as numpy and is converted by the first kernel reading it
(`from_host`), and what is fetched, sent or saved leaves through `Scope.get`, which converts
with `to_host` (registered with `tensor.register_native`). On the CPU both are views of the same
memory; on a GPU they copy through pinned host memory. Integer and bool arrays (ids, labels,
masks) stay numpy in the scope: they are host-side bookkeeping, uploaded by the kernel that
computes on them.

Dtypes follow numpy, not torch: kernels convert operands in the dtype numpy would compute in
(`result_dtype`), promote integers to float64 where numpy does (`as_float`), and store outputs in
the numpy kernel's dtype (`put(..., dtype=)`); every helper takes a numpy or a torch dtype.
"""

from __future__ import annotations

import functools
import os
import warnings
from contextvars import ContextVar
from typing import Any, Callable

import numpy as np

try:
    import torch
except ModuleNotFoundError as exc:  # pragma: no cover - exercised with torch hidden
    if exc.name != "torch":
        raise
    raise ImportError("kernel backend torch needs PyTorch, which is not installed: "
                      "pip install 'pslab[torch]'") from exc

from runtime.execution.kernels.common import scalar
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.errors import ExecutionError
from runtime.execution.kernels.registry import Kernel, register
from runtime.execution.tensor import (LoD, LoDTensor, SelectedRows, host_value, is_native,
                                      register_native)

Tensor = torch.Tensor
BACKEND = "torch"
LOCAL_RANK_VAR = "LOCAL_RANK"
"""Where a launcher that runs several nodes a host says which one this is (for cuda:local)."""
DTypeLike = Any
"""A numpy dtype (or anything np.dtype takes) or a torch dtype."""

_device: ContextVar[torch.device | None] = ContextVar("pslab_torch_device", default=None)
"""The device kernels compute on; None is the CPU (no copies at all)."""


class DeviceError(ExecutionError):
    """A torch device that cannot be used (no GPU, unknown name, index out of range)."""


def kernel(op_type: str) -> Callable[[Kernel], Kernel]:
    """Decorator: register the function as the torch kernel of `op_type`."""
    return register(op_type, BACKEND)


# -- devices ------------------------------------------------------------------------------------
DEVICE_HELP = "use cpu, cuda, cuda:N or cuda:local"


def _no_cuda(device: str) -> DeviceError:
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return DeviceError(
        f"backend torch device {device} requested but torch.cuda.is_available() is False "
        f"(torch {torch.__version__}, {build}): run on a machine with an NVIDIA GPU and driver "
        f"and a CUDA build of torch (https://pytorch.org/get-started/locally/), or use device "
        f"cpu (a scenario's backend.device or backend.pserver_device)")


def local_rank(default: int) -> int:
    """This node's index among the nodes of its host: ``LOCAL_RANK`` where set, else `default`."""
    text = os.environ.get(LOCAL_RANK_VAR)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise DeviceError(f"{LOCAL_RANK_VAR}={text!r} is not an integer") from None


def resolve_device(device: str, local_index: int = 0) -> torch.device:
    """`device` ("cpu", "cuda", "cuda:N", "cuda:local") as a torch device this process can use;
    cuda:local is GPU ``local_rank(local_index) % visible GPUs``."""
    if device == "cuda:local":
        if not torch.cuda.is_available():
            raise _no_cuda(device)
        return torch.device("cuda", local_rank(local_index) % torch.cuda.device_count())
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise DeviceError(f"backend torch: unknown device {device!r}; {DEVICE_HELP}") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise DeviceError(f"backend torch: device {device!r} is not supported; {DEVICE_HELP}")
    if not torch.cuda.is_available():
        raise _no_cuda(device)
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise DeviceError(f"backend torch: device {device} requested but only {count} CUDA "
                          f"device(s) are visible; use cuda:0..cuda:{count - 1} or cuda:local")
    return dev


def on_device(device: str, local_index: int = 0) -> Callable[[Kernel], Kernel]:
    """A function that binds a torch kernel to `device` (checked now, so a missing GPU fails
    before anything runs): the kernel's context views scope values as tensors on the device
    and keeps them there (`native_value`)."""
    dev = resolve_device(device, local_index)
    target = None if dev.type == "cpu" else dev
    view = _cpu_view if target is None else functools.partial(native_value, device=target)
    as_is = Tensor if target is None else _Never  # a CPU tensor on a GPU is moved

    def bind(k: Kernel) -> Kernel:
        @functools.wraps(k)
        def run(ctx: KernelContext) -> None:
            ctx.view, ctx.keep_view, ctx.as_is = view, True, as_is
            if target is None:
                k(ctx)
                return
            token = _device.set(target)
            try:
                k(ctx)
            finally:
                _device.reset(token)
        return run
    return bind


def on_host(k: Kernel) -> Kernel:
    """A numpy kernel run by the torch backend: its context reads numpy (converting tensors,
    not keeping the conversion), and its numpy outputs are converted by whoever reads them."""
    @functools.wraps(k)
    def run(ctx: KernelContext) -> None:
        ctx.view, ctx.keep_view, ctx.as_is = host_value, False, np.ndarray
        k(ctx)
    return run


class _Never:
    """A type no stored value has: a view's `KernelContext.as_is` where it may change any
    value."""


def set_threads(threads: int) -> None:
    """Cap torch's intra-op threads (a node's share of the host's cores)."""
    if threads < 1:
        raise ValueError(f"backend torch: threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)


# -- numpy <-> torch: the edges -----------------------------------------------------------------
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


def from_host(a: np.ndarray, device: torch.device | None = None) -> Tensor:
    """A numpy array as a tensor on `device` (None: the CPU, a view of the same memory); to a GPU
    through a pinned staging buffer, copied asynchronously."""
    t = _view(a)
    if device is None or device.type == "cpu":
        return t
    staged = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    staged.copy_(t)
    return staged.to(device, non_blocking=True)


def to_host(t: Tensor) -> np.ndarray:
    """A tensor as a numpy array: a CPU tensor's own memory, a GPU tensor copied into pinned host
    memory (a fresh buffer each time: the array is handed out, and values are immutable)."""
    t = t.detach()
    if t.device.type == "cpu":
        return t.resolve_conj().resolve_neg().numpy()
    staged = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    staged.copy_(t)
    return staged.numpy()


def _to_host(t: Tensor) -> np.ndarray:
    return to_host(t)  # looked up on each call, so that tests can count conversions


register_native(torch.Tensor, _to_host)
register_native(torch.nn.Parameter, _to_host)


def _native_array(a: Any, device: torch.device | None) -> Any:
    if type(a) is np.ndarray:
        return from_host(a, device) if a.dtype.kind in "fc" else a
    if isinstance(a, Tensor) and device is not None and a.device != device:
        return a.to(device)
    return a


def native_value(value: Any, device: torch.device | None = None) -> Any:
    """How torch kernels see a stored value: float arrays (also a LoDTensor's data and a
    SelectedRows' values) as tensors on `device`; integer and bool arrays, phantoms and tensors
    already there as they are (the very object, so that nothing is stored back)."""
    kind = type(value)
    if kind is np.ndarray or kind is Tensor:
        return _native_array(value, device)
    if kind is LoDTensor:
        data = _native_array(value.data, device)
        return value if data is value.data else LoDTensor(data, value.lod)
    if kind is SelectedRows:
        values = _native_array(value.values, device)
        return value if values is value.values else SelectedRows(value.rows, values, value.height)
    return _native_array(value, device)


def _cpu_view(value: Any) -> Any:
    """`native_value` on the CPU, a tensor (what kernels read nearly always) returned at once."""
    return value if type(value) is Tensor else native_value(value)


def _as_array(value: object) -> np.ndarray:
    if value is None or isinstance(value, SelectedRows):
        raise TypeError(f"expected a dense array, got {value!r}")
    return np.asarray(value)


def tensor(value: Any, dtype: DTypeLike | None = None) -> Tensor:
    """`value` (a tensor or an array; cast to `dtype` when given) as a tensor on the kernel's
    device."""
    dev = _device.get()
    if isinstance(value, Tensor):
        t = value if dev is None or value.device == dev else value.to(dev)
        if dtype is None:
            return t
        target = torch_dtype(dtype)
        return t if t.dtype is target else t.to(target)
    a = value if type(value) is np.ndarray else _as_array(value)
    if dtype is not None and a.dtype != np_dtype(dtype):
        a = a.astype(np_dtype(dtype))
    return from_host(a, dev)


def host(value: Any) -> np.ndarray:
    """A dense value (tensor or array) as numpy, for host-side bookkeeping (ids, labels)."""
    return to_host(value) if isinstance(value, Tensor) else np.asarray(value)


def host_scalar(value: Any) -> Any:
    """The single element of a [1]-shaped tensor or array as a numpy scalar of its dtype (what
    `common.scalar` gives a numpy kernel), read without converting the whole value."""
    if not isinstance(value, Tensor):
        return scalar(value)
    if value.numel() != 1:
        raise ValueError(f"expected a single element, got shape {list(value.shape)}")
    return np_dtype(value.dtype).type(value.item())


def device() -> torch.device:
    """The device kernels compute on now."""
    dev = _device.get()
    return torch.device("cpu") if dev is None else dev


@functools.cache
def _numpy_of(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def np_dtype(dtype: DTypeLike) -> np.dtype:
    """The numpy dtype of a numpy or torch dtype."""
    return _numpy_of(dtype) if isinstance(dtype, torch.dtype) else np.dtype(dtype)


def dtype_of(value: Any) -> np.dtype:
    """The numpy dtype of a tensor's or an array's elements."""
    return np_dtype(value.dtype)


@functools.cache
def _torch_of(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def torch_dtype(dtype: DTypeLike) -> torch.dtype:
    """The torch dtype of a numpy or torch dtype (one look-up for those seen before: kernels
    ask on nearly every call)."""
    known = _TORCH_DTYPES.get(dtype)
    if known is not None:
        return known
    found = dtype if isinstance(dtype, torch.dtype) else _torch_of(np.dtype(dtype))
    if isinstance(dtype, (np.dtype, torch.dtype)):
        _TORCH_DTYPES[dtype] = found
    return found


_TORCH_DTYPES: dict[Any, torch.dtype] = {}
"""numpy and torch dtypes -> torch dtype, as `torch_dtype` met them."""


def result_dtype(*dtypes: DTypeLike) -> np.dtype:
    """numpy's promotion of array dtypes (what a numpy kernel computes in)."""
    return _result_type(dtypes)


@functools.cache
def _result_type(dtypes: tuple[DTypeLike, ...]) -> np.dtype:
    """Cached on the dtypes as given (numpy's or torch's): kernels ask it on every call."""
    return np.result_type(*(np_dtype(d) for d in dtypes))


def reshaped(t: Tensor, shape: tuple[int, ...] | torch.Size) -> Tensor:
    """`t` with `shape`: itself when it has it already (a reshape costs a microsecond or two
    even then, and makes a view)."""
    return t if t.shape == shape else t.reshape(shape)


def as_float(t: Tensor) -> Tensor:
    """Integer and bool tensors as float64, as numpy promotes them for float math (torch would
    pick float32)."""
    return t if t.is_floating_point() else t.to(torch.float64)


# -- inputs and outputs -------------------------------------------------------------------------
def input_t(ctx: KernelContext, slot: str, dtype: DTypeLike | None = None) -> Tensor:
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


def zeros(shape: tuple[int, ...], dtype: DTypeLike) -> Tensor:
    return torch.zeros(shape, dtype=torch_dtype(dtype), device=device())


def densify(rows: SelectedRows) -> Tensor:
    """A SelectedRows scattered into zeros on the device (repeated rows add up)."""
    values = tensor(rows.values)
    return zeros(rows.shape, values.dtype).index_add_(0, tensor(rows.rows), values)


def put(ctx: KernelContext, slot: str, t: Tensor, index: int = 0, lod: LoD | None = None,
        dtype: DTypeLike | None = None) -> None:
    """Store the tensor, cast to `dtype` when given, as the slot's `index`-th output (a
    LoDTensor with `lod` when that is non-empty)."""
    if dtype is not None and t.dtype != torch_dtype(dtype):
        t = t.to(torch_dtype(dtype))
    ctx.set_output(slot, t, index=index, lod=lod)


__all__ = ["BACKEND", "DeviceError", "LOCAL_RANK_VAR", "Tensor", "as_float", "densify", "device",
           "dtype_of", "from_host", "host", "host_scalar", "input_t", "is_native", "kernel",
           "local_rank", "native_value", "np_dtype", "on_device", "on_host", "optional_t",
           "out_grad_t", "put", "reshaped", "resolve_device", "result_dtype", "set_threads", "tensor",
           "to_host", "torch", "torch_dtype", "zeros"]
