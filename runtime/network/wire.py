"""The wire protocol: PS messages as lists of frames, with strict validation of what arrives.

A message is frame 0, a msgpack header

    {v, kind, id, src, step, vars: [{name, dtype, shape, kind, height?}, ...], ...extra}

followed by the tensors' raw bytes in `vars` order: one frame per dense tensor (a `LoDTensor`
is dense with a `lod` field), two per `SelectedRows` (the int64 row indices, then the values,
whose first dimension is the row count) and none per `Phantom` (shape and dtype only, with
the `height` or `lod` its real twin would carry). Bytes are little-endian and C-ordered. No
pickle: the header is plain msgpack data, and the tensors are bytes whose layout the header
states.

`encode` is zero-copy: tensor frames are memoryviews of the arrays' own buffers (C-contiguous
arrays are not copied), so the arrays must not change until the frames are sent. `decode` is
strict: anything the header or frames get wrong raises a `DecodeError` whose `reason` says what
and whose message names the var and field, checked before any array is built (sizes from the
header are checked against the limit first, so a lying header allocates nothing). Decoded arrays
are read-only views over the received frames (copied only when a frame is misaligned for its
dtype); copy one to change it. A server turns a `WireError` into an `error_reply`, which the
client turns back into a `RemoteError`.

A compressed gradient (`runtime.network.compression.Packed`) travels as a dense var whose entry
names its ``codec`` (and, for top-k, its ``nnz``): its frames are the codec's, and `decode`
unpacks them into the dense tensor of the entry's shape and dtype, so a receiver never sees the
packing.

Timing mode sends phantoms where numeric mode sends tensors. `charged_size` is what such a
message would weigh with data: exactly the bytes of its numeric twin (same header but for the
vars' kind, and the frames the phantoms stand for), which is what a simulated network charges.
"""

from __future__ import annotations

import enum
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack
import numpy as np

from runtime.execution.tensor import (LoDTensor, Phantom, SelectedRows, TensorError, host_array,
                                      is_native)
from runtime.network.compression import (FLOAT_DTYPES, Codec, Packed, frame_count, index_dtype,
                                         packed_nbytes, unpack)
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
HEADER_FIELDS = frozenset({"v", "kind", "id", "src", "step", "vars"})
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


class WireError(Exception):
    """A message that breaks the wire protocol; `reason` says how, `var` names the culprit var."""

    def __init__(
        self, reason: Reason, detail: str, *, var: str | None = None, msg_id: int | None = None
    ) -> None:
        detail, var = clip(detail, MAX_DETAIL), None if var is None else clip(var, MAX_VAR)
        where = f" (var {var!r})" if var is not None else ""
        super().__init__(f"{reason}: {detail}{where}")
        self.reason = reason
        self.detail = detail
        self.var = var
        self.msg_id = msg_id


class DecodeError(WireError):
    """A received message is malformed: the peer broke the protocol."""


class EncodeError(WireError):
    """A message cannot be encoded: the local caller passed something the wire cannot carry."""


class RemoteError(Exception):
    """A peer answered a request with an error reply."""

    def __init__(self, peer: str, reason: str, detail: str, var: str | None) -> None:
        peer, reason, detail = clip(peer, MAX_VAR), clip(reason, MAX_VAR), clip(detail, MAX_DETAIL)
        var = None if var is None else clip(var, MAX_VAR)
        where = f" (var {var!r})" if var is not None else ""
        super().__init__(f"{peer} replied error {reason}: {detail}{where}")
        self.peer = peer
        self.reason = reason
        self.detail = detail
        self.var = var


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


_FRAME_COUNTS = {VarKind.DENSE: 1, VarKind.ROWS: 2, VarKind.PHANTOM: 0}
_PHANTOM = str(VarKind.PHANTOM)
_DENSE = str(VarKind.DENSE)

# ---------------------------------------------------------------------------------------- encode


def encode(msg: Message) -> list[Frame]:
    """The frames of `msg`: the msgpack header, then each tensor's bytes without copying."""
    _check_outgoing(msg)
    specs: list[dict[str, Any]] = []
    surcharge: int | None = 0  # what the plain phantoms add to its weight (None: see _header)
    received: dict[str, Phantom] = {}  # and what they are received as
    others: list[Phantom | Packed] = []  # the other phantom vars
    frames: list[Frame] = []
    for name, value in msg.vars.items():
        if type(value) is np.ndarray and type(name) is str and name and value.size \
                and value.flags.c_contiguous:  # the common var: its bytes as they are
            dtype_name = _DTYPE_NAMES.get(value.dtype)
            if dtype_name is not None:
                specs.append({"name": name, "dtype": dtype_name, "shape": list(value.shape),
                              "kind": _DENSE})
                frames.append(value.data.cast("B"))
                continue
        if type(value) is Phantom:  # timing mode's var: what it puts on the wire is known
            _check_name(name)
            wire = _phantom_wire(value, name)
            specs.append({"name": name, **wire.entry})
            added = wire.surcharge
            surcharge = None if added is None or surcharge is None else surcharge + added
            received[name] = wire.received
            continue
        if isinstance(value, Phantom) or (isinstance(value, Packed) and value.phantom):
            specs.append(_phantom_entry(name, value))
            others.append(value)
            continue
        spec, var_frames = _encode_var(name, value)
        specs.append(spec.to_header())
        frames.extend(var_frames)
    kind = msg.kind
    if type(kind) is not Kind:  # a plain str (a Kind's own hash and value are Python calls)
        kind = _KINDS.get(kind) or Kind(kind)
    header = {
        "v": WIRE_VERSION,
        "kind": kind._value_,
        "id": msg.id,
        "src": msg.src,
        "step": msg.step,
        "vars": specs,
        **msg.extra,
    }
    try:
        packed = _packer().pack(header)
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(
            Reason.BAD_FIELD, f"header of {msg.kind} message is not msgpack data: {exc}"
        ) from exc
    return [_header(packed, msg, kind, surcharge, received, others, bool(frames)), *frames]


_PACKERS = threading.local()


def _packer() -> msgpack.Packer:
    """This thread's msgpack packer for headers. DESIGN: `msgpack.packb` makes a packer per
    call, and a packer allocates a 256 KiB buffer: for each message a large malloc and free,
    which glibc may hand back to the system and fault in again. A packer is reused (one per
    thread: packing is not reentrant); it resets its buffer after each `pack`, even one that
    raises."""
    packer: msgpack.Packer | None = getattr(_PACKERS, "packer", None)
    if packer is None:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
    return packer


def _check_outgoing(msg: Message) -> None:
    if not HEADER_FIELDS.isdisjoint(msg.extra):
        reserved = sorted(HEADER_FIELDS.intersection(msg.extra))
        raise EncodeError(Reason.RESERVED_FIELD, f"extra fields {reserved} are header fields")
    if type(msg.id) is int and type(msg.step) is int and type(msg.src) is str and msg.src \
            and ID_RANGE[0] <= msg.id <= ID_RANGE[1] \
            and STEP_RANGE[0] <= msg.step <= STEP_RANGE[1]:
        return  # the common case, checked at once
    for key, value, (low, high) in (("id", msg.id, ID_RANGE), ("step", msg.step, STEP_RANGE)):
        if not _is_int(value) or not low <= value <= high:
            raise EncodeError(
                Reason.BAD_FIELD, f"message {key} must be an int in [{low}, {high}], got {value!r}"
            )
    if not isinstance(msg.src, str) or not msg.src:
        raise EncodeError(Reason.BAD_FIELD, f"message src must be a non-empty str, got {msg.src!r}")


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise EncodeError(Reason.BAD_FIELD, f"var names must be non-empty str, got {name!r}")


def _phantom_entry(name: str, value: Phantom | Packed) -> dict[str, Any]:
    """The header's `vars` entry of a phantom (what `VarSpec.to_header` writes); a packed
    phantom's names its codec, as its twin's does."""
    _check_name(name)
    dtype = _wire_dtype(value.dtype, name, EncodeError)
    entry: dict[str, Any] = {"name": name, "dtype": _DTYPE_NAMES[dtype],
                             "shape": list(value.shape), "kind": _PHANTOM}
    if isinstance(value, Packed):
        return {**entry, **_codec_fields(value.codec, value.nnz)}
    if value.height is not None:
        entry["height"] = value.height
    if value.lod:
        entry["lod"] = [list(level) for level in value.lod]
    return entry


class _PhantomWire(NamedTuple):
    """What a phantom puts on the wire, whatever var it is sent as: its header entry but the
    name, the bytes its data adds to the message's weight (`charged_size`; None: `decode`
    refuses its shape, and the message is weighed from its frames) and what a receiver
    decodes it as."""

    entry: dict[str, Any]
    surcharge: int | None
    received: Phantom


_PHANTOM_WIRES: dict[Phantom, _PhantomWire] = {}
_PHANTOM_WIRES_MAX = 1 << 12
"""Most phantoms whose `_PhantomWire` is kept (timing mode sends the few of its program's
blocks, over and over)."""


def _phantom_wire(value: Phantom, name: str) -> _PhantomWire:
    """`value`'s `_PhantomWire`, worked out once for each phantom value. DESIGN: a phantom is
    immutable and its entry, weight and received form depend on nothing else, so equal
    phantoms share them; `_phantom_entry`, `_surcharge` and `_received` stay the definitions
    (and name `name` in what they raise)."""
    wire = _PHANTOM_WIRES.get(value)
    if wire is None:
        entry = _phantom_entry(name, value)
        del entry["name"]
        wire = _PhantomWire(entry, _surcharge(value), _received(value))
        if len(_PHANTOM_WIRES) < _PHANTOM_WIRES_MAX:
            _PHANTOM_WIRES[value] = wire
    return wire


def _encode_var(name: str, value: Any) -> tuple[VarSpec, list[Frame]]:
    _check_name(name)
    if isinstance(value, SelectedRows):
        return _encode_rows(name, value)
    if isinstance(value, Packed):
        return _encode_packed(name, value)
    if isinstance(value, LoDTensor):
        array = _wire_array(value.data, name)
        spec = VarSpec(name, array.dtype, array.shape, VarKind.DENSE, lod=value.lod)
        return spec, [_frame(array)]
    array = _wire_array(_as_numpy(value, name), name)
    return VarSpec(name, array.dtype, array.shape, VarKind.DENSE), [_frame(array)]


def _encode_rows(name: str, value: SelectedRows) -> tuple[VarSpec, list[Frame]]:
    rows = np.require(_as_numpy(value.rows, name), ROWS_DTYPE, "C")
    values = _wire_array(_as_numpy(value.values, name), name)
    if rows.ndim != 1 or values.ndim < 1 or values.shape[0] != rows.shape[0]:
        raise EncodeError(
            Reason.BAD_SHAPE,
            f"rows of shape {rows.shape} do not index values of shape {values.shape}",
            var=name,
        )
    height = int(value.height)
    _check_rows(rows, height, name, EncodeError)
    spec = VarSpec(name, values.dtype, values.shape, VarKind.ROWS, height)
    return spec, [_frame(rows), _frame(values)]


def _encode_packed(name: str, value: Packed) -> tuple[VarSpec, list[Frame]]:
    dtype = _wire_dtype(value.dtype, name, EncodeError)
    spec = VarSpec(name, dtype, value.shape, VarKind.DENSE, codec=value.codec, nnz=value.nnz)
    arrays = [np.require(frame, frame.dtype.newbyteorder("<"), "C") for frame in value.frames]
    if len(arrays) != spec.frame_count or sum(a.nbytes for a in arrays) != spec.data_nbytes:
        raise EncodeError(Reason.SIZE_MISMATCH,
                          f"{value.codec} frames of {[a.nbytes for a in arrays]} bytes do not "
                          f"pack shape {list(value.shape)} of {dtype}", var=name)
    return spec, [_frame(array) for array in arrays]


def _as_numpy(value: Any, name: str) -> np.ndarray:
    """`value` as a numpy array: numpy as is, a CPU torch tensor as a view of its storage."""
    if isinstance(value, np.ndarray):
        return value
    torch = sys.modules.get("torch")  # a torch tensor implies torch is imported
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type == "cuda" and is_native(value):
            return host_array(value)  # off the GPU through the torch backend's pinned buffers
        if value.device.type != "cpu":
            raise EncodeError(
                Reason.UNSUPPORTED_TENSOR,
                f"tensor is on {value.device}; move it to the CPU first (tensor.cpu())",
                var=name,
            )
        if value.dtype == torch.bfloat16:
            raise EncodeError(Reason.BAD_DTYPE, "bfloat16 is not a wire dtype", var=name)
        return value.detach().resolve_conj().resolve_neg().numpy()
    raise EncodeError(
        Reason.UNSUPPORTED_TENSOR,
        f"cannot send a {type(value).__name__}: expected a numpy array, SelectedRows, Phantom "
        "or CPU torch tensor",
        var=name,
    )


def _wire_array(array: np.ndarray, name: str) -> np.ndarray:
    """`array` little-endian and C-contiguous, copied only if it is not already."""
    dtype = _wire_dtype(array.dtype, name, EncodeError)
    if array.dtype == dtype and array.flags.c_contiguous:
        return array
    return np.require(array, dtype, "C")


def _frame(array: np.ndarray) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


# ---------------------------------------------------------------------------------------- decode


def decode(frames: Sequence[Frame], max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
           max_header_size: int = DEFAULT_MAX_HEADER_SIZE) -> Message:
    """The message the frames carry; raise `DecodeError` naming the first thing wrong with them."""
    if not frames:
        raise DecodeError(Reason.FRAME_COUNT, "empty message: no header frame")
    encoded = _encoded_header(frames)
    if encoded is not None and encoded.parsed is not None and len(frames) == 1 \
            and len(encoded) <= min(max_message_size, max_header_size):
        return encoded.parsed.message()
    _check_envelope_size(frames, max_message_size, max_header_size)
    header = _unpack_header(frames[0])
    carried: Any = header.get("id")
    msg_id = carried if _is_int(carried) and ID_RANGE[0] <= carried <= ID_RANGE[1] else None
    try:
        fast = _decode_plain(header, frames, max_message_size)
        if fast is not None:
            return fast
        return _decode(header, frames, max_message_size)
    except DecodeError as exc:
        exc.msg_id = msg_id
        raise
    except Exception as exc:  # untrusted input: whatever a check missed is the peer's error too
        raise DecodeError(Reason.BAD_VALUE, f"undecodable message: {type(exc).__name__}: {exc}",
                          msg_id=msg_id) from exc


def _check_envelope_size(frames: Sequence[Frame], max_message_size: int,
                         max_header_size: int) -> None:
    """The limits checked before anything is parsed: frame count, header size, total size."""
    if len(frames) > MAX_FRAMES:
        raise DecodeError(Reason.FRAME_COUNT, f"{len(frames)} frames, at most {MAX_FRAMES}")
    first = frames[0]
    head = first.nbytes if type(first) is memoryview else len(first)
    if head > min(max_header_size, max_message_size):
        raise DecodeError(
            Reason.TOO_LARGE,
            f"header of {head} bytes exceeds {min(max_header_size, max_message_size)}")
    total = 0
    for frame in frames:
        total += frame.nbytes if type(frame) is memoryview else len(frame)
    if total > max_message_size:
        raise DecodeError(Reason.TOO_LARGE, f"message of {total} bytes exceeds {max_message_size}")


def _decode(header: dict[str, Any], frames: Sequence[Frame], max_message_size: int) -> Message:
    kind, msg_id, src, step = _check_envelope(header)
    specs = _check_var_list(header["vars"])
    size = _nbytes(frames[0]) + sum(spec.nbytes for spec in specs)
    if size > max_message_size:
        raise DecodeError(
            Reason.TOO_LARGE, f"message declares {size} bytes, limit {max_message_size}"
        )
    unpacked = sum(spec.decoded_nbytes for spec in specs)
    if unpacked > max_message_size:
        raise DecodeError(
            Reason.TOO_LARGE, f"message unpacks into {unpacked} bytes, limit {max_message_size}"
        )
    expected = 1 + sum(spec.frame_count for spec in specs)
    if len(frames) != expected:
        raise DecodeError(
            Reason.FRAME_COUNT, f"header's vars need {expected} frames, message has {len(frames)}"
        )
    values: dict[str, Any] = {}
    position = 1
    for spec in specs:
        values[spec.name] = _decode_var(spec, frames[position : position + spec.frame_count])
        position += spec.frame_count
    return Message(kind, msg_id, src, step, values, _extra(header))


def _extra(header: dict[str, Any]) -> dict[str, Any]:
    """The header's fields beyond `HEADER_FIELDS`, which must hold plain data: msgpack's
    Timestamp is an extension type that the unpacker builds itself (`ext_hook` never sees it),
    so it is refused here, as every other extension type is by `_reject_ext`."""
    extra = {key: value for key, value in header.items() if key not in HEADER_FIELDS}
    stack: list[Any] = list(extra.values())
    while stack:
        value = stack.pop()
        if type(value) is msgpack.Timestamp:
            raise DecodeError(Reason.BAD_HEADER, "msgpack extension type -1 (Timestamp) is not "
                              "allowed")
        if type(value) is list:
            stack.extend(value)
        elif type(value) is dict:
            stack.extend(value.values())
    return extra


_PLAIN_VAR_FIELDS = frozenset({"name", "dtype", "shape", "kind"})
_PLAIN_DTYPES = {name: dtype for name, dtype in DTYPES.items() if name != "bool"}


def _decode_plain(header: dict[str, Any], frames: Sequence[Frame],
                  max_message_size: int) -> Message | None:
    """`_decode` of the common message, read in one pass: the header's own fields valid (any
    further fields are the message's `extra`, as there) and each var a dense tensor of a
    non-bool dtype whose frame has exactly its bytes. None for anything else (an error, a
    phantom, rows, lod, a bool): `_decode` then checks it field by field and names what is
    wrong. DESIGN: every condition is one `_decode` also checks, so the fast path accepts
    nothing `_decode` refuses and builds the same `Message`; it only skips building
    `VarSpec`s and the generic checks' calls, which cost more than the zero-copy arrays for
    most messages."""
    if not header.keys() >= HEADER_FIELDS:
        return None
    carried_kind, msg_id, step, src, entries = (
        header["kind"], header["id"], header["step"], header["src"], header["vars"])
    kind = _KINDS.get(carried_kind) if type(carried_kind) is str else None
    if (header["v"] != WIRE_VERSION or type(header["v"]) is not int or kind is None
            or type(msg_id) is not int or not ID_RANGE[0] <= msg_id <= ID_RANGE[1]
            or type(step) is not int or not STEP_RANGE[0] <= step <= STEP_RANGE[1]
            or type(src) is not str or not src or type(entries) is not list
            or len(frames) != len(entries) + 1):
        return None
    first = frames[0]
    size = first.nbytes if type(first) is memoryview else len(first)
    values: dict[str, Any] = {}
    position = 0  # a counter, not zip(entries, frames[1:]) or enumerate: cheaper on this path
    for entry in entries:
        position += 1
        frame = frames[position]
        if type(entry) is not dict or entry.keys() != _PLAIN_VAR_FIELDS \
                or entry["kind"] != _DENSE:
            return None
        name, dtype_name, shape = entry["name"], entry["dtype"], entry["shape"]
        dtype = _PLAIN_DTYPES.get(dtype_name) if type(dtype_name) is str else None
        if (type(name) is not str or not name or name in values or dtype is None
                or type(shape) is not list or len(shape) > MAX_NDIM):
            return None
        count = 1
        for dim in shape:
            if type(dim) is not int or not 0 <= dim <= MAX_DIM:
                return None
            count *= dim
        nbytes = count * dtype.itemsize
        size += nbytes
        if (frame.nbytes if type(frame) is memoryview else len(frame)) != nbytes \
                or size > max_message_size or (not count and _span(shape, dtype) > MAX_DIM):
            return None
        array = np.frombuffer(frame, dtype, count)
        if len(shape) != 1:  # a vector has its shape already (a reshape costs a fifth of this)
            array = array.reshape(shape)
        flags = array.flags  # a new object at each reading
        if not flags.aligned:  # libzmq packs small frames into its receive buffer: as `_view`
            array = array.copy()
            flags = array.flags
        flags.writeable = False
        values[name] = array
    if len(header) == len(HEADER_FIELDS):
        return Message.of(kind, msg_id, src, step, values)
    return Message.of(kind, msg_id, src, step, values, _extra(header))


def _unpack_header(frame: Frame) -> dict[str, Any]:
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=True, ext_hook=_reject_ext)
    except Exception as exc:  # untrusted bytes: any parser failure is the peer's malformed header
        raise DecodeError(Reason.BAD_HEADER, f"header frame is not valid msgpack: {exc}") from exc
    if not isinstance(header, dict):
        raise DecodeError(Reason.BAD_HEADER, f"header is a {type(header).__name__}, not a map")
    return header


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not allowed")


def _check_envelope(header: dict[str, Any]) -> tuple[Kind, int, str, int]:
    if not HEADER_FIELDS <= header.keys():
        missing = ", ".join(sorted(HEADER_FIELDS.difference(header)))
        raise DecodeError(Reason.MISSING_FIELD, f"header lacks {missing}")
    if header["v"] != WIRE_VERSION or not _is_int(header["v"]):
        raise DecodeError(
            Reason.UNKNOWN_VERSION, f"version {header['v']!r}, expected {WIRE_VERSION}"
        )
    kind = _KINDS.get(header["kind"]) if isinstance(header["kind"], str) else None
    if kind is None:
        raise DecodeError(Reason.UNKNOWN_KIND, f"message kind {header['kind']!r} is unknown")
    msg_id = _field(header, "id", *ID_RANGE)
    step = _field(header, "step", *STEP_RANGE)
    src = header["src"]
    if not isinstance(src, str) or not src:
        raise DecodeError(Reason.BAD_FIELD, f"field 'src' must be a non-empty str, got {src!r}")
    return kind, msg_id, src, step


def _field(header: Mapping[str, Any], key: str, low: int, high: int, var: str | None = None) -> int:
    value = header[key]
    if not _is_int(value) or not low <= value <= high:
        raise DecodeError(
            Reason.BAD_FIELD,
            f"field {key!r} must be an int in [{low}, {high}], got {value!r}",
            var=var,
        )
    return int(value)


def _check_var_list(entries: Any) -> list[VarSpec]:
    if not isinstance(entries, list):
        raise DecodeError(
            Reason.BAD_FIELD, f"field 'vars' must be a list, got {type(entries).__name__}"
        )
    specs = [_check_var(entry) for entry in entries]
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise DecodeError(
                Reason.DUPLICATE_VAR, "var appears twice in the header", var=spec.name
            )
        seen.add(spec.name)
    return specs


_KINDS = {kind.value: kind for kind in Kind}
_VAR_KINDS = {kind.value: kind for kind in VarKind}
_VAR_FIELDS = frozenset({"name", "dtype", "shape", "kind"})
_CODEC_FIELDS = frozenset({"codec", "nnz"})
_ALLOWED_VAR_FIELDS = {
    VarKind.DENSE: _VAR_FIELDS | {"lod"} | _CODEC_FIELDS,
    VarKind.ROWS: _VAR_FIELDS | {"height"},
    VarKind.PHANTOM: _VAR_FIELDS | {"height", "lod"} | _CODEC_FIELDS,
}
_CODECS = {codec.value: codec for codec in Codec}


def _check_var(entry: Any) -> VarSpec:
    if not isinstance(entry, dict):
        raise DecodeError(Reason.BAD_FIELD, f"a vars entry is a {type(entry).__name__}, not a map")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise DecodeError(Reason.BAD_FIELD, f"a vars entry has no valid name: {name!r}")
    if not _VAR_FIELDS <= entry.keys():
        missing = ", ".join(sorted(_VAR_FIELDS.difference(entry)))
        raise DecodeError(Reason.MISSING_FIELD, f"vars entry lacks {missing}", var=name)
    kind = _VAR_KINDS.get(entry["kind"]) if isinstance(entry["kind"], str) else None
    if kind is None:
        raise DecodeError(Reason.BAD_FIELD, f"var kind {entry['kind']!r} is unknown", var=name)
    if not entry.keys() <= _ALLOWED_VAR_FIELDS[kind]:
        unknown = sorted(set(entry).difference(_ALLOWED_VAR_FIELDS[kind]), key=repr)
        raise DecodeError(Reason.BAD_FIELD, f"vars entry has unknown fields {unknown}", var=name)
    if kind is VarKind.ROWS and "height" not in entry:
        raise DecodeError(Reason.MISSING_FIELD, "rows var lacks height", var=name)
    dtype = _header_dtype(entry["dtype"], name)
    shape = _header_shape(entry["shape"], kind is VarKind.ROWS or "height" in entry, name)
    if _span(shape, dtype) > MAX_DIM:
        raise DecodeError(Reason.BAD_SHAPE, f"shape {list(shape)} of {dtype} spans more than "
                          f"{MAX_DIM} bytes (its nonzero dimensions' product)", var=name)
    height = _field(entry, "height", 0, MAX_DIM, var=name) if "height" in entry else None
    lod = _header_lod(entry["lod"], name) if "lod" in entry else None
    if "codec" not in entry:
        if "nnz" in entry:
            raise DecodeError(Reason.BAD_FIELD, "nnz without a codec", var=name)
        return VarSpec(name, dtype, shape, kind, height, lod)
    codec, nnz = _header_codec(entry, dtype, shape, height is not None or lod is not None, name)
    return VarSpec(name, dtype, shape, kind, height, lod, codec, nnz)


def _header_codec(entry: dict[str, Any], dtype: np.dtype[Any], shape: tuple[int, ...],
                  structured: bool, name: str) -> tuple[Codec, int | None]:
    """The codec of a packed var's entry and its top-k count, checked against the entry."""
    codec = _CODECS.get(entry["codec"]) if isinstance(entry["codec"], str) else None
    if codec is None:
        raise DecodeError(Reason.BAD_FIELD, f"codec {entry['codec']!r} is not one of "
                          f"{', '.join(_CODECS)}", var=name)
    if structured or dtype not in FLOAT_DTYPES:
        raise DecodeError(Reason.BAD_FIELD, f"codec {codec} packs a plain float32 or float64 "
                          f"tensor, not {'rows or a LoD' if structured else dtype}", var=name)
    if (codec is Codec.TOPK) != ("nnz" in entry):
        raise DecodeError(Reason.BAD_FIELD if "nnz" in entry else Reason.MISSING_FIELD,
                          "nnz goes with codec topk, and only with it", var=name)
    nnz = _field(entry, "nnz", 0, _product(shape), var=name) if "nnz" in entry else None
    return codec, nnz


def _header_dtype(value: Any, name: str) -> np.dtype[Any]:
    if not isinstance(value, str) or value not in DTYPES:
        raise DecodeError(
            Reason.BAD_DTYPE, f"dtype {value!r} is not one of {', '.join(DTYPES)}", var=name
        )
    return DTYPES[value]


def _header_shape(value: Any, rows: bool, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_NDIM:
        raise DecodeError(
            Reason.BAD_SHAPE,
            f"shape must be a list of at most {MAX_NDIM} ints, got {value!r}",
            var=name,
        )
    if not all(_is_int(dim) and 0 <= dim <= MAX_DIM for dim in value):
        raise DecodeError(
            Reason.BAD_SHAPE, f"shape {value!r} has a dimension outside [0, {MAX_DIM}]", var=name
        )
    if rows and not value:
        raise DecodeError(Reason.BAD_SHAPE, "rows values need at least one dimension", var=name)
    return tuple(value)


def _header_lod(value: Any, name: str) -> list[list[int]]:
    if not isinstance(value, list) or not all(
        isinstance(level, list) and all(_is_int(offset) for offset in level) for level in value
    ):
        raise DecodeError(
            Reason.BAD_FIELD, f"lod must be a list of int lists, got {value!r}", var=name
        )
    return value


def _decode_var(spec: VarSpec, frames: Sequence[Frame]) -> Tensor:
    if spec.kind is VarKind.PHANTOM:
        return _phantom(spec)
    if spec.codec is not None:
        return _unpack(spec, frames)
    if spec.kind is VarKind.DENSE:
        array = _view(frames[0], spec.dtype, spec.shape, spec.name)
        return array if spec.lod is None else _lod_tensor(array, spec.lod, spec.name)
    rows = _view(frames[0], ROWS_DTYPE, spec.shape[:1], spec.name)
    values = _view(frames[1], spec.dtype, spec.shape, spec.name)
    assert spec.height is not None
    _check_rows(rows, spec.height, spec.name, DecodeError)
    return SelectedRows(rows, values, spec.height)


def _unpack(spec: VarSpec, frames: Sequence[Frame]) -> np.ndarray:
    """The dense tensor a packed var's frames stand for; top-k's indices must rise strictly
    and lie in the tensor."""
    size = _product(spec.shape)
    assert spec.codec is not None
    if spec.codec is Codec.FP16:
        parts: tuple[np.ndarray, ...] = (_view(frames[0], DTYPES["float16"], (size,), spec.name),)
    elif spec.codec is Codec.INT8:
        parts = (_view(frames[0], spec.dtype, (1,), spec.name),
                 _view(frames[1], DTYPES["int8"], (size,), spec.name))
    else:
        assert spec.nnz is not None
        index = DTYPES[index_dtype(size).name]
        indices = _view(frames[0], index, (spec.nnz,), spec.name)
        parts = (indices, _view(frames[1], spec.dtype, (spec.nnz,), spec.name))
        bad = np.flatnonzero(np.diff(indices) <= 0)
        if bad.size or (indices.size and (indices[0] < 0 or indices[-1] >= size)):
            where = f"index {indices[bad[0] + 1]} at {bad[0] + 1} does not exceed the one " \
                f"before it" if bad.size else f"indices reach outside [0, {size})"
            raise DecodeError(Reason.ROWS_OUT_OF_RANGE, f"topk {where}", var=spec.name)
    native = np.dtype(_DTYPE_NAMES[spec.dtype])
    return unpack(Packed(spec.codec, spec.shape, native, parts, spec.nnz))


def _view(frame: Frame, dtype: np.dtype[Any], shape: tuple[int, ...], name: str) -> np.ndarray:
    """A read-only array over `frame`, which must hold exactly `shape` of `dtype`."""
    count = _product(shape)
    expected = count * dtype.itemsize
    if _nbytes(frame) != expected:
        raise DecodeError(
            Reason.SIZE_MISMATCH,
            f"frame has {_nbytes(frame)} bytes, shape {list(shape)} of {dtype} needs {expected}",
            var=name,
        )
    array = np.frombuffer(frame, dtype=dtype, count=count).reshape(shape)
    if dtype == DTYPES["bool"]:
        _check_bools(array, name)
    if not array.flags.aligned:
        array = array.copy()
    array.flags.writeable = False
    return array


def _phantom(spec: VarSpec) -> Phantom:
    dtype = np.dtype(_DTYPE_NAMES[spec.dtype])
    try:
        return Phantom(spec.shape, dtype, spec.height, tuple(map(tuple, spec.lod or ())))
    except TensorError as exc:
        raise DecodeError(Reason.BAD_FIELD, f"lod does not fit shape {list(spec.shape)}: {exc}",
                          var=spec.name)


def _lod_tensor(array: np.ndarray, lod: list[list[int]], name: str) -> LoDTensor:
    try:
        return LoDTensor(array, lod)
    except TensorError as exc:
        raise DecodeError(
            Reason.BAD_FIELD, f"lod does not fit shape {list(array.shape)}: {exc}", var=name
        )


def _check_bools(array: np.ndarray, name: str) -> None:
    raw = array.reshape(-1).view(np.uint8)
    bad = np.flatnonzero(raw > 1)
    if bad.size:
        raise DecodeError(
            Reason.BAD_VALUE,
            f"bool byte {raw[bad[0]]} at flat index {bad[0]} is not 0 or 1",
            var=name,
        )


# ------------------------------------------------------------------------------------ charging

_PHANTOM_KIND = msgpack.packb(str(VarKind.PHANTOM))
_TWIN_KIND_BYTES = {
    rows: len(msgpack.packb(str(VarKind.ROWS if rows else VarKind.DENSE))) - len(_PHANTOM_KIND)
    for rows in (False, True)
}
"""How much shorter the header gets when a phantom's kind becomes its twin's (dense or rows)."""


def charged_size(frames: Sequence[Frame]) -> int:
    """Bytes the message would take if its phantoms carried data: its frames, plus for each
    phantom var the frames it stands for, less the header bytes its kind "phantom" takes over
    its twin's "dense" or "rows". A message without phantoms, or one that does not decode,
    weighs its frames."""
    if len(frames) == 1:  # the header alone (most messages): `_encoded_header`, inline
        head = frames[0]
        origin = head.obj if type(head) is memoryview else head
        if type(origin) is _Header and _nbytes(head) == len(origin):
            return len(origin) + origin.surcharge
    encoded = _encoded_header(frames)
    if encoded is not None:
        return sum(_nbytes(frame) for frame in frames) + encoded.surcharge
    return _charged_size(frames)


def _charged_size(frames: Sequence[Frame]) -> int:
    """`charged_size` read off the frames alone."""
    size = sum(_nbytes(frame) for frame in frames)
    if not frames or _PHANTOM_KIND not in bytes(frames[0]):
        return size
    try:
        entries = _unpack_header(frames[0])["vars"]
        phantoms = [_check_var(entry) for entry in entries
                    if isinstance(entry, dict) and entry.get("kind") == VarKind.PHANTOM]
    except (DecodeError, KeyError, TypeError):
        return size
    return size + sum(spec.data_nbytes + _TWIN_KIND_BYTES[spec.height is not None]
                      for spec in phantoms)


# ---------------------------------------------------------------------------- encoded here


class _Header(bytes):
    """A header frame `encode` made: the msgpack bytes, which also remember what the message
    weighs with data (`surcharge`: what its phantoms add to its frames' bytes, as
    `charged_size` reads it off the frames) and, for a message of phantoms and plain header
    data, the message `decode` parses out of it (`parsed`). The bytes cannot change, so these
    stay true; the simulator hands the very frames (as memoryviews of them) to the receiver,
    which then needs to parse nothing. Frames that arrive any other way are parsed."""

    surcharge: int
    parsed: _Parsed | None
    kind: str


class _Parsed(NamedTuple):
    """What `decode` makes of a header of phantoms: the message's fields as msgpack gives
    them back (`extra` plain data; `nested` when it holds lists or maps, copied per decode)."""

    kind: Kind
    id: int
    src: str
    step: int
    vars: dict[str, Phantom]
    extra: Mapping[str, Any]
    nested: bool

    def message(self) -> Message:
        """A new `Message` of these fields (with new maps), as `decode` would build it."""
        return Message.of(self.kind, self.id, self.src, self.step, self.vars.copy(),
                          _fresh(self.extra) if self.nested else dict(self.extra))


class _NotPlain(Exception):
    """Header data that msgpack would give back as something else (a tuple, an enum...)."""


def _header(packed: bytes, msg: Message, kind: Kind, surcharge: int | None,
            received: dict[str, Phantom], others: list[Phantom | Packed],
            has_data: bool) -> _Header:
    """`packed` as a `_Header` of `msg` (of `kind`), whose plain phantom vars add `surcharge`
    bytes to its weight (None: one of them `decode` refuses) and are received as `received`
    says, and whose other phantom vars are `others`."""
    header = _Header(packed)
    header.kind = kind._value_
    for phantom in others:  # it adds its bytes, less "phantom" over "dense" or "rows"
        if surcharge is None:
            break
        added = _surcharge(phantom)
        surcharge = None if added is None else surcharge + added
    if surcharge is None:  # charged_size weighs the frames alone, as it would
        header.surcharge = _charged_size([packed]) - len(packed)
        header.parsed = None
        return header
    header.surcharge = surcharge
    header.parsed = None if has_data else _parsed(msg, kind, received)
    return header


def _surcharge(phantom: Phantom | Packed) -> int | None:
    """The bytes `phantom`'s data adds to a message's weight, less "phantom" over "dense" or
    "rows" in its entry; None if `decode` would refuse its shape."""
    if not _decodable(phantom):
        return None
    rows = isinstance(phantom, Phantom) and phantom.height is not None
    return phantom.nbytes + _TWIN_KIND_BYTES[rows]


def _decodable(phantom: Phantom | Packed) -> bool:
    """Whether `decode` accepts the shape and height (codec) of this phantom (encode does not
    check these limits)."""
    if isinstance(phantom, Packed):
        return len(phantom.shape) <= MAX_NDIM and (not phantom.shape or max(phantom.shape)
                                                     <= MAX_DIM) and phantom.dtype in FLOAT_DTYPES
    shape, height = phantom.shape, phantom.height
    return len(shape) <= MAX_NDIM and (not shape or max(shape) <= MAX_DIM) \
        and (height is None or height <= MAX_DIM)


_NO_PHANTOMS: dict[str, Phantom] = {}
"""The vars of every parse of a message without vars (never changed: `_Parsed.message` copies)."""


def _flat_list(value: Any) -> bool:
    """Whether `value` is a list of scalars: what msgpack gives back for it is equal to it."""
    return type(value) is list and all(type(item) in _SCALARS for item in value)


def _parsed(msg: Message, kind: Kind, received: dict[str, Phantom]) -> _Parsed | None:
    """What decoding `msg`'s header would give (it has no data frames), or None if its names
    and extra fields are not plain data; `received`: what some of its phantoms are received
    as, known already.

    DESIGN: an `extra` that msgpack would give back equal (scalars and lists of scalars, the
    common header) is held as it is, not copied: a simulation holds a parse per request in
    flight, 100,000 at once for a sync round at 1,000 x 100. Each decode copies it
    (`_Parsed.message`), and a message's maps are not changed once it is sent."""
    extra = msg.extra
    nested, copy = False, type(extra) is not dict
    for key, value in extra.items():
        if type(key) is not str:
            return None
        if type(value) not in _SCALARS:
            nested = True
            copy = copy or not _flat_list(value)
    if copy:
        try:
            extra = {key: _plain(value) for key, value in extra.items()}
        except _NotPlain:
            return None
    phantoms = {} if msg.vars else _NO_PHANTOMS
    for name, phantom in msg.vars.items():
        if type(name) is not str:
            return None
        ready = received.get(name)
        phantoms[name] = _received(phantom) if ready is None else ready
    return _Parsed(kind, int(msg.id), str(msg.src), int(msg.step), phantoms, extra, nested)


def _received(value: Phantom | Packed) -> Phantom:
    """The phantom the receiver decodes: the same (a packed one's dense tensor), with the wire
    dtype in native byte order."""
    if isinstance(value, Packed):
        value = value.dense_phantom()
    dtype = value.dtype
    if type(value) is Phantom and dtype.isnative and dtype in _DTYPE_NAMES:
        return value
    native = np.dtype(_DTYPE_NAMES[_wire_dtype(dtype, "", EncodeError)])
    return Phantom(value.shape, native, value.height, value.lod)


_SCALARS = (str, int, float, bool, bytes, type(None))


def _plain(value: Any) -> Any:
    """`value` as msgpack gives it back (a tuple comes back a list); `_NotPlain` if it would
    come back as anything else, or not at all."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        return [_plain(item) for item in value]
    if kind is dict and all(type(key) is str for key in value):
        return {key: _plain(item) for key, item in value.items()}
    raise _NotPlain(kind.__name__)


def _fresh(value: Any) -> Any:
    """A copy of plain data whose lists and maps are new."""
    if type(value) is list:
        return [_fresh(item) for item in value]
    if type(value) is dict:
        return {key: _fresh(item) for key, item in value.items()}
    return value


def message_kind(frames: Sequence[Frame]) -> str | None:
    """The kind of a message `encode` made (as its header says), without decoding; None for
    frames that came any other way."""
    encoded = _encoded_header(frames)
    return None if encoded is None else encoded.kind


def _encoded_header(frames: Sequence[Frame]) -> _Header | None:
    """The header `encode` made that frame 0 is (or is a whole view of), if it is one."""
    if not frames:
        return None
    head = frames[0]
    origin = head.obj if type(head) is memoryview else head
    if type(origin) is _Header and _nbytes(head) == len(origin):
        return origin
    return None


# ---------------------------------------------------------------------------------------- shared


def _wire_dtype(dtype: np.dtype[Any], name: str, error: type[WireError]) -> np.dtype[Any]:
    """The wire's (little-endian) form of `dtype`, which must be a whitelisted type."""
    wire = dtype if dtype in _DTYPE_NAMES else dtype.newbyteorder("<")
    if wire not in _DTYPE_NAMES:
        raise error(Reason.BAD_DTYPE, f"dtype {dtype} is not one of {', '.join(DTYPES)}", var=name)
    return wire


def _check_rows(rows: np.ndarray, height: int, name: str, error: type[WireError]) -> None:
    bad = np.flatnonzero((rows < 0) | (rows >= height))
    if bad.size:
        raise error(
            Reason.ROWS_OUT_OF_RANGE,
            f"row {rows[bad[0]]} at index {bad[0]} is outside [0, {height})",
            var=name,
        )


def _span(shape: Sequence[int], dtype: np.dtype[Any]) -> int:
    """Bytes the nonzero dimensions of `shape` multiply to: what numpy must be able to index
    even for an empty array (it refuses to shape one whose span overflows its index type)."""
    result = dtype.itemsize
    for dim in shape:
        result *= dim or 1
    return result


def _product(shape: Sequence[int]) -> int:
    result = 1
    for dim in shape:
        result *= dim
    return result


def _nbytes(frame: Frame) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was cut: what an error or a log line
    echoes of received data stays small however large the data."""
    if len(text) <= limit:
        return text
    cut = f"...[{len(text) - limit} more chars]"
    return text[: max(0, limit - len(cut))] + cut


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------- errors


def error_reply(
    src: str, error: Exception, *, request_id: int | None = None, step: int = 0
) -> Message:
    """An ERROR message from `src` answering request `request_id` with what `error` says.

    The reason is the error's `reason` (a `WireError`'s, or a refusal's that names one) or else
    the exception's class name; the culprit var is
    the error's `var` attribute where it has one. The id defaults to the one the malformed
    request carried, or 0 when even that was unreadable.
    """
    if request_id is None:
        carried = error.msg_id if isinstance(error, WireError) else None
        request_id = carried if carried is not None else 0
    if not _is_int(request_id) or not ID_RANGE[0] <= request_id <= ID_RANGE[1]:
        request_id = 0  # an id the reply could not carry (the request's was readable but bad)
    if not _is_int(step) or not STEP_RANGE[0] <= step <= STEP_RANGE[1]:
        step = 0
    named = getattr(error, "reason", None)
    reason = str(named) if isinstance(named, str) and named else type(error).__name__
    detail = error.detail if isinstance(error, WireError) else str(error)
    culprit = getattr(error, "var", None)
    var = clip(culprit, MAX_VAR) if isinstance(culprit, str) else None
    body = {"reason": reason, "detail": clip(detail, MAX_DETAIL), "var": var}
    return Message(Kind.ERROR, request_id, src, step, extra={"error": body})


def raise_for_error(msg: Message) -> Message:
    """Return `msg`, or raise `RemoteError` if it is an error reply."""
    if msg.kind is not Kind.ERROR:
        return msg
    body = msg.extra.get("error")
    body = body if isinstance(body, dict) else {}
    reason, detail, var = body.get("reason"), body.get("detail"), body.get("var")
    raise RemoteError(
        msg.src,
        reason if isinstance(reason, str) else "unknown",
        detail if isinstance(detail, str) else repr(body),
        var if isinstance(var, str) else None,
    )
