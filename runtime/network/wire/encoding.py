"""`encode`: a `Message` to frames, without copying its tensors.

The header goes first, msgpack of plain data (no pickle); then each var's bytes, little-endian
and C-ordered, as memoryviews of the arrays' own buffers (a C-contiguous array is not copied),
so the arrays must not change until the frames are sent. A plain dense array takes a short way
to its header entry; a phantom's entry, weight and received form are worked out once per
phantom value (`_phantom_wire`); anything else goes through a `VarSpec` (rows, LoD, packed
gradients, torch tensors). What the caller gets wrong raises an `EncodeError`.

The header frame is a `header._Header`: it remembers the message's weight with data (for
`charged_size`) and, for a message with no data frames, the message `decode` would parse out
of it (`_parsed`), as `decode` would build it: names and extra fields as msgpack gives them
back, phantoms as received (native byte order, a packed one as its dense tensor).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, NamedTuple

import msgpack
import numpy as np

from runtime.execution.tensor import LoDTensor, Phantom, SelectedRows, host_array, is_native
from runtime.network.compression import Packed
from runtime.network.transport import Frame
from runtime.network.wire.decoding import _check_rows
from runtime.network.wire.errors import EncodeError, WireError
from runtime.network.wire.format import (_DENSE, _DTYPE_NAMES, _PHANTOM, DTYPES, HEADER_FIELDS,
                                         ID_RANGE, KINDS, ROWS_DTYPE, STEP_RANGE, WIRE_VERSION,
                                         Kind, Message, Reason, VarKind, VarSpec, _codec_fields,
                                         _is_int)
from runtime.network.wire.header import _Header, _Parsed
from runtime.network.wire.weighing import _charged_size, _surcharge

_dtype_named, _kind_named, _no_header_field = _DTYPE_NAMES.get, KINDS.get, HEADER_FIELDS.isdisjoint
"""The lookups in the format's tables that each message makes, bound once: see the DESIGN note
of `decoding._kind_named`."""


def encode(msg: Message) -> list[Frame]:
    """The frames of `msg`: the msgpack header, then each tensor's bytes without copying."""
    _check_outgoing(msg)
    specs: list[dict[str, Any]] = []
    surcharge: int | None = 0  # what the phantoms add to its weight (None: see _header)
    received: dict[str, Phantom] = {}  # and what those of known wire are received as
    frames: list[Frame] = []
    for name, value in msg.vars.items():
        if type(value) is np.ndarray and type(name) is str and name and value.size \
                and value.flags.c_contiguous:  # the common var: its bytes as they are
            dtype_name = _dtype_named(value.dtype)
            if dtype_name is not None:
                specs.append({"name": name, "dtype": dtype_name, "shape": list(value.shape),
                              "kind": _DENSE})
                frames.append(value.data.cast("B"))
                continue
        if type(value) is Phantom or (type(value) is Packed and value.phantom):
            _check_name(name)  # timing mode's var: what it puts on the wire is known
            wire = _phantom_wire(value, name)
            specs.append({"name": name, **wire.entry})
            added = wire.surcharge
            surcharge = None if added is None or surcharge is None else surcharge + added
            received[name] = wire.received
            continue
        if isinstance(value, Phantom) or (isinstance(value, Packed) and value.phantom):
            entry = _phantom_entry(name, value)
            specs.append(entry)
            if surcharge is not None:
                added = _surcharge(entry)
                surcharge = None if added is None else surcharge + added
            continue
        spec, var_frames = _encode_var(name, value)
        specs.append(spec.to_header())
        frames.extend(var_frames)
    kind = msg.kind
    if type(kind) is not Kind:  # a plain str (a Kind's own hash and value are Python calls)
        kind = _kind_named(kind) or Kind(kind)
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
    return [_header(packed, msg, kind, surcharge, received, bool(frames)), *frames]


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
    if not _no_header_field(msg.extra):
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
    refuses its entry, and the message is weighed from its frames) and what a receiver
    decodes it as."""

    entry: dict[str, Any]
    surcharge: int | None
    received: Phantom


_PHANTOM_WIRES: dict[Phantom | Packed, _PhantomWire] = {}
_PHANTOM_WIRES_MAX = 1 << 12
"""Most phantoms whose `_PhantomWire` is kept (timing mode sends the few of its program's
blocks, over and over)."""


def _phantom_wire(value: Phantom | Packed, name: str) -> _PhantomWire:
    """`value`'s `_PhantomWire`, worked out once for each phantom value. DESIGN: a phantom is
    immutable and its entry, weight and received form depend on nothing else, so equal
    phantoms share them; `_phantom_entry`, `_surcharge` and `_received` stay the definitions
    (and name `name` in what they raise)."""
    wire = _PHANTOM_WIRES.get(value)
    if wire is None:
        entry = _phantom_entry(name, value)
        surcharge = _surcharge(entry)
        del entry["name"]
        wire = _PhantomWire(entry, surcharge, _received(value))
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


# ------------------------------------------------------------------------------- the header frame


class _NotPlain(Exception):
    """Header data that msgpack would give back as something else (a tuple, an enum...)."""


def _header(packed: bytes, msg: Message, kind: Kind, surcharge: int | None,
            received: dict[str, Phantom], has_data: bool) -> _Header:
    """`packed` as a `_Header` of `msg` (of `kind`), whose phantom vars add `surcharge` bytes
    to its weight (None: `decode` refuses one of their entries) and are received, the plain
    ones, as `received` says."""
    header = _Header(packed)
    header.kind = kind._value_
    if surcharge is None:  # charged_size weighs the frames alone, as it would
        header.surcharge = _charged_size([packed]) - len(packed)
        header.parsed = None
        return header
    header.surcharge = surcharge
    header.parsed = None if has_data else _parsed(msg, kind, received)
    return header


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


def _wire_dtype(dtype: np.dtype[Any], name: str, error: type[WireError]) -> np.dtype[Any]:
    """The wire's (little-endian) form of `dtype`, which must be a whitelisted type."""
    wire = dtype if dtype in _DTYPE_NAMES else dtype.newbyteorder("<")
    if wire not in _DTYPE_NAMES:
        raise error(Reason.BAD_DTYPE, f"dtype {dtype} is not one of {', '.join(DTYPES)}", var=name)
    return wire
