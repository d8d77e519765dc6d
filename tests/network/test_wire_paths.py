"""The three ways `decode` reads a message agree: the header `encode` made in this process
(`_Header.parsed`, for messages without data frames), the one-pass path for plain messages
(`_decode_plain`) and the strict path (`_decode`).

For generated messages (dense arrays of every wire dtype and byte order, contiguous or not,
LoD tensors, rows, phantoms of each kind, packed gradients and packed phantoms, every message
kind, ids and steps across their ranges, further header fields) each path that takes the
message gives the same `Message` as the strict path, which gives what was sent; the fast path
takes exactly the plain messages, the pre-parsed header exactly those without data frames.
For headers and frames mutated field by field, and for phantoms whose shapes, heights or codec
fields the strict path refuses, no other path accepts what the strict path refuses (the fast
path may defer to it), and a message weighs the same read off its frames or off the header
`encode` made.
"""

from __future__ import annotations

import copy
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from runtime.execution.tensor import LoDTensor, Phantom, SelectedRows
from runtime.network.compression import Codec, Packed, pack, unpack
from runtime.network.wire import (DEFAULT_MAX_HEADER_SIZE, DTYPES, ENTRY_FIELDS, HEADER_FIELDS,
                                  MAX_DIM, MAX_NDIM, VAR_FIELDS, DecodeError, Kind, Message,
                                  charged_size, decode, encode)
from runtime.network.wire.decoding import (_check_envelope_size, _decode, _decode_plain,
                                           _unpack_header)
from runtime.network.wire.header import _Header

LIMIT = 1 << 30

# ------------------------------------------------------------------------------------ describing


def described(value: Any) -> Any:
    """`value` as plain, typed data that compares equal only to the same decoded value: arrays
    by dtype (with byte order), shape, bytes and flags; maps in their order; scalars with
    their type (True is not 1)."""
    if isinstance(value, Message):
        return ("message", type(value.kind), value.kind, value.id, value.src, value.step,
                type(value.vars), described(value.vars), type(value.extra),
                described(value.extra))
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes(), value.flags.writeable,
                value.flags.aligned)
    if isinstance(value, LoDTensor):
        return ("lod", described(value.data), value.lod)
    if isinstance(value, SelectedRows):
        return ("rows", described(value.rows), described(value.values), value.height)
    if isinstance(value, Phantom):
        return ("phantom", value.shape, value.dtype.str, value.height, value.lod)
    if isinstance(value, dict):
        return ("map", [(key, described(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [described(item) for item in value])
    return (type(value).__name__, value)


def little(array: np.ndarray) -> np.ndarray:
    """`array` as the wire carries it: little-endian (one-byte dtypes as they are)."""
    return array.astype(array.dtype.newbyteorder("<"))


def sent(value: Any) -> Any:
    """What the receiver should get for a var sent as `value`, as `received` describes it."""
    if isinstance(value, np.ndarray):
        return ("array", little(value))
    if isinstance(value, LoDTensor):
        return ("lod", little(value.data), value.lod)
    if isinstance(value, SelectedRows):
        return ("rows", value.rows, little(value.values), value.height)
    if isinstance(value, Packed):
        if value.phantom:
            return ("phantom", Phantom(value.shape, value.dtype.newbyteorder("=")))
        return ("array", unpack(value))
    return ("phantom", Phantom(value.shape, value.dtype.newbyteorder("="), value.height,
                               value.lod))


def received(value: Any) -> Any:
    """A decoded var in the form `sent` gives: values without their flags."""
    if isinstance(value, np.ndarray):
        return ("array", value)
    if isinstance(value, LoDTensor):
        return ("lod", value.data, value.lod)
    if isinstance(value, SelectedRows):
        return ("rows", value.rows, value.values, value.height)
    return ("phantom", value)


def same_values(got: Any, want: Any) -> bool:
    if got[0] != want[0] or len(got) != len(want):
        return False
    for a, b in zip(got[1:], want[1:], strict=True):
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            a, b = np.asarray(a), np.asarray(b)
            if a.dtype.str != b.dtype.str or a.shape != b.shape or a.tobytes() != b.tobytes():
                return False
        elif isinstance(a, Phantom):
            if (a.shape, a.dtype.str, a.height, a.lod) != (b.shape, b.dtype.str, b.height, b.lod):
                return False
        elif a != b:
            return False
    return True


def unpacked(value: Any) -> Any:
    """Header data as msgpack gives it back: tuples as lists."""
    if isinstance(value, (list, tuple)):
        return [unpacked(item) for item in value]
    if isinstance(value, dict):
        return {key: unpacked(item) for key, item in value.items()}
    return value


# ------------------------------------------------------------------------------------ generating

dtypes = st.sampled_from(sorted(DTYPES)).flatmap(
    lambda name: st.sampled_from([np.dtype(name), np.dtype(name).newbyteorder(">")]))
small_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def dense_arrays(draw: st.DrawFn, min_dims: int = 0) -> np.ndarray:
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=0, max_side=4))
    array = draw(hnp.arrays(draw(dtypes), shape))
    return array.T if draw(st.booleans()) else array  # a transposed one is not C-contiguous


@st.composite
def lods(draw: st.DrawFn, rows: int) -> list[list[int]]:
    """One or two LoD levels over `rows` rows."""
    cuts = sorted(draw(st.lists(st.integers(0, rows), max_size=3)))
    inner = [0, *cuts, rows]
    if draw(st.booleans()):
        return [inner]
    sequences = len(inner) - 1
    outer = sorted(draw(st.lists(st.integers(0, sequences), max_size=2)))
    return [[0, *outer, sequences], inner]


@st.composite
def lod_tensors(draw: st.DrawFn) -> LoDTensor:
    array = draw(dense_arrays(min_dims=1))
    return LoDTensor(array, draw(lods(array.shape[0])))


@st.composite
def selected_rows(draw: st.DrawFn) -> SelectedRows:
    height = draw(st.integers(1, 20))
    rows = draw(st.lists(st.integers(0, height - 1), max_size=4))
    rest = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))
    values = draw(hnp.arrays(draw(dtypes), (len(rows), *rest)))
    return SelectedRows(np.array(rows, np.int64), values, height)


dims = st.integers(0, 6) | st.sampled_from([1 << 20, 1 << 40])


def span(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    """The bytes the nonzero dimensions of `shape` multiply to."""
    result = dtype.itemsize
    for dim in shape:
        result *= dim or 1
    return result


@st.composite
def phantoms(draw: st.DrawFn) -> Phantom:
    dtype = draw(dtypes)
    shape = tuple(draw(st.lists(dims, min_size=0, max_size=4)))
    if span(shape, dtype) > MAX_DIM:  # past what decode takes: odd_phantoms has those
        shape = tuple(min(dim, 6) for dim in shape)
    form = draw(st.sampled_from(["dense", "rows", "lod"]) if shape else st.just("dense"))
    if form == "rows":
        return Phantom(shape, dtype, draw(st.integers(0, MAX_DIM)))
    if form == "lod" and shape[0] <= 6:
        return Phantom(shape, dtype, lod=tuple(map(tuple, draw(lods(shape[0])))))
    return Phantom(shape, dtype)


float_arrays = st.sampled_from(["float32", "float64"]).flatmap(
    lambda dtype: hnp.arrays(dtype, small_shapes, elements=st.floats(-1e3, 1e3, width=32)))


@st.composite
def packed(draw: st.DrawFn) -> Packed:
    codec = draw(st.sampled_from(list(Codec)))
    ratio = draw(st.floats(0.01, 1.0))
    if draw(st.booleans()):
        array = draw(float_arrays)
        return pack(codec, Phantom(array.shape, array.dtype), ratio)
    return pack(codec, draw(float_arrays), ratio)


values = st.one_of(dense_arrays(), lod_tensors(), selected_rows(), phantoms(), packed())
names = st.text(min_size=1, max_size=6)
scalars = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1)
           | st.floats(allow_nan=False) | st.text(max_size=5) | st.binary(max_size=4))
header_data = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)
extras = st.dictionaries(st.text(max_size=6).filter(lambda key: key not in HEADER_FIELDS),
                         header_data, max_size=3)


@st.composite
def messages(draw: st.DrawFn, var_values: st.SearchStrategy[Any] = values,
             min_vars: int = 0) -> Message:
    kind = draw(st.sampled_from(list(Kind)))
    return Message(
        kind.value if draw(st.booleans()) else kind,  # encode takes a kind's name too
        draw(st.integers(0, (1 << 64) - 1)),
        draw(st.text(min_size=1, max_size=8)),
        draw(st.integers(-(1 << 63), (1 << 63) - 1)),
        draw(st.dictionaries(names, var_values, min_size=min_vars, max_size=4)),
        draw(extras))


def is_plain(msg: Message) -> bool:
    """Whether the fast path should take `msg`: dense arrays only, none of them bool."""
    return all(type(value) is np.ndarray and value.dtype != np.bool_
               for value in msg.vars.values())


def envelope_holds(frames: list[Any], limit: int) -> bool:
    """Whether `frames` pass the checks `decode` makes before either path reads them."""
    try:
        _check_envelope_size(frames, limit, DEFAULT_MAX_HEADER_SIZE)
    except DecodeError:
        return False
    return True


def strict(frames: list[Any], limit: int = LIMIT) -> Any:
    """What the strict path makes of `frames` (`decode`'s checks, then `_decode`): the decoded
    message, described, or "refused" (`decode` turns whatever `_decode` raises into a
    `DecodeError`)."""
    if not envelope_holds(frames, limit):
        return "refused"
    try:
        return described(_decode(_unpack_header(frames[0]), frames, limit))
    except Exception:
        return "refused"


def outcome(frames: list[Any], limit: int = LIMIT) -> Any:
    try:
        return described(decode(frames, limit))
    except DecodeError:
        return "refused"


# ------------------------------------------------------------------------------------ agreement


@settings(max_examples=300)
@given(msg=messages(), offset=st.sampled_from([0, 1]))
def test_every_path_that_takes_a_message_decodes_what_the_strict_path_does(
        msg: Message, offset: int) -> None:
    frames = encode(msg)
    # as libzmq may deliver them: views, at addresses that misalign the dtype (offset 1)
    arrived = [memoryview(b"-" * offset + bytes(frame))[offset:] for frame in frames]
    header = _unpack_header(arrived[0])
    checked = _decode(header, arrived, LIMIT)
    want = described(checked)

    fast = _decode_plain(header, arrived, LIMIT)
    assert (fast is not None) == is_plain(msg), "the fast path takes exactly the plain messages"
    if fast is not None:
        assert described(fast) == want

    head = frames[0]
    assert type(head) is _Header
    assert (head.parsed is not None) == (len(frames) == 1), \
        "a header without data frames carries its parse"
    if head.parsed is not None:
        assert described(head.parsed.message()) == want
        assert described(head.parsed.message()) == want  # each decode gets maps of its own

    assert outcome(frames) == want  # the pre-parsed header or the frames, as decode picks
    assert outcome(arrived) == want
    assert charged_size(frames) == charged_size([bytes(frame) for frame in frames])

    # and what they agree on is what was sent
    kind = msg.kind if isinstance(msg.kind, Kind) else Kind(msg.kind)
    assert (checked.kind, checked.id, checked.src, checked.step) == \
        (kind, msg.id, msg.src, msg.step)
    assert type(checked.kind) is Kind
    assert described(checked.extra) == described(unpacked(msg.extra))
    assert list(checked.vars) == list(msg.vars)
    for name, value in msg.vars.items():
        assert same_values(received(checked.vars[name]), sent(value)), name


@settings(max_examples=100)
@given(msg=messages(dense_arrays()))
def test_decoded_arrays_are_read_only_and_aligned_on_every_path(msg: Message) -> None:
    frames = [memoryview(b"-" + bytes(frame))[1:] for frame in encode(msg)]
    header = _unpack_header(frames[0])
    for decoded in (_decode(header, frames, LIMIT), _decode_plain(header, frames, LIMIT)):
        if decoded is not None:
            for array in decoded.vars.values():
                assert not array.flags.writeable and array.flags.aligned


# ------------------------------------------------------------------------------------- refusals

HEADER_NEAR_MISSES: dict[str, list[Any]] = {
    "v": [0, 2, True, 1.0, "1", None, [1]],
    "kind": ["", "SEND", "sendx", "dense", 1, None, True],
    "id": [-1, 0, (1 << 64) - 1, True, False, 1.0, "1", None],
    "step": [-(1 << 63), (1 << 63) - 1, 1 << 63, (1 << 64) - 1, True, 1.5, "0", None],
    "src": ["", 1, None, b"t", True, ["t"]],
    "vars": [None, {}, "x", [1], [[]], [{}]],
    "x": [1, None, [1, 2], {"a": [b"b"]}],
}
"""Values close to what each header field must hold, or just past it."""
ENTRY_NEAR_MISSES: dict[str, list[Any]] = {
    "name": ["", 1, None, b"x", True],
    "dtype": ["bool", "float32", "int64", "float16", "<f4", "float128", "", 1, None],
    "shape": [[], [0], [1], [2], [-1], [1.0], [True], [MAX_DIM + 1], [MAX_DIM, 0, MAX_DIM],
              [1] * (MAX_NDIM + 1), [0] * (MAX_NDIM + 1), "x", None],
    "kind": ["rows", "phantom", "dense", "DENSE", "", 1, None],
    "height": [0, 1, 2, -1, MAX_DIM, MAX_DIM + 1, True, 1.0, None],
    "lod": [[], [[0]], [[0, 1]], [[0, 2]], [[0, 1.0]], [[True]], "x", None],
    "codec": ["fp16", "int8", "topk", "zip", 1, None],
    "nnz": [0, 1, 2, -1, True, None],
    "bogus": [1],
}
"""The same for the fields of a `vars` entry (every field a kind allows, and one none does)."""
assert set(ENTRY_NEAR_MISSES) >= set().union(*(fields.allowed for fields in VAR_FIELDS.values()))


def near_misses(table: dict[str, list[Any]], field: str) -> st.SearchStrategy[Any]:
    """A near miss of `field`, or any header data; a copy, which a later mutation may change."""
    return st.sampled_from(table[field]).map(copy.deepcopy) | header_data


@st.composite
def mutated(draw: st.DrawFn, frames: list[bytes]) -> list[bytes]:
    """`frames` with one to three things changed: a header field dropped or set to an odd
    value; a vars entry's field dropped, set or added, or its name made another's; an entry
    doubled, dropped or replaced; a data frame cut, grown, dropped, doubled or given a byte
    that is no bool."""
    header = msgpack.unpackb(frames[0], raw=False)
    data = list(frames[1:])
    for _ in range(draw(st.integers(1, 3))):
        entries = header.get("vars")
        entry = draw(st.sampled_from(entries)) if type(entries) is list and entries else None
        what = draw(st.sampled_from(["drop", "set", "entry drop", "entry set", "entry rename",
                                     "entry double", "entry drop whole", "entry odd",
                                     "frame resize", "frame drop", "frame double",
                                     "frame poke"]))
        if what == "drop":
            header.pop(draw(st.sampled_from(sorted(HEADER_FIELDS))), None)
        elif what == "set":
            field = draw(st.sampled_from(sorted(HEADER_NEAR_MISSES)))
            header[field] = draw(near_misses(HEADER_NEAR_MISSES, field))
        elif what.startswith("entry") and entry is not None:
            index = entries.index(entry)
            if what == "entry drop" and type(entry) is dict and entry:
                entry.pop(draw(st.sampled_from(sorted(entry))))
            elif what == "entry set" and type(entry) is dict:
                field = draw(st.sampled_from(sorted(ENTRY_NEAR_MISSES)))
                entry[field] = draw(near_misses(ENTRY_NEAR_MISSES, field))
            elif what == "entry rename" and type(entry) is dict:
                entry["name"] = draw(st.sampled_from(
                    [other.get("name") for other in entries if type(other) is dict]))
            elif what == "entry double":
                entries.insert(index, msgpack.unpackb(msgpack.packb(entry), raw=False))
            elif what == "entry drop whole":
                entries.pop(index)
            elif what == "entry odd":
                entries[index] = draw(header_data)
        elif what.startswith("frame") and data:
            index = draw(st.integers(0, len(data) - 1))
            if what == "frame resize":
                cut = draw(st.integers(-8, 8))
                data[index] = data[index][:cut] if cut < 0 else data[index] + b"\x01" * cut
            elif what == "frame drop":
                data.pop(index)
            elif what == "frame double":
                data.insert(index, data[index])
            elif data[index]:
                at = draw(st.integers(0, len(data[index]) - 1))
                data[index] = data[index][:at] + bytes([draw(st.sampled_from([2, 255]))]) \
                    + data[index][at + 1:]
    return [msgpack.packb(header, use_bin_type=True), *data]


def assert_no_path_accepts_more(frames: list[bytes], limit: int = LIMIT) -> Any:
    """That the fast path, taken as `decode` takes it (after its envelope checks), refuses or
    defers whatever the strict path refuses, and otherwise decodes the same message; and that
    `decode` does what the strict path does. The strict path's outcome."""
    want = strict(frames, limit)
    if envelope_holds(frames, limit):
        try:
            fast = _decode_plain(_unpack_header(frames[0]), frames, limit)
        except DecodeError:  # what it raises is a refusal the strict path makes too
            assert want == "refused"
        else:
            if fast is not None:
                assert want != "refused", "the fast path accepted what the strict path refuses"
                assert described(fast) == want
    assert outcome(frames, limit) == want
    return want


def edited(msg: Message, edit: Any) -> list[bytes]:
    """`msg`'s frames with `edit` applied to its header (as msgpack gives it back)."""
    frames = [bytes(frame) for frame in encode(msg)]
    header = msgpack.unpackb(frames[0], raw=False)
    edit(header)
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


def header_edits() -> list[Any]:
    """Each header field dropped or set to each of its near misses, and each field of a vars
    entry (every one a kind allows, and one none does) likewise."""
    def drop(field: str) -> Any:
        return lambda header: header.pop(field)

    def put(field: str, value: Any) -> Any:
        return lambda header: header.__setitem__(field, copy.deepcopy(value))

    def drop_in_entry(field: str) -> Any:
        return lambda header: header["vars"][-1].pop(field, None)

    def put_in_entry(field: str, value: Any) -> Any:
        return lambda header: header["vars"][-1].__setitem__(field, copy.deepcopy(value))

    return ([pytest.param(drop(field), id=f"drop {field}") for field in sorted(HEADER_FIELDS)]
            + [pytest.param(put(field, value), id=f"{field}={value!r}"[:40])
               for field, near in HEADER_NEAR_MISSES.items() for value in near]
            + [pytest.param(drop_in_entry(field), id=f"drop vars[-1].{field}")
               for field in sorted(ENTRY_NEAR_MISSES)]
            + [pytest.param(put_in_entry(field, value), id=f"vars[-1].{field}={value!r}"[:40])
               for field, near in ENTRY_NEAR_MISSES.items() for value in near])


@pytest.mark.parametrize("edit", header_edits())
@settings(max_examples=15)
@given(msg=messages(dense_arrays(), min_vars=1))
def test_no_path_accepts_a_header_field_the_strict_path_refuses(msg: Message, edit: Any) -> None:
    assert_no_path_accepts_more(edited(msg, edit))


@settings(max_examples=100)
@given(msg=messages(dense_arrays(), min_vars=2), data=st.data())
def test_no_path_accepts_a_name_twice(msg: Message, data: st.DataObject) -> None:
    copy, to = data.draw(st.permutations(range(len(msg.vars))))[:2]

    def rename(header: dict[str, Any]) -> None:
        header["vars"][to]["name"] = header["vars"][copy]["name"]

    assert assert_no_path_accepts_more(edited(msg, rename)) == "refused"


@settings(max_examples=100)
@given(msg=messages(dense_arrays()), flags=hnp.arrays(np.bool_, st.integers(1, 9)), data=st.data())
def test_no_path_accepts_a_bool_byte_other_than_0_or_1(
        msg: Message, flags: np.ndarray, data: st.DataObject) -> None:
    frames = [bytes(frame) for frame in encode(Message(
        msg.kind, msg.id, msg.src, msg.step, {**msg.vars, "flags": flags}, msg.extra))]
    at = data.draw(st.integers(0, flags.size - 1))
    frames[-1] = frames[-1][:at] + bytes([data.draw(st.integers(2, 255))]) + frames[-1][at + 1:]
    assert assert_no_path_accepts_more(frames) == "refused"


@settings(max_examples=600)
@given(msg=messages(dense_arrays() | values), data=st.data())
def test_no_path_accepts_a_mutated_message_the_strict_path_refuses(
        msg: Message, data: st.DataObject) -> None:
    frames = data.draw(mutated([bytes(frame) for frame in encode(msg)]))
    total = sum(map(len, frames))
    assert_no_path_accepts_more(frames, data.draw(st.just(LIMIT) | st.integers(0, 2 * total + 1)))


@settings(max_examples=300)
@given(extra_field=st.text(max_size=6).filter(lambda key: key not in HEADER_FIELDS),
       value=header_data, msg=messages(dense_arrays()))
def test_the_fast_path_keeps_a_plain_message_with_further_fields(
        extra_field: str, value: Any, msg: Message) -> None:
    """The refusals test is not vacuous: a change that keeps a message plain keeps it on the
    fast path."""
    header = msgpack.unpackb(bytes(encode(msg)[0]), raw=False)
    header[extra_field] = value
    frames = [msgpack.packb(header, use_bin_type=True), *map(bytes, encode(msg)[1:])]
    fast = _decode_plain(_unpack_header(frames[0]), frames, LIMIT)
    assert (fast is not None) == is_plain(msg)
    if fast is not None:
        assert described(fast) == strict(frames)


big_dims = st.integers(0, 4) | st.sampled_from([1 << 31, 1 << 61, MAX_DIM, MAX_DIM + 1,
                                                 (1 << 64) - 1])


@st.composite
def odd_phantoms(draw: st.DrawFn) -> Phantom | Packed:
    """Phantoms `encode` takes whose entries the strict path may refuse: dimensions or spans
    past `MAX_DIM`, more than `MAX_NDIM` dimensions, heights past `MAX_DIM`, codecs on
    dtypes they do not pack, top-k counts missing, misplaced or out of range."""
    dtype = np.dtype(draw(st.sampled_from(sorted(DTYPES))))
    ndim = draw(st.sampled_from([0, 1, 2, 3, MAX_NDIM, MAX_NDIM + 1]))
    shape = tuple(draw(st.lists(big_dims, min_size=ndim, max_size=ndim)))
    if draw(st.booleans()):
        codec = draw(st.sampled_from(list(Codec)))
        nnz = draw(st.none() | st.integers(-1, 8) | st.sampled_from([MAX_DIM, (1 << 64) - 1]))
        return Packed(codec, shape, dtype, (), nnz, phantom=True)
    height = draw(st.none() | big_dims) if shape else None
    return Phantom(shape, dtype, height)


@settings(max_examples=400)
@given(value=odd_phantoms(), others=st.dictionaries(names, phantoms(), max_size=2))
def test_the_pre_parsed_header_accepts_nothing_the_strict_path_refuses(
        value: Phantom | Packed, others: dict[str, Phantom]) -> None:
    msg = Message(Kind.SEND, 3, "trainer:0", 1, {**others, "odd": value})
    frames = encode(msg)
    raw = [bytes(frame) for frame in frames]
    want = strict(raw)
    assert outcome(frames) == want
    assert (frames[0].parsed is not None) == (want != "refused")
    assert charged_size(frames) == charged_size(raw)


def test_the_table_names_every_field_an_entry_may_have() -> None:
    """The var kinds' fields in the table are those `encode` writes: the entry fields every
    kind has, a rows var's height, and the optional ones each kind allows."""
    assert all(fields.required >= ENTRY_FIELDS and fields.allowed >= fields.required
               for fields in VAR_FIELDS.values())
    lod = encode(Message(Kind.SEND, 1, "t", 0, {"x": LoDTensor(np.zeros(2), [[0, 2]])}))
    rows = encode(Message(Kind.SEND, 1, "t", 0, {"x": SelectedRows([0], np.zeros((1, 2)), 3)}))
    topk = encode(Message(Kind.SEND, 1, "t", 0, {"x": pack(Codec.TOPK, np.ones(4), 0.5)}))
    for frames in (lod, rows, topk):
        (entry,) = _unpack_header(frames[0])["vars"]
        fields = VAR_FIELDS[entry["kind"]]
        assert fields.required <= entry.keys() <= fields.allowed
