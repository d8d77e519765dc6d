"""Gradient compression: the codecs' error bounds, top-k's choice, error feedback's books, the
wire's packed vars (exact bytes, strict decoding), the transpiler's option (none changes
nothing), and jobs that train compressed in the simulator and under `runtime up`."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from runtime import cli
from runtime.config.metrics import read_metrics
from runtime.config.scenario import ScenarioError, parse_scenario
from runtime.execution.tensor import Phantom, SelectedRows
from runtime.network import wire
from runtime.network.compression import (Codec, ErrorFeedback, Packed, index_dtype, pack,
                                         topk_count, unpack)
from runtime.network.wire import DecodeError, Kind, Message, Reason
from sim.report import collect
from sim.simulate import simulate
from transpiler.distribute.config import DistributeTranspilerConfig
from transpiler.distribute.from_spec import config_from_spec

from distribute_helpers import PS1, PS2, basic, lookup_model, transpile

RNG = np.random.default_rng(20261204)


def _grad(shape: tuple[int, ...] = (300, 70), dtype: str = "float32") -> np.ndarray:
    return (RNG.standard_normal(shape) * RNG.uniform(0.01, 10.0)).astype(dtype)


# -- the codecs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fp16_round_trip_is_within_half_an_ulp_of_float16(dtype: str) -> None:
    x = _grad(dtype=dtype)
    back = unpack(pack(Codec.FP16, x))
    assert back.dtype == x.dtype and back.shape == x.shape
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -11 + 2.0 ** -25)  # subnormals: absolute


def test_fp16_clips_to_its_finite_range_and_error_feedback_carries_the_rest() -> None:
    x = np.array([1e6, -7e4, 3.0], np.float32)
    assert unpack(pack(Codec.FP16, x)).tolist() == [65504.0, -65504.0, 3.0]
    feedback = ErrorFeedback()
    feedback.compress("g", x, Codec.FP16, 1.0)
    assert feedback.residuals["g"].tolist() == [1e6 - 65504.0, -7e4 + 65504.0, 0.0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_int8_round_trip_is_within_half_a_step_of_its_scale(dtype: str) -> None:
    x = _grad(dtype=dtype)
    packed = pack(Codec.INT8, x)
    scale, q = packed.frames
    assert scale.dtype == x.dtype and scale[0] == np.abs(x).max() / 127
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    back = unpack(packed)
    assert back.dtype == x.dtype
    assert np.abs(back - x).max() <= scale[0] / 2 * (1 + 1e-6)


def test_int8_of_zeros_is_zeros_with_scale_zero() -> None:
    packed = pack(Codec.INT8, np.zeros((4, 3), np.float32))
    assert packed.frames[0].tolist() == [0.0] and not packed.frames[1].any()
    assert not unpack(packed).any()


@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.3, 1.0])
def test_topk_keeps_the_k_largest_magnitudes(ratio: float) -> None:
    x = _grad()
    packed = pack(Codec.TOPK, x, ratio)
    k = math.ceil(ratio * x.size)
    indices, values = packed.frames
    assert packed.nnz == k == len(indices) == len(values)
    assert indices.dtype == np.int32 and np.all(np.diff(indices) > 0)
    flat = x.reshape(-1)
    assert np.array_equal(values, flat[indices])
    threshold = np.sort(np.abs(flat))[-k]
    assert np.abs(values).min() == threshold
    assert np.count_nonzero(np.abs(flat) > threshold) < k  # nothing larger was left out
    back = unpack(packed)
    assert np.count_nonzero(back) == k and np.array_equal(back.reshape(-1)[indices], values)


def test_topk_counts_and_index_width() -> None:
    assert [topk_count(n, 0.01) for n in (0, 1, 99, 100, 101, 10_000)] == [0, 1, 1, 1, 2, 100]
    assert topk_count(7, 1.0) == 7
    assert index_dtype(2 ** 31 - 1) == np.int32 and index_dtype(2 ** 31) == np.int64


@pytest.mark.parametrize("codec,ratio", [(Codec.FP16, 1.0), (Codec.INT8, 1.0),
                                         (Codec.TOPK, 0.01), (Codec.TOPK, 0.2)])
def test_error_feedback_sends_every_gradient_in_the_end(codec: Codec, ratio: float) -> None:
    """Over the steps, what was sent plus what is left equals what came in, up to the float
    rounding of the sums (float64 here, so the bound is tight)."""
    feedback = ErrorFeedback()
    grads = [_grad((40, 25), "float64") for _ in range(30)]
    sent = np.zeros((40, 25))
    for g in grads:
        packed = feedback.compress("w@GRAD", g, codec, ratio)
        assert isinstance(packed, Packed) and packed.codec is codec
        sent += unpack(packed)
    total = np.sum(grads, axis=0)
    np.testing.assert_allclose(sent + feedback.residuals["w@GRAD"], total, rtol=0, atol=1e-9)
    if codec is Codec.TOPK:  # the residual holds exactly what was never sent
        assert np.count_nonzero(feedback.residuals["w@GRAD"]) <= 40 * 25 - topk_count(1000, ratio)


def test_error_feedback_leaves_what_no_codec_packs_alone() -> None:
    feedback = ErrorFeedback()
    rows = SelectedRows(np.array([1, 3]), np.ones((2, 4), np.float32), 5)
    counter = np.array([1], np.int64)
    assert feedback.compress("emb@GRAD", rows, Codec.TOPK, 0.1) is rows
    assert feedback.compress("@LR_DECAY_COUNTER@", counter, Codec.INT8, 1.0) is counter
    phantom = feedback.compress("w@GRAD", Phantom((100, 10), np.float32), Codec.TOPK, 0.05)
    assert isinstance(phantom, Packed) and phantom.phantom and phantom.nnz == 50
    assert phantom.nbytes == 50 * (4 + 4) and feedback.residuals == {}


# -- the wire ---------------------------------------------------------------------------------------

def _frames(value: Any) -> list[Any]:
    return wire.encode(Message(Kind.SEND, 7, "trainer:0", 2, {"w@GRAD": value},
                               {"trainer": 0}))


def _size(frames: list[Any]) -> int:
    return sum(memoryview(f).nbytes for f in frames)


@pytest.mark.parametrize("codec,ratio,data_bytes", [
    (Codec.FP16, 1.0, 2 * 21000), (Codec.INT8, 1.0, 4 + 21000),
    (Codec.TOPK, 0.01, 210 * 8), (Codec.TOPK, 1.0, 21000 * 8)])
def test_a_packed_gradient_crosses_the_wire_as_its_frames_and_decodes_dense(
        codec: Codec, ratio: float, data_bytes: int) -> None:
    x = _grad()
    packed = pack(codec, x, ratio)
    frames = _frames(packed)
    assert _size(frames[1:]) == data_bytes == packed.nbytes
    header = msgpack.unpackb(frames[0])["vars"][0]
    assert header["kind"] == "dense" and header["codec"] == codec.value
    assert header.get("nnz") == packed.nnz and header["shape"] == [300, 70]
    received = wire.decode([bytes(f) for f in frames]).vars["w@GRAD"]
    assert type(received) is np.ndarray and received.dtype == np.float32
    assert np.array_equal(received, unpack(packed))
    # what the network charges is the bytes sent, read off the frames or remembered by encode
    assert wire.charged_size(frames) == wire.charged_size([bytes(f) for f in frames]) \
        == _size(frames)
    # a phantom of it weighs exactly as much, decodes as the dense phantom
    twin = _frames(pack(codec, Phantom((300, 70), np.float32), ratio))
    assert len(twin) == 1 and wire.charged_size(twin) == _size(frames)
    assert wire.charged_size([bytes(twin[0])]) == _size(frames)
    assert wire.decode(twin).vars["w@GRAD"] == Phantom((300, 70), np.float32)


def test_topk_bytes_are_a_fiftieth_of_dense_at_one_percent() -> None:
    x = _grad((1000, 100))
    dense, top = _size(_frames(x)), _size(_frames(pack(Codec.TOPK, x, 0.01)))
    assert top < dense / 45


def _tampered(frames: list[Any], **fields: Any) -> list[bytes]:
    header = msgpack.unpackb(frames[0])
    header["vars"][0].update(fields)
    for key in [k for k, v in fields.items() if v is None]:
        del header["vars"][0][key]
    return [msgpack.packb(header), *(bytes(f) for f in frames[1:])]


def test_decoding_refuses_a_packed_var_that_lies() -> None:
    x = _grad((10, 10))
    top = _frames(pack(Codec.TOPK, x, 0.05))
    cases = {
        "unknown codec": (_tampered(top, codec="zip"), Reason.BAD_FIELD),
        "nnz missing": (_tampered(top, nnz=None), Reason.MISSING_FIELD),
        "nnz past the size": (_tampered(top, nnz=101), Reason.BAD_FIELD),
        "wrong frame size": (_tampered(top, nnz=4), Reason.SIZE_MISMATCH),
        "int dtype": (_tampered(top, dtype="int32"), Reason.BAD_FIELD),
        "nnz on fp16": (_tampered(_frames(pack(Codec.FP16, x)), nnz=3), Reason.BAD_FIELD),
        "codec on rows": (_tampered(top, kind="rows", height=10), Reason.BAD_FIELD),
    }
    indices = np.frombuffer(top[1], np.int32).copy()
    for name, bad in {"repeated": indices[[0, 0, 2, 3, 4]], "falling": indices[::-1],
                      "past the end": np.append(indices[:4], 100)}.items():
        cases[f"indices {name}"] = ([bytes(top[0]), bad.astype(np.int32).tobytes(),
                                     bytes(top[2])], Reason.ROWS_OUT_OF_RANGE)
    for name, (frames, reason) in cases.items():
        with pytest.raises(DecodeError) as info:
            wire.decode(frames)
        assert info.value.reason is reason, name
        assert info.value.var == "w@GRAD", name


def test_a_packed_var_counts_its_unpacked_size_against_the_limit() -> None:
    frames = [bytes(f) for f in _frames(pack(Codec.TOPK, _grad((100, 100)), 0.001))]
    assert wire.decode(frames, max_message_size=40_000 + 1000)
    with pytest.raises(DecodeError) as info:
        wire.decode(frames, max_message_size=30_000)
    assert info.value.reason is Reason.TOO_LARGE and "unpacks into 40000" in str(info.value)


# -- the transpiler ---------------------------------------------------------------------------------

def _programs(compression: dict[str, Any] | None) -> list[dict[str, Any]]:
    t = transpile(basic(), DistributeTranspilerConfig(compression=compression))
    return [t.get_trainer_program().to_dict(), t.get_trainer_startup_program().to_dict()] + \
        [program.to_dict() for ep in (PS1, PS2) for program in t.get_pserver_programs(ep)]


def test_compression_none_changes_no_program() -> None:
    plain = _programs(None)
    assert _programs({"method": "none", "ratio": 0.5}) == plain
    compressed = _programs({"method": "topk", "ratio": 0.05})
    assert compressed[1:] == plain[1:]  # the pservers never see the packing, nor startup
    assert compressed[0] != plain[0]


def _sends(program: Any) -> list[Any]:
    return [op for op in program.global_block().ops if op.type == "send"]


def test_dense_grad_sends_carry_the_method_and_sparse_ones_do_not() -> None:
    t = transpile(basic(), DistributeTranspilerConfig(
        compression={"method": "int8", "ratio": 0.2}))
    sends = _sends(t.get_trainer_program())
    assert sends and all((op.attr("compress"), op.attr("compress_ratio")) == ("int8", 0.2)
                         for op in sends)
    t = transpile(lookup_model(), DistributeTranspilerConfig(compression={"method": "topk"}))
    marked = {op.input("X")[0]: op.attr("compress") for op in _sends(t.get_trainer_program())}
    assert any(v is None for v in marked.values()) and any(v == "topk" for v in marked.values())
    for op in _sends(t.get_trainer_program()):
        if op.attr("compress") is not None:
            assert op.attr("compress_ratio") == 0.01  # the default ratio


@pytest.mark.parametrize("fields,message", [
    ({"compression": {"method": "gzip"}}, "method must be one of"),
    ({"compression": {"method": "topk", "ratio": 0}}, "ratio must be a number in (0, 1]"),
    ({"compression": {"ratio": 0.1}}, "must be None or a dict with 'method'"),
    ({"compression": "topk"}, "must be None or a dict"),
])
def test_bad_compression_settings_fail_where_they_are_set(fields: dict[str, Any],
                                                          message: str) -> None:
    with pytest.raises(ValueError, match="DistributeTranspilerConfig.compression") as info:
        DistributeTranspilerConfig(**fields)
    assert message in str(info.value)


def test_compression_needs_gradients_sent_to_pservers() -> None:
    config = DistributeTranspilerConfig(mode="nccl2", compression={"method": "fp16"})
    with pytest.raises(ValueError, match="mode='nccl2' has none"):
        config.validate()
    config = DistributeTranspilerConfig(geo_sgd_mode=True, compression={"method": "fp16"})
    with pytest.raises(ValueError, match="geo_sgd_mode sends parameter deltas"):
        config.validate()
    with pytest.raises(ValueError, match=r"transpiler.compression.method: .* not geo"):
        config_from_spec({"mode": "geo", "compression": {"method": "int8"}})
    assert config_from_spec({"mode": "async", "compression": {"method": "int8"}})[0] \
        .compression == {"method": "int8"}
    with pytest.raises(ScenarioError, match="compression.method topk needs mode"):
        parse_scenario(SCENARIO.format(method="topk", mode="collective", steps=1))


# -- jobs -------------------------------------------------------------------------------------------

SCENARIO = """\
name: compressed
seed: 5
model: {{name: mlp, sizes: [64, 256, 10], optimizer: {{type: sgd, learning_rate: 0.1}}}}
data: {{name: digits, batch_size: 32}}
cluster: {{pservers: 2, trainers: 2}}
transpiler: {{mode: {mode}, compression: {{method: {method}, ratio: 0.01}}}}
train: {{steps: {steps}, deadline: 60s, retry_after: 100ms, log_every: 10}}
"""


def _simulated(method: str, mode: str = "sync", steps: int = 40) -> Any:
    return collect(simulate(parse_scenario(SCENARIO.format(method=method, mode=mode,
                                                           steps=steps)), trace_messages=False))


@pytest.mark.timeout(300)
def test_each_method_trains_in_the_simulator_and_cuts_the_bytes_by_its_factor() -> None:
    """The MLP's gradients are 64x256 + 256 + 256x10 + 10 floats; what a pserver takes in
    besides them (GETs, headers) is the same in every run, so the ratio of the gradient
    bytes is the ratio of (bytes_in - that rest)."""
    runs = {m: _simulated(m) for m in ("none", "fp16", "int8", "topk")}
    for method, metrics in runs.items():
        losses = metrics.trainers[0].losses
        assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10]), method
        assert all(p.errors == 0 and p.steps == 40 for p in metrics.pservers), method
    dense = sum(p.bytes_in for p in runs["none"].pservers)
    ratios = {m: dense / sum(p.bytes_in for p in r.pservers) for m, r in runs.items()}
    assert 1.85 < ratios["fp16"] < 2.0
    assert 3.5 < ratios["int8"] < 4.0
    assert ratios["topk"] > 20
    assert runs["none"].trainers[0].losses != runs["fp16"].trainers[0].losses


@pytest.mark.timeout(120)
def test_topk_keeping_everything_trains_exactly_as_uncompressed() -> None:
    plain = _simulated("none", steps=10)
    text = SCENARIO.format(method="topk", mode="sync", steps=10).replace("0.01", "1.0")
    every = collect(simulate(parse_scenario(text), trace_messages=False))
    assert every.trainers[0].losses == plain.trainers[0].losses
    assert sum(p.bytes_in for p in every.pservers) > sum(p.bytes_in for p in plain.pservers)


@pytest.mark.timeout(120)
def test_async_training_compresses_the_blocks_the_runtime_cuts() -> None:
    plain, packed = _simulated("none", "async", 20), _simulated("int8", "async", 20)
    assert 3.0 < sum(p.bytes_in for p in plain.pservers) \
        / sum(p.bytes_in for p in packed.pservers) < 4.0
    assert np.mean(packed.trainers[0].losses[-5:]) < np.mean(packed.trainers[0].losses[:5])


@pytest.mark.timeout(60)
def test_runtime_up_trains_compressed_over_zeromq(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO.format(method="topk", mode="sync", steps=20)
                        + "expect: {no_lost_updates: true}\n")
    out = io.StringIO()
    code = cli.main(["up", str(scenario), "--out", str(tmp_path / "out")], out=out)
    assert code == 0, out.getvalue()
    metrics = read_metrics(tmp_path / "out" / "metrics.json")
    dense_grads = (64 * 256 + 256 + 256 * 10 + 10) * 4 * 20 * 2  # bytes: 20 steps, 2 trainers
    assert sum(p.bytes_in for p in metrics.pservers) < dense_grads / 10
    for t in metrics.trainers:
        assert np.mean(t.losses[-5:]) < np.mean(t.losses[:5])
