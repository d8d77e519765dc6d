"""`decode`: frames to a `Message`, validating untrusted input strictly.

Anything the header or frames get wrong raises a `DecodeError` whose `reason` says what and
whose message names the var and field, checked before any array is built (sizes from the header
are checked against the limit first, so a lying header allocates nothing). Decoded arrays are
read-only views over the received frames (copied only when a frame is misaligned for its dtype).

There are three ways to a message, which must give the same one, and refuse the same frames:

- the header frame of a message without data that `encode` made in this process carries its
  parse already (`header._Parsed`), which is taken once the size limits hold;
- `_decode_plain`, one pass over the common message (dense vars whose bytes are all values),
  which returns None (defers) for anything else. What it accepts is read off the same tables
  the strict path checks against: the header's fields (`HEADER_FIELDS`), the entry fields of
  its one var kind (`VAR_FIELDS`), the kinds (`KINDS`) and the dtypes (`DTYPES` less those
  whose values `_VALUE_CHECKS` checks), so it cannot accept a field, kind or dtype that the
  strict path refuses;
- `_decode`, the strict path: the header checked field by field (`_check_envelope`,
  `_check_var`) into `VarSpec`s, the declared sizes against the limit, then each var's frames.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from runtime.execution.tensor import LoDTensor, Phantom, SelectedRows, TensorError
from runtime.network.compression import FLOAT_DTYPES, Codec, Packed, index_dtype, unpack
from runtime.network.transport import Frame
from runtime.network.wire.errors import DecodeError, WireError
from runtime.network.wire.format import (_DTYPE_NAMES, _FRAME_COUNTS, CODECS,
                                         DEFAULT_MAX_HEADER_SIZE, DEFAULT_MAX_MESSAGE_SIZE,
                                         DTYPES, ENTRY_FIELDS, HEADER_FIELDS, ID_RANGE, KINDS,
                                         MAX_DIM, MAX_FRAMES, MAX_NDIM, ROWS_DTYPE, STEP_RANGE,
                                         VAR_FIELDS, VAR_KINDS, WIRE_VERSION, Kind, Message,
                                         Reason, Tensor, VarKind, VarSpec, _is_int, _nbytes,
                                         _product)
from runtime.network.wire.header import _encoded_header

_kind_named, _var_kind_named, _codec_named = KINDS.get, VAR_KINDS.get, CODECS.get
"""The lookups in the format's tables that each message makes. DESIGN: bound once here, as
CPython 3.11 compiles a method call on a name the module imports (`KINDS.get(...)`) as an
attribute load, taking the name for a module's, which builds a new bound method at each call:
a tenth of a small message's decode."""


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


# ---------------------------------------------------------------------------------- strict path


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
    kind = _kind_named(header["kind"]) if isinstance(header["kind"], str) else None
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


def _check_var(entry: Any) -> VarSpec:
    if not isinstance(entry, dict):
        raise DecodeError(Reason.BAD_FIELD, f"a vars entry is a {type(entry).__name__}, not a map")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise DecodeError(Reason.BAD_FIELD, f"a vars entry has no valid name: {name!r}")
    if not ENTRY_FIELDS <= entry.keys():
        missing = ", ".join(sorted(ENTRY_FIELDS.difference(entry)))
        raise DecodeError(Reason.MISSING_FIELD, f"vars entry lacks {missing}", var=name)
    kind = _var_kind_named(entry["kind"]) if isinstance(entry["kind"], str) else None
    if kind is None:
        raise DecodeError(Reason.BAD_FIELD, f"var kind {entry['kind']!r} is unknown", var=name)
    required, allowed = VAR_FIELDS[kind]
    if not entry.keys() <= allowed:
        unknown = sorted(set(entry).difference(allowed), key=repr)
        raise DecodeError(Reason.BAD_FIELD, f"vars entry has unknown fields {unknown}", var=name)
    if required is not ENTRY_FIELDS and not required <= entry.keys():  # a rows var's height
        missing = ", ".join(sorted(required.difference(entry)))
        raise DecodeError(Reason.MISSING_FIELD, f"{kind} var lacks {missing}", var=name)
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
    codec = _codec_named(entry["codec"]) if isinstance(entry["codec"], str) else None
    if codec is None:
        raise DecodeError(Reason.BAD_FIELD, f"codec {entry['codec']!r} is not one of "
                          f"{', '.join(CODECS)}", var=name)
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
    check = _VALUE_CHECKS.get(dtype)
    if check is not None:
        check(array, name)
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


_VALUE_CHECKS: Mapping[np.dtype[Any], Callable[[np.ndarray, str], None]] = {
    DTYPES["bool"]: _check_bools,
}
"""The wire dtypes whose values `_view` checks one by one, and the check: a bool's byte must
be 0 or 1. Any bytes are values of the other dtypes."""


# ------------------------------------------------------------------------------------ fast path

_PLAIN_KIND = VarKind.DENSE
"""The one var kind `_decode_plain` reads: one frame of the values, nothing to check in them."""
_PLAIN_KIND_NAME = _PLAIN_KIND.value
_PLAIN_VAR_FIELDS = VAR_FIELDS[_PLAIN_KIND].required
"""The entry fields of a plain var: those its kind requires, and none it merely allows (a LoD,
a codec)."""
_PLAIN_DTYPES = {name: dtype for name, dtype in DTYPES.items() if dtype not in _VALUE_CHECKS}
"""The dtypes of a plain var: the wire's, less those whose values `_decode` checks."""
assert _FRAME_COUNTS[_PLAIN_KIND] == 1, "a plain var is one frame: _decode_plain counts so"


def _decode_plain(header: dict[str, Any], frames: Sequence[Frame],
                  max_message_size: int) -> Message | None:
    """`_decode` of the common message, read in one pass: the header's own fields valid (any
    further fields are the message's `extra`, as there) and each var a plain one (of
    `_PLAIN_KIND`, with only `_PLAIN_VAR_FIELDS`, of a `_PLAIN_DTYPES` dtype) whose frame has
    exactly its bytes. None for anything else (an error, a phantom, rows, lod, a codec, a
    bool): `_decode` then checks it field by field and names what is wrong. DESIGN: every
    condition is one `_decode` also checks, on the same table (`format.HEADER_FIELDS`,
    `VAR_FIELDS`, `KINDS`, `DTYPES` and `_VALUE_CHECKS`), so the fast path accepts nothing
    `_decode` refuses and builds the same `Message`; it only skips building `VarSpec`s and the
    generic checks' calls, which cost more than the zero-copy arrays for most messages."""
    if not header.keys() >= HEADER_FIELDS:
        return None
    carried_kind, msg_id, step, src, entries = (
        header["kind"], header["id"], header["step"], header["src"], header["vars"])
    kind = _kind_named(carried_kind) if type(carried_kind) is str else None
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
                or entry["kind"] != _PLAIN_KIND_NAME:
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


# ---------------------------------------------------------------------------------------- shared


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
