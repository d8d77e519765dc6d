"""What a message is on the wire: the version and limits, the kinds of message and of var, the
`Message` and `VarSpec` that stand for a message and for one entry of its header's `vars`, and
the table of the header's fields.

A message is frame 0, a msgpack header

    {v, kind, id, src, step, vars: [{name, dtype, shape, kind, height?}, ...], ...extra}

followed by the tensors' raw bytes in `vars` order (`_FRAME_COUNTS`: one frame per dense var,
two per rows var, none per phantom). The field table (`HEADER_FIELDS`, `ENTRY_FIELDS`,
`VAR_FIELDS`, and the names `KINDS`, `VAR_KINDS`, `CODECS` and `DTYPES` a field may take) is
the one statement of which fields and values a header may hold: encode writes them, the strict
decode path checks against them, and the fast one reads what it accepts off them, so the two
cannot drift apart. Nothing here builds or parses frames.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from runtime.execution.tensor import LoDTensor, Phantom, SelectedRows
from runtime.network.compression import Codec, Packed, frame_count, packed_nbytes
from runtime.network.transport import Frame

WIRE_VERSION = 1
DEFAULT_MAX_MESSAGE_SIZE = 1 << 30
DEFAULT_MAX_HEADER_SIZE = 64 << 10
"""Largest header frame `decode` reads (bytes), checked before msgpack parses it: a header
holds names and shapes, never data, so a bigger one is refused rather than parsed."""
MAX_FRAMES = 1 << 16
"""Most frames a message may have (a header and two per var at most)."""
MAX_ECHO = 200
"""Characters of a received value an error's text quotes (the rest is cut, saying so)."""
MAX_DETAIL = 1024
"""Characters of an error's detail an error reply (and a log line) carries."""
MAX_VAR = 256
"""Characters of a culprit var's name (or a peer's) an error carries."""
MAX_NDIM = 32
MAX_DIM = 1 << 62
"""Largest dimension a shape may have; the product of a shape's nonzero dimensions times its
item size may not exceed it either (so an empty tensor cannot claim an unshapeable span)."""
ID_RANGE = (0, (1 << 64) - 1)
STEP_RANGE = (-(1 << 63), (1 << 63) - 1)
WIRE_DTYPE_NAMES = (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"
)
DTYPES: Mapping[str, np.dtype[Any]] = {
    name: np.dtype(name).newbyteorder("<") for name in WIRE_DTYPE_NAMES
}
ROWS_DTYPE = DTYPES["int64"]
_DTYPE_NAMES: Mapping[np.dtype[Any], str] = {dtype: name for name, dtype in DTYPES.items()}

Tensor = np.ndarray | LoDTensor | SelectedRows | Phantom | Packed


class Kind(enum.StrEnum):
    """What a message asks or answers in the PS protocol. Two kinds want no reply: `BYE`, a
    trainer's word to a pserver that it has its reply to COMPLETE and will send nothing more,
    and `COLLECTIVE`, a trainer's piece of a collective op to its ring neighbour
    (`runtime.services.collective`)."""

    SEND = "send"
    GET = "get"
    SEND_BARRIER = "send_barrier"
    FETCH_BARRIER = "fetch_barrier"
    PREFETCH = "prefetch"
    CHECKPOINT_NOTIFY = "checkpoint_notify"
    COMPLETE = "complete"
    BYE = "bye"
    HEARTBEAT = "heartbeat"
    JOIN = "join"
    REPLY = "reply"
    ERROR = "error"
    COLLECTIVE = "collective"


class VarKind(enum.StrEnum):
    """How a var's data travels: one frame, rows + values frames, or no data at all."""

    DENSE = "dense"
    ROWS = "rows"
    PHANTOM = "phantom"


class Reason(enum.StrEnum):
    """Why a message could not be encoded or decoded; sent back in error replies."""

    BAD_HEADER = "bad_header"
    UNKNOWN_VERSION = "unknown_version"
    UNKNOWN_KIND = "unknown_kind"
    MISSING_FIELD = "missing_field"
    BAD_FIELD = "bad_field"
    RESERVED_FIELD = "reserved_field"
    FRAME_COUNT = "frame_count"
    BAD_DTYPE = "bad_dtype"
    BAD_SHAPE = "bad_shape"
    BAD_VALUE = "bad_value"
    SIZE_MISMATCH = "size_mismatch"
    ROWS_OUT_OF_RANGE = "rows_out_of_range"
    TOO_LARGE = "too_large"
    DUPLICATE_VAR = "duplicate_var"
    UNSUPPORTED_TENSOR = "unsupported_tensor"


# ------------------------------------------------------------------------------ the field table

HEADER_FIELDS = frozenset({"v", "kind", "id", "src", "step", "vars"})
"""The header's own fields, each one required; any further field is the message's `extra`."""
KINDS: Mapping[str, Kind] = {kind.value: kind for kind in Kind}
"""The message kinds, by the name a header's ``kind`` field gives."""
VAR_KINDS: Mapping[str, VarKind] = {kind.value: kind for kind in VarKind}
"""The var kinds, by the name a `vars` entry's ``kind`` field gives."""
CODECS: Mapping[str, Codec] = {codec.value: codec for codec in Codec}
"""The codecs, by the name a packed var's ``codec`` field gives."""
ENTRY_FIELDS = frozenset({"name", "dtype", "shape", "kind"})
"""The fields every `vars` entry has, whatever its kind."""
CODEC_FIELDS = frozenset({"codec", "nnz"})
"""A packed var's fields: how its data is packed and, for top-k, how many values it keeps."""


class VarFields(NamedTuple):
    """The fields a `vars` entry of one kind must have, and all those it may have."""

    required: frozenset[str]
    allowed: frozenset[str]


VAR_FIELDS: Mapping[VarKind, VarFields] = {
    VarKind.DENSE: VarFields(ENTRY_FIELDS, ENTRY_FIELDS | {"lod"} | CODEC_FIELDS),
    VarKind.ROWS: VarFields(ENTRY_FIELDS | {"height"}, ENTRY_FIELDS | {"height"}),
    VarKind.PHANTOM: VarFields(ENTRY_FIELDS, ENTRY_FIELDS | {"height", "lod"} | CODEC_FIELDS),
}
"""Each var kind's fields: a rows var states its height; a dense one may carry a LoD or a
codec; a phantom may carry what its twin of either kind would."""
_FRAME_COUNTS = {VarKind.DENSE: 1, VarKind.ROWS: 2, VarKind.PHANTOM: 0}
"""The data frames that follow the header for a var of each kind (a packed one: its codec's)."""
_PHANTOM = str(VarKind.PHANTOM)
_DENSE = str(VarKind.DENSE)


# ------------------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Message:
    """One PS message: who sent it (`src`), which request it is or answers (`id`), its tensors.

    DESIGN: slotted, as a simulation holds hundreds of thousands of messages at once (the
    requests in flight, the GETs a sync pserver defers until its round closes, the replies
    its dedupe keeps): a message's fields in slots take about 80 bytes, in a `__dict__` 360."""

    kind: Kind
    id: int
    src: str
    step: int = 0
    vars: Mapping[str, Any] = field(default_factory=dict)
    """Name -> numpy array, `LoDTensor`, `SelectedRows` or `Phantom` (encode also takes CPU torch
    tensors wherever it takes an array, and a compressed gradient, `Packed`, which decodes as
    the dense array it stands for)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further header fields: plain msgpack data under keys other than the header's own."""

    @classmethod
    def of(cls, kind: Kind, id: int, src: str, step: int = 0,
           vars: Mapping[str, Any] | None = None,
           extra: Mapping[str, Any] | None = None) -> Message:
        """The message `Message(kind, id, src, step, vars, extra)` makes (a map not given: a
        new empty one), at less cost. DESIGN: a frozen dataclass's `__init__` sets each field
        through `object.__setattr__`, which costs more than the rest of making most messages;
        this sets each slot through its own descriptor (`_SET_FIELDS`), as `__init__` would."""
        msg = object.__new__(cls)
        set_kind, set_id, set_src, set_step, set_vars, set_extra = _SET_FIELDS
        set_kind(msg, kind)
        set_id(msg, id)
        set_src(msg, src)
        set_step(msg, step)
        set_vars(msg, {} if vars is None else vars)
        set_extra(msg, {} if extra is None else extra)
        return msg


_SET_FIELDS = tuple(Message.__dict__[name].__set__
                    for name in ("kind", "id", "src", "step", "vars", "extra"))
"""The setters of `Message`'s slots, in field order (`Message.of`)."""


@dataclass(frozen=True)
class VarSpec:
    """One entry of the header's `vars`: what the frames of one var must hold."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    kind: VarKind
    height: int | None = None
    lod: list[list[int]] | None = None
    codec: Codec | None = None
    """How a dense var's data is packed (`runtime.network.compression`); None: plain values."""
    nnz: int | None = None
    """Top-k: the values kept."""

    @property
    def frame_count(self) -> int:
        if self.codec is not None and self.kind is VarKind.DENSE:
            return frame_count(self.codec)
        return _FRAME_COUNTS[self.kind]

    @property
    def nbytes(self) -> int:
        """Bytes this var's frames carry (0 for a phantom)."""
        return 0 if self.kind is VarKind.PHANTOM else self.data_nbytes

    @property
    def data_nbytes(self) -> int:
        """Bytes of the tensor's data: what its frames carry, or would carry for a phantom."""
        if self.codec is not None:
            return packed_nbytes(self.codec, _product(self.shape), self.dtype, self.nnz)
        values = _product(self.shape) * self.dtype.itemsize
        rows = self.shape[0] * ROWS_DTYPE.itemsize if self.height is not None else 0
        return values + rows

    @property
    def decoded_nbytes(self) -> int:
        """Bytes of what `decode` builds of it: its frames, or the dense tensor a packed var
        unpacks into."""
        if self.codec is not None and self.kind is VarKind.DENSE:
            return _product(self.shape) * self.dtype.itemsize
        return self.nbytes

    def to_header(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "dtype": _DTYPE_NAMES[self.dtype],
            "shape": list(self.shape),
            "kind": str(self.kind),
        }
        if self.height is not None:
            entry["height"] = self.height
        if self.lod is not None:
            entry["lod"] = self.lod
        if self.codec is not None:
            entry.update(_codec_fields(self.codec, self.nnz))
        return entry


def _codec_fields(codec: Codec, nnz: int | None) -> dict[str, Any]:
    """The entry fields that say how a packed var's data is laid out."""
    return {"codec": str(codec)} if nnz is None else {"codec": str(codec), "nnz": nnz}


# ---------------------------------------------------------------------------------------- shared


def _product(shape: Sequence[int]) -> int:
    result = 1
    for dim in shape:
        result *= dim
    return result


def _nbytes(frame: Frame) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
