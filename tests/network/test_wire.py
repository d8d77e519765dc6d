"""Wire protocol: round trips of every tensor kind and dtype, zero-copy frames, and one test per
validation rule showing the `DecodeError` names what is wrong."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from runtime.execution.tensor import LoDTensor, SelectedRows
from runtime.network.wire import (DTYPES, HEADER_FIELDS, MAX_NDIM, DecodeError, EncodeError, Kind,
                                  Message, Phantom, Reason, VarKind, RemoteError, charged_size,
                                  decode, encode, error_reply, raise_for_error)
from runtime.network.wire import _decode, _decode_plain, _unpack_header  # the two decode paths

Frames = list[Any]


def round_trip(value: Any, name: str = "x") -> Any:
    return decode(encode(Message(Kind.SEND, 1, "t0", 0, {name: value}))).vars[name]


def assert_same_array(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def sample_frames(**vars: Any) -> Frames:
    return encode(Message(Kind.SEND, 7, "trainer0", 3, vars or {"w": np.ones((2, 3), np.float32)}))


def tamper(frames: Frames, edit: Callable[[dict[str, Any]], None]) -> Frames:
    header = msgpack.unpackb(frames[0])
    edit(header)
    return [msgpack.packb(header), *frames[1:]]


def decode_error(frames: Frames, **kwargs: Any) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        decode(frames, **kwargs)
    return caught.value


# ------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_dense_round_trip_every_dtype(dtype: str) -> None:
    array = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    got = round_trip(array)
    assert_same_array(got, array)
    assert not got.flags.writeable


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (5, 1, 1, 1)])
def test_zero_d_and_empty_arrays_round_trip(shape: tuple[int, ...]) -> None:
    array = np.full(shape, 2.5, np.float64)
    assert_same_array(round_trip(array), array)


def test_non_contiguous_and_big_endian_arrays_arrive_as_little_endian_values() -> None:
    transposed = np.arange(12, dtype=np.int32).reshape(3, 4).T
    assert_same_array(round_trip(transposed), transposed)
    big = np.arange(5, dtype=">f8")
    got = round_trip(big)
    assert got.dtype == np.dtype("<f8")
    np.testing.assert_array_equal(got, big)


def test_message_fields_round_trip() -> None:
    for kind in Kind:
        extra = {"names": ["w", "b"], "lr": 0.5, "meta": {"k": [1, None]}}
        msg = Message(kind, (1 << 64) - 1, "pserver:1", -1, {}, extra)
        assert decode(encode(msg)) == msg


def test_selected_rows_round_trip_with_repeated_and_no_rows() -> None:
    rows = SelectedRows([4, 0, 4], np.arange(6, dtype=np.float32).reshape(3, 2), height=5)
    got = round_trip(rows)
    assert isinstance(got, SelectedRows) and got.height == 5
    assert_same_array(got.rows, np.array([4, 0, 4], np.int64))
    assert_same_array(got.values, rows.values)
    empty = round_trip(SelectedRows([], np.zeros((0, 3), np.float64), height=9))
    assert empty.rows.shape == (0,) and empty.values.shape == (0, 3) and empty.height == 9


def test_phantom_carries_shape_and_dtype_but_no_frame() -> None:
    frames = sample_frames(p=Phantom((1000, 4096), np.dtype("float16")))
    assert len(frames) == 1
    got = decode(frames).vars["p"]
    assert got == Phantom((1000, 4096), np.dtype("float16"))
    assert got.nbytes == 1000 * 4096 * 2


@pytest.mark.parametrize("phantom", [Phantom((1000, 4096), np.dtype("float16")),
                                     Phantom((3, 2), np.dtype(">f4"), height=7),
                                     Phantom((5, 2), np.dtype("int64"), lod=((0, 2, 5),)),
                                     Phantom((1,) * 40, np.dtype("float32"))],
                         ids=["dense", "rows", "lod", "too deep"])
def test_a_phantom_sent_again_encodes_and_weighs_as_the_first_time(phantom: Phantom) -> None:
    """What a phantom puts on the wire is worked out once per value: an equal phantom, a
    second var and another message get the same header bytes and weight."""
    def frames(value: Phantom, name: str) -> list[Any]:
        msg = Message(Kind.SEND, 7, "t0", 1, {name: value, "b": value}, {"trainer": 0})
        return encode(msg)

    first = frames(phantom, "p")
    again = frames(Phantom(phantom.shape, phantom.dtype, phantom.height, phantom.lod), "p")
    assert bytes(again[0]) == bytes(first[0]) and charged_size(again) == charged_size(first)
    assert charged_size(first) == charged_size([bytes(first[0])])
    renamed = frames(phantom, "q")
    assert _unpack_header(renamed[0])["vars"][0] == {**_unpack_header(first[0])["vars"][0],
                                                     "name": "q"}
    if len(phantom.shape) <= MAX_NDIM:
        got = decode(again).vars
        assert got["p"] == got["b"] == Phantom(phantom.shape, phantom.dtype.newbyteorder("="),
                                               phantom.height, phantom.lod)


def test_lod_tensor_round_trip() -> None:
    tensor = LoDTensor(np.arange(10, dtype=np.int64).reshape(5, 2), [[0, 2, 5]])
    got = round_trip(tensor)
    assert isinstance(got, LoDTensor) and got.lod == [[0, 2, 5]]
    assert_same_array(got.data, tensor.data)


def test_vars_keep_their_order_and_frames_their_layout() -> None:
    frames = sample_frames(
        a=np.zeros(2, np.float32),
        p=Phantom((3,), np.dtype("int8")),
        r=SelectedRows([1], np.ones((1, 4), np.int16), 3),
        b=np.ones((), np.uint8),
    )
    assert [len(bytes(f)) for f in frames[1:]] == [8, 8, 8, 1]
    assert list(decode(frames).vars) == ["a", "p", "r", "b"]


def test_encode_is_zero_copy_for_contiguous_arrays() -> None:
    array = np.arange(1 << 16, dtype=np.float32)
    frame = sample_frames(w=array)[1]
    assert np.shares_memory(np.frombuffer(frame, np.uint8), array)


def test_decode_is_zero_copy_and_read_only() -> None:
    frames = [bytearray(f) for f in sample_frames(w=np.arange(8.0))]
    got = decode(frames).vars["w"]
    assert np.shares_memory(got, np.frombuffer(frames[1], np.uint8))
    with pytest.raises(ValueError):
        got[0] = 1.0


def test_decode_copies_a_misaligned_frame() -> None:
    frames = sample_frames(w=np.arange(8.0))
    shifted = memoryview(bytearray(65))[1:]
    shifted[:] = bytes(frames[1])
    got = decode([frames[0], shifted]).vars["w"]
    assert got.flags.aligned and not got.flags.writeable
    np.testing.assert_array_equal(got, np.arange(8.0))


# ------------------------------------------------------------------------------------------ torch


def test_torch_cpu_tensors_encode_as_their_numpy_values() -> None:
    torch = pytest.importorskip("torch")
    dense = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert_same_array(round_trip(dense), dense.numpy())
    assert_same_array(round_trip(dense.t()), dense.t().numpy())
    assert_same_array(round_trip(torch.tensor([True, False])), np.array([True, False]))
    trained = torch.ones(2, requires_grad=True) * 3
    assert_same_array(round_trip(trained), np.full(2, 3.0, np.float32))
    rows = round_trip(SelectedRows(np.array([2]), np.ones((1, 2)), 4))
    assert rows.values.dtype == np.float64


def test_torch_tensor_off_the_cpu_is_refused_with_a_hint() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(EncodeError, match=r"move it to the CPU") as caught:
        encode(Message(Kind.SEND, 1, "t0", 0, {"w@GRAD": torch.empty(2, device="meta")}))
    assert caught.value.var == "w@GRAD" and caught.value.reason is Reason.UNSUPPORTED_TENSOR


def test_torch_bfloat16_is_not_a_wire_dtype() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(EncodeError, match="bfloat16") as caught:
        encode(Message(Kind.SEND, 1, "t0", 0, {"w": torch.ones(2, dtype=torch.bfloat16)}))
    assert caught.value.reason is Reason.BAD_DTYPE


# ------------------------------------------------------------------------------------- hypothesis

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
wire_arrays = st.sampled_from(list(DTYPES)).flatmap(lambda dtype: hnp.arrays(dtype, shapes))


@given(arrays=st.lists(wire_arrays, max_size=4))
def test_any_wire_arrays_round_trip_bit_exactly(arrays: list[np.ndarray]) -> None:
    msg = Message(Kind.REPLY, 9, "ps0", 2, {f"v{i}": a for i, a in enumerate(arrays)})
    got = decode(encode(msg))
    for array, received in zip(arrays, got.vars.values(), strict=True):
        assert_same_array(received, array)


@given(data=st.data(), height=st.integers(1, 50), dtype=st.sampled_from(list(DTYPES)))
def test_any_selected_rows_round_trip(data: st.DataObject, height: int, dtype: str) -> None:
    rows = data.draw(st.lists(st.integers(0, height - 1), max_size=8))
    values = data.draw(hnp.arrays(dtype, (len(rows), data.draw(st.integers(0, 3)))))
    got = round_trip(SelectedRows(rows, values, height))
    assert got.height == height and got.rows.tolist() == rows
    assert_same_array(got.values, values)


@settings(max_examples=300)
@given(header=st.binary(max_size=64), extra=st.lists(st.binary(max_size=16), max_size=3))
def test_garbage_frames_raise_decode_error_only(header: bytes, extra: list[bytes]) -> None:
    try:
        decode([header, *extra])
    except DecodeError:
        pass


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300)
@given(edits=st.dictionaries(st.sampled_from(sorted(HEADER_FIELDS) + ["x"]), json_like, max_size=3))
def test_tampered_headers_raise_decode_error_only(edits: dict[str, Any]) -> None:
    try:
        decode(tamper(sample_frames(), lambda header: header.update(edits)))
    except DecodeError:
        pass


# ------------------------------------------------------------------------------------- validation


def test_empty_message_has_no_header() -> None:
    assert decode_error([]).reason is Reason.FRAME_COUNT


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc1",
        msgpack.packb([1, 2]),
        msgpack.packb({"v": 1}) + b"\x00",
        msgpack.packb(msgpack.ExtType(3, b"x")),
    ],
)
def test_malformed_header_frame(frame: bytes) -> None:
    error = decode_error([frame])
    assert error.reason is Reason.BAD_HEADER
    assert "header" in str(error)


def test_unknown_version() -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h.update(v=2)))
    assert error.reason is Reason.UNKNOWN_VERSION and "version 2" in str(error)


def test_unknown_kind() -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h.update(kind="push")))
    assert error.reason is Reason.UNKNOWN_KIND and "'push'" in str(error)


@pytest.mark.parametrize("field", sorted(HEADER_FIELDS))
def test_missing_header_field(field: str) -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h.pop(field)))
    assert error.reason is Reason.MISSING_FIELD and field in str(error)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", -1), ("id", None), ("id", "7"), ("id", True),
        ("step", 1.5), ("src", ""), ("src", 3), ("vars", {}),
    ],
)
def test_bad_header_field(field: str, value: Any) -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h.update({field: value})))
    assert error.reason is Reason.BAD_FIELD and repr(field) in str(error)


@pytest.mark.parametrize("field", ["dtype", "shape", "kind"])
def test_var_entry_missing_field(field: str) -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h["vars"][0].pop(field)))
    assert error.reason is Reason.MISSING_FIELD and error.var == "w" and field in str(error)


@pytest.mark.parametrize(
    ("edit", "culprit"),
    [
        ({"kind": "sparse"}, "'sparse'"),
        ({"colour": "red"}, "colour"),
        ({b"colour": "red"}, "b'colour'"),
        ({"height": 4}, "height"),
        ({"lod": [[0, 1]]}, "lod"),
        ({"lod": "x"}, "lod"),
    ],
)
def test_bad_var_entry(edit: dict[str, Any], culprit: str) -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h["vars"][0].update(edit)))
    assert error.reason is Reason.BAD_FIELD and error.var == "w" and culprit in str(error)


def test_rows_var_needs_height() -> None:
    frames = sample_frames(e=SelectedRows([0], np.ones((1, 2)), 3))
    error = decode_error(tamper(frames, lambda h: h["vars"][0].pop("height")))
    assert error.reason is Reason.MISSING_FIELD and error.var == "e" and "height" in str(error)


def test_wrong_frame_count() -> None:
    frames = sample_frames()
    too_many = decode_error([*frames, b"extra"])
    too_few = decode_error(frames[:1])
    assert too_many.reason is too_few.reason is Reason.FRAME_COUNT
    assert "need 2 frames, message has 3" in str(too_many) and "message has 1" in str(too_few)


@pytest.mark.parametrize("dtype", ["complex64", "float128", "object", "<f4", "bfloat16", 4])
def test_dtype_outside_whitelist(dtype: Any) -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h["vars"][0].update(dtype=dtype)))
    assert error.reason is Reason.BAD_DTYPE and error.var == "w" and repr(dtype) in str(error)


@pytest.mark.parametrize("shape", [[2, -3], [1 << 63], [2.0, 3], "6", [1] * 33, [True, 6]])
def test_bad_shape(shape: Any) -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h["vars"][0].update(shape=shape)))
    assert error.reason is Reason.BAD_SHAPE and error.var == "w"


def test_rows_values_need_a_dimension() -> None:
    frames = sample_frames(e=SelectedRows([0], np.ones((1, 2)), 3))
    error = decode_error(tamper(frames, lambda h: h["vars"][0].update(shape=[])))
    assert error.reason is Reason.BAD_SHAPE and error.var == "e"


@pytest.mark.parametrize("shape", [[3, 3], [2, 4], [6, 1, 1, 0]])
def test_shape_times_itemsize_must_match_frame_length(shape: list[int]) -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h["vars"][0].update(shape=shape)))
    assert error.reason is Reason.SIZE_MISMATCH and error.var == "w"
    assert "frame has 24 bytes" in str(error)


def test_rows_frame_length_must_match_row_count() -> None:
    frames = sample_frames(e=SelectedRows([0, 1], np.ones((2, 2)), 3))
    error = decode_error([frames[0], bytes(frames[1])[:8], frames[2]])
    assert error.reason is Reason.SIZE_MISMATCH and error.var == "e"


@pytest.mark.parametrize(("row", "text"), [(5, "row 5 at index 1"), (-1, "row -1 at index 1")])
def test_rows_out_of_range_of_height(row: int, text: str) -> None:
    frames = sample_frames(e=SelectedRows([0, 1], np.ones((2, 2)), 5))
    rows = np.array([0, row], np.int64).tobytes()
    error = decode_error([frames[0], rows, frames[2]])
    assert error.reason is Reason.ROWS_OUT_OF_RANGE and error.var == "e"
    assert text in str(error) and "[0, 5)" in str(error)


def test_oversized_message_is_refused_from_the_header_alone() -> None:
    frames = tamper(sample_frames(), lambda h: h["vars"][0].update(shape=[1 << 20, 1 << 20]))
    error = decode_error(frames)  # the 24-byte frame is never looked at
    assert error.reason is Reason.TOO_LARGE and str(1 << 30) in str(error)


def test_message_size_limit_is_configurable() -> None:
    frames = sample_frames(w=np.zeros(1000, np.float32))
    assert decode(frames, max_message_size=5000).vars["w"].shape == (1000,)
    assert decode_error(frames, max_message_size=4000).reason is Reason.TOO_LARGE
    assert decode_error([b"\x80" * 100], max_message_size=50).reason is Reason.TOO_LARGE


def test_duplicate_var_names() -> None:
    frames = sample_frames(w=np.ones(2), b=np.ones(2))
    error = decode_error(tamper(frames, lambda h: h["vars"][1].update(name="w")))
    assert error.reason is Reason.DUPLICATE_VAR and error.var == "w"


def test_bool_bytes_other_than_zero_or_one() -> None:
    frames = sample_frames(mask=np.zeros(4, bool))
    error = decode_error([frames[0], b"\x00\x01\x07\x00"])
    assert error.reason is Reason.BAD_VALUE and error.var == "mask"
    assert "byte 7 at flat index 2" in str(error)


def test_lod_that_does_not_fit_the_rows() -> None:
    frames = sample_frames(ids=LoDTensor(np.arange(4), [[0, 4]]))
    error = decode_error(tamper(frames, lambda h: h["vars"][0].update(lod=[[0, 3]])))
    assert error.reason is Reason.BAD_FIELD and error.var == "ids"


def test_decode_error_carries_the_request_id() -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h["vars"][0].update(dtype="complex64")))
    assert error.msg_id == 7


# ------------------------------------------------------------------------------------ encode side


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([1.0, 2.0], Reason.UNSUPPORTED_TENSOR),
        (np.float32(1.0), Reason.UNSUPPORTED_TENSOR),
        (np.ones(2, np.complex64), Reason.BAD_DTYPE),
        (np.array(["a"]), Reason.BAD_DTYPE),
        (Phantom((2,), np.dtype("uint64")), Reason.BAD_DTYPE),
    ],
)
def test_encode_refuses_what_the_wire_cannot_carry(value: Any, reason: Reason) -> None:
    with pytest.raises(EncodeError) as caught:
        encode(Message(Kind.SEND, 1, "t0", 0, {"g": value}))
    assert caught.value.reason is reason and caught.value.var == "g"


def test_encode_checks_rows_against_height() -> None:
    rows = SelectedRows([0], np.ones((1, 2)), 3)
    rows.rows = np.array([3])
    with pytest.raises(EncodeError, match=r"row 3 at index 0 is outside \[0, 3\)"):
        encode(Message(Kind.SEND, 1, "t0", 0, {"e": rows}))


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (Message(Kind.SEND, -1, "t0"), Reason.BAD_FIELD),
        (Message(Kind.SEND, 1, ""), Reason.BAD_FIELD),
        (Message(Kind.SEND, 1, "t0", extra={"vars": []}), Reason.RESERVED_FIELD),
        (Message(Kind.SEND, 1, "t0", extra={"when": object()}), Reason.BAD_FIELD),
    ],
)
def test_encode_refuses_bad_envelopes(msg: Message, reason: Reason) -> None:
    with pytest.raises(EncodeError) as caught:
        encode(msg)
    assert caught.value.reason is reason


# ----------------------------------------------------------------------------------- error replies


def test_error_reply_names_the_culprit_and_answers_the_request() -> None:
    error = decode_error(tamper(sample_frames(), lambda h: h["vars"][0].update(dtype="complex64")))
    reply = decode(encode(error_reply("pserver:0", error, step=3)))
    assert reply.kind is Kind.ERROR and reply.id == 7 and reply.step == 3
    with pytest.raises(RemoteError) as caught:
        raise_for_error(reply)
    remote = caught.value
    assert (remote.peer, remote.reason, remote.var) == ("pserver:0", "bad_dtype", "w")
    assert "complex64" in remote.detail


def test_error_reply_for_a_non_wire_error() -> None:
    class UnknownVar(KeyError):
        var = "fc_9.w"

    reply = decode(encode(error_reply("ps1", UnknownVar("not served here"), request_id=12)))
    with pytest.raises(RemoteError, match="UnknownVar") as caught:
        raise_for_error(reply)
    assert reply.id == 12 and caught.value.var == "fc_9.w"


def test_error_reply_to_an_unreadable_request_has_id_zero() -> None:
    reply = error_reply("ps1", decode_error([b"\xc1"]))
    assert reply.id == 0 and reply.extra["error"]["reason"] == "bad_header"


def test_raise_for_error_passes_other_messages_through() -> None:
    msg = Message(Kind.REPLY, 3, "ps0")
    assert raise_for_error(msg) is msg


# -- headers this process encoded ---------------------------------------------------------------
# `encode`'s header frame remembers its charged size and, for a message of phantoms, the message
# it decodes to; these must be exactly what parsing its bytes gives.


def parsed(frames: Frames, **kwargs: Any) -> Message:
    """`decode` of the frames' bytes alone (copies of them: nothing remembered)."""
    return decode([bytes(frame) for frame in frames], **kwargs)


def typed(value: Any) -> Any:
    """`value` with the type of every part, so that 1 == True or [1] == (1,) do not pass."""
    if isinstance(value, Phantom):
        return ("phantom", value.shape, value.dtype.str, value.height, value.lod)
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, value)


def typed_message(msg: Message) -> Any:
    return typed([msg.kind, msg.id, msg.src, msg.step, msg.vars, msg.extra])


WIRE_DTYPES = st.sampled_from([*DTYPES, ">f4", ">i8", "=f8"])
PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=5) | st.binary(max_size=5)
    | st.sampled_from([Kind.GET, VarKind.ROWS]),  # enums come back as plain str
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)


@st.composite
def phantoms(draw: st.DrawFn) -> Phantom:
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
    dtype = np.dtype(draw(WIRE_DTYPES))
    kind = draw(st.sampled_from(["dense", "rows", "lod"]))
    if kind == "rows":
        return Phantom(shape, dtype, height=draw(st.integers(0, 50)))
    if kind == "lod":
        return Phantom(shape, dtype, lod=((0, shape[0]),))
    return Phantom(shape, dtype)


@st.composite
def phantom_messages(draw: st.DrawFn) -> Message:
    names = draw(st.lists(st.text(min_size=1, max_size=6), max_size=3, unique=True))
    keys = st.text(min_size=1, max_size=6).filter(lambda k: k not in HEADER_FIELDS)
    return Message(draw(st.sampled_from(list(Kind))), draw(st.integers(0, 2**64 - 1)),
                   draw(st.text(min_size=1, max_size=8)), draw(st.integers(-(2**63), 2**63 - 1)),
                   {name: draw(phantoms()) for name in names},
                   draw(st.dictionaries(keys, PLAIN, max_size=3)))


@settings(max_examples=300, deadline=None)
@given(phantom_messages())
def test_an_encoded_header_decodes_and_weighs_as_its_bytes_do(msg: Message) -> None:
    frames = encode(msg)
    want = typed_message(parsed(frames))
    assert typed_message(decode(frames)) == want
    assert typed_message(decode([memoryview(frames[0])])) == want  # as the simulator hands it on
    assert charged_size(frames) == charged_size([bytes(f) for f in frames])
    assert charged_size([memoryview(frames[0])]) == charged_size(frames)


def test_an_encoded_header_is_plain_msgpack_bytes() -> None:
    msg = Message(Kind.GET, 5, "t0", 1, {"p": Phantom((2, 3), np.dtype("float32"))},
                  {"names": ["p"]})
    header = encode(msg)[0]
    assert isinstance(header, bytes)
    assert header == msgpack.packb(msgpack.unpackb(header))


def test_each_decode_of_a_header_gets_its_own_maps_and_lists() -> None:
    msg = Message(Kind.GET, 5, "t0", 1, {"p": Phantom((2,), np.dtype("float32"))},
                  {"names": ["p"], "nested": {"a": [1]}})
    frames = encode(msg)
    first = decode(frames)
    first.extra["names"].append("q")
    first.extra["nested"]["a"].append(2)
    first.vars.clear()  # type: ignore[attr-defined]
    again = decode(frames)
    assert again.extra == {"names": ["p"], "nested": {"a": [1]}} == msg.extra
    assert list(again.vars) == ["p"]


def test_a_message_of_is_the_message_its_fields_make_in_slots() -> None:
    made = Message.of(Kind.GET, 5, "t0", 1, extra={"names": ["p"]})
    assert made == Message(Kind.GET, 5, "t0", 1, {}, {"names": ["p"]})
    assert not hasattr(made, "__dict__") and made.vars is not Message.of(Kind.GET, 5, "t0").vars


def test_a_decode_gets_maps_of_its_own_when_the_sent_extra_is_held_as_it_is() -> None:
    extra = {"trainer": 1, "names": ["p"]}
    frames = encode(Message(Kind.GET, 5, "t0", 1, {}, extra))
    first, again = decode(frames), decode(frames)
    assert first.extra == again.extra == extra
    assert first.extra is not extra and first.extra["names"] is not extra["names"]
    assert first.vars == {} and first.vars is not again.vars


def test_an_encoded_header_obeys_the_size_limit() -> None:
    frames = encode(Message(Kind.SEND, 1, "t0", 0, {"p": Phantom((4,), np.dtype("int8"))}))
    assert decode_error(frames, max_message_size=10).reason is Reason.TOO_LARGE


def test_a_phantom_past_the_limits_fails_to_decode_and_is_not_charged_its_data() -> None:
    too_deep = Phantom((1,) * 40, np.dtype("float32"))
    frames = encode(Message(Kind.SEND, 1, "t0", 0, {"p": too_deep}))
    assert decode_error(frames).reason is Reason.BAD_SHAPE
    assert charged_size(frames) == len(frames[0]) == charged_size([bytes(frames[0])])


def test_a_header_with_keys_msgpack_refuses_to_decode_still_fails() -> None:
    frames = encode(Message(Kind.SEND, 1, "t0", 0, extra={"x": {1: "one"}}))
    assert decode_error(frames).reason is Reason.BAD_HEADER


@pytest.mark.parametrize("array", [
    np.array(3, np.float32), np.zeros((0, 4)), np.arange(12, dtype=np.int16).reshape(3, 4),
    np.arange(5, dtype=">i4"), np.ones((2, 6), np.float16)[:, ::2], np.array([True, False]),
])
@pytest.mark.parametrize("extra", [{}, {"server_step": 3, "names": ["x"], "sync": True}])
@pytest.mark.parametrize("offset", [0, 1])
def test_the_one_pass_decode_gives_what_the_checked_one_does(
        array: np.ndarray, extra: dict[str, Any], offset: int) -> None:
    """Plain dense messages take `_decode_plain`; others (a bool here) fall back to `_decode`:
    either way the same kinds, fields and read-only arrays, also with further header fields
    and with frames at unaligned addresses (libzmq packs small frames into its receive
    buffer), which both copy into aligned arrays."""
    msg = Message(Kind.GET, 5, "trainer-0", -3, {"x": array, "y": np.arange(3.0)}, extra)
    frames = [memoryview(b"-" * offset + bytes(frame))[offset:] for frame in encode(msg)]
    header = _unpack_header(frames[0])
    fast, checked = _decode_plain(header, frames, 1 << 30), _decode(header, frames, 1 << 30)
    assert (fast is None) == (array.dtype == np.bool_)
    for decoded in [checked] if fast is None else [fast, checked]:
        assert (decoded.kind, decoded.id, decoded.src, decoded.step, decoded.extra) == \
            (Kind.GET, 5, "trainer-0", -3, extra)
        for name, value in msg.vars.items():
            got = decoded.vars[name]
            assert got.shape == value.shape and not got.flags.writeable and got.flags.aligned
            np.testing.assert_array_equal(got, value)
