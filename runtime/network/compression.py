"""Gradient compression: codecs that pack a dense gradient into fewer wire bytes, and the
error feedback that keeps what they drop for later steps.

A codec turns a dense float tensor into a `Packed` value, whose frames are what the wire sends
(`runtime.network.wire` writes the codec and, for top-k, the count into the var's header entry,
and the receiver unpacks it back into a dense tensor of the original shape and dtype):

| codec | frames | bytes for n elements of b bytes |
|---|---|---|
| `fp16` | the values as float16, clipped to float16's finite range | 2n |
| `int8` | the scale s = max abs / 127 (one value of the tensor's dtype), then q = round(x / s) as int8 | b + n |
| `topk` | the k = ceil(ratio n) flat indices of the largest abs values, ascending (int32; int64 past 2^31 - 1 elements), then their values | k (4 + b) |

Error feedback (`ErrorFeedback`): a trainer keeps a residual per sent var. Each step
``residual += grad``, the residual is packed and sent, and ``residual -= unpack(sent)``: what a
codec drops this step travels in a later one, so over the steps the pserver receives every
gradient's sum less only the current residual (up to float rounding).

DESIGN: compression is an encoding at the wire's edge, not ops in the programs. The trainer
packs a gradient block as its `send` op hands it to the wire, and the pserver's decoder unpacks
it, so (1) the bytes the simulated network charges are the packed frames the message really
carries, (2) the pserver's programs, policies and optimizer see the dense gradient they
declared, in every mode, with no decompress op to place before each mode's fan-in, and (3)
timing mode packs a `Phantom` into a phantom `Packed` that weighs exactly what its numeric twin
does. What the transpiler decides is which sends compress, and how: the ``compress`` and
``compress_ratio`` attributes of a dense gradient's `send` op (docs/transpiler.md §6). The
price is that packing runs on the host as numpy when the send leaves, and the simulator charges
it only as the per-byte cost of the (smaller) message.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.execution.tensor import Phantom

__all__ = ["Codec", "ErrorFeedback", "FLOAT_DTYPES", "Packed", "index_dtype", "pack",
           "packed_nbytes", "topk_count", "unpack"]

FP16_MAX = float(np.finfo(np.float16).max)
INT8_LEVELS = 127
INT32_INDEX_LIMIT = (1 << 31) - 1
FLOAT_DTYPES = frozenset({np.dtype("float32"), np.dtype("float64")})
"""The dtypes a codec packs; other tensors are sent as they are."""


class Codec(enum.StrEnum):
    """How a dense tensor is packed (the ``codec`` field of its wire entry)."""

    FP16 = "fp16"
    INT8 = "int8"
    TOPK = "topk"


@dataclass(frozen=True)
class Packed:
    """A dense tensor of `shape` and `dtype` as `codec` packs it: its wire `frames` (none for a
    phantom), and for top-k the count `nnz` of values kept."""

    codec: Codec
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    frames: tuple[np.ndarray, ...] = ()
    nnz: int | None = None
    phantom: bool = False

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes its frames carry (or would, for a phantom)."""
        return packed_nbytes(self.codec, self.size, self.dtype, self.nnz)

    def dense_phantom(self) -> Phantom:
        """The phantom of the tensor it stands for."""
        return Phantom(self.shape, self.dtype)


def topk_count(size: int, ratio: float) -> int:
    """How many values top-k keeps of `size`: ceil(ratio size), at least 1 (none of 0)."""
    return min(size, max(1, math.ceil(ratio * size)))


def index_dtype(size: int) -> np.dtype[Any]:
    """The dtype of top-k's flat indices into a tensor of `size` elements."""
    return np.dtype("int32" if size <= INT32_INDEX_LIMIT else "int64")


def packed_nbytes(codec: Codec, size: int, dtype: np.dtype[Any], nnz: int | None) -> int:
    """Bytes of the frames `codec` writes for `size` elements of `dtype` (`nnz` kept, top-k)."""
    if codec is Codec.FP16:
        return 2 * size
    if codec is Codec.INT8:
        return dtype.itemsize + size
    return (nnz or 0) * (index_dtype(size).itemsize + dtype.itemsize)


def frame_count(codec: Codec) -> int:
    return 1 if codec is Codec.FP16 else 2


def pack(codec: Codec, value: np.ndarray | Phantom, ratio: float = 1.0) -> Packed:
    """`value` packed by `codec` (`ratio`: the share of values top-k keeps). The frames are
    new arrays: `value` may change once this returns."""
    shape, dtype = tuple(value.shape), np.dtype(value.dtype)
    nnz = topk_count(math.prod(shape), ratio) if codec is Codec.TOPK else None
    if isinstance(value, Phantom):
        return Packed(codec, shape, dtype, (), nnz, phantom=True)
    flat = np.ascontiguousarray(value).reshape(-1)
    if codec is Codec.FP16:
        frames: tuple[np.ndarray, ...] = (np.clip(flat, -FP16_MAX, FP16_MAX).astype("<f2"),)
    elif codec is Codec.INT8:
        frames = _int8(flat)
    else:
        assert nnz is not None
        frames = _topk(flat, nnz)
    return Packed(codec, shape, dtype, frames, nnz)


def _int8(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The scale (max abs / 127) and the values in its units, rounded to int8."""
    peak = float(np.max(np.abs(flat))) if flat.size else 0.0
    scale = np.array([peak / INT8_LEVELS], flat.dtype)
    if scale[0] == 0 or not np.isfinite(scale[0]):
        return scale, np.zeros(flat.size, np.int8)
    q = np.clip(np.rint(flat / scale[0]), -INT8_LEVELS, INT8_LEVELS).astype(np.int8)
    return scale, q


def _topk(flat: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The flat indices (ascending) of the k largest abs values, and those values."""
    if k >= flat.size:
        chosen = np.arange(flat.size)
    else:
        chosen = np.sort(np.argpartition(np.abs(flat), flat.size - k)[flat.size - k:])
    return chosen.astype(index_dtype(flat.size)), flat[chosen]


def unpack(packed: Packed) -> np.ndarray:
    """The dense tensor `packed` stands for (a new, writable array)."""
    if packed.phantom:
        raise ValueError(f"unpack: a phantom {packed.codec} value has no data")
    dtype = packed.dtype
    if packed.codec is Codec.FP16:
        dense = packed.frames[0].astype(dtype)
    elif packed.codec is Codec.INT8:
        scale, q = packed.frames
        dense = q.astype(dtype) * scale[0]
    else:
        indices, values = packed.frames
        dense = np.zeros(packed.size, dtype)
        dense[indices] = values
    return dense.reshape(packed.shape)


def compressible(value: Any) -> bool:
    """Whether a codec packs `value`: a plain numpy array or dense phantom of a float dtype."""
    if isinstance(value, Phantom):
        return value.height is None and not value.lod and value.dtype in FLOAT_DTYPES
    return type(value) is np.ndarray and value.dtype in FLOAT_DTYPES


class ErrorFeedback:
    """One trainer's residuals, by the name each gradient block is sent under.

    `compress` adds the gradient into its residual, packs the residual and subtracts what the
    packed value stands for: the residual keeps exactly what was not sent. A value no codec
    packs (sparse rows, an int counter) is returned as it is. Phantoms are packed with no
    residual (there are no values to keep)."""

    def __init__(self) -> None:
        self.residuals: dict[str, np.ndarray] = {}

    def compress(self, name: str, value: Any, codec: Codec, ratio: float) -> Any:
        if not compressible(value):
            return value
        if isinstance(value, Phantom):
            return pack(codec, value, ratio)
        residual = self.residuals.get(name)
        if residual is None or residual.shape != value.shape or residual.dtype != value.dtype:
            residual = np.array(value, copy=True, order="C")
            self.residuals[name] = residual
        else:
            residual += value
        packed = pack(codec, residual, ratio)
        if packed.codec is Codec.TOPK:
            residual.reshape(-1)[packed.frames[0]] = 0  # exactly what was sent, taken out
        else:
            residual -= unpack(packed)
        return packed
