"""The runtime's own costs (`runtime.execution.costs`): the meter's nested spans, and fitting a
node's records into the model the simulator charges, exactly."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from runtime.execution.costs import (KernelTimes, Linear, Meter, Residual, RuntimeCosts,
                                     SizeCurve, SpanCost, calibrate_span, fit_costs,
                                     fit_io, fit_linear, measuring_seconds,
                                     split_residual)
from runtime.execution.scope import Scope
from runtime.execution.work import op_work
from transpiler.ir import Op


def record(role: str, main: float, cpu: float, messages: list[dict[str, Any]],
           ops: int = 0, op_seconds: float = 0.0, kernels: float = 0.0, steps: int = 0,
           step_seconds: float = 0.0, rounds: int = 0,
           round_seconds: float = 0.0) -> dict[str, Any]:
    return {"role": role, "cpu_seconds": cpu, "main_seconds": main, "kernel_seconds": kernels,
            "kernel_calls": ops, "ops": ops, "op_seconds": op_seconds, "steps": steps,
            "step_seconds": step_seconds, "rounds": rounds, "round_seconds": round_seconds,
            "messages": messages}


def messages(side: str, kind: str, sizes: list[int], seconds: list[float],
             again: float = 0.0) -> dict[str, Any]:
    return {"side": side, "kind": kind, "bytes": sizes, "seconds": seconds, "again": again}


def test_a_linear_fit_keeps_the_total_and_finds_a_per_byte_cost() -> None:
    sizes = [0, 8192, 16384, 32768]
    fit = fit_linear(sizes, [1e-4 + 1e-9 * n for n in sizes])
    assert fit.per_byte == pytest.approx(1e-9) and fit.per_message == pytest.approx(1e-4)
    same = fit_linear([100] * 5, [1e-4, 2e-4, 3e-4, 2e-4, 2e-4], total=2e-3)
    assert same == Linear(pytest.approx(4e-4), 0.0)


def test_the_residual_of_a_node_goes_to_its_messages_and_the_rest_to_its_io_thread() -> None:
    """A trainer: 10 ms of main-thread CPU of which 6 timed (2 ms ops, 4 ms sends), 4 ms
    untimed over its 4 messages; 2 ms more on other threads."""
    trainer = record("trainer", main=0.010, cpu=0.012, ops=100, op_seconds=0.002,
                     kernels=0.0015, messages=[
                         messages("send", "send", [1000, 1000], [0.001, 0.001]),
                         messages("receive", "reply", [100, 100], [0.001, 0.001])])
    pserver = record("pserver", main=0.004, cpu=0.006, rounds=2, round_seconds=0.0004,
                     messages=[messages("receive", "send", [1000, 1000], [0.001, 0.0008],
                                        again=0.0002),
                               messages("send", "reply", [100, 100], [0.0005, 0.0005])])
    costs, nodes = fit_costs({"trainer:0": trainer, "pserver:0": pserver})
    assert costs.op_overhead == pytest.approx(0.0005 / 100)
    assert costs.round_overhead == pytest.approx(0.0002)
    # trainer: residual (10 - 6) / 4 = 1 ms per message on top of what was timed
    assert costs.messages["send", "send"] == Linear(pytest.approx(0.002), 0.0)
    assert costs.messages["receive", "reply"] == Linear(pytest.approx(0.002), 0.0)
    # pserver: timed 0.4 + 1.8 + 0.2 + 1.0 = 3.4 ms of 4: residual 0.15 ms a message
    assert costs.messages["receive", "send"].per_message == pytest.approx(0.00115)
    assert costs.messages["send", "reply"].per_message == pytest.approx(0.00065)
    # the model adds up to each node's main-thread CPU, and its other threads' to the I/O cost
    trainer_total = 2 * costs.message("send", "send", 1000) + \
        2 * costs.message("receive", "reply", 100) + 100 * costs.op_overhead + 0.0015
    assert trainer_total == pytest.approx(0.010)
    pserver_total = 2 * costs.message("receive", "send", 1000) + \
        2 * costs.message("send", "reply", 100) + 2 * costs.round_overhead
    assert pserver_total == pytest.approx(0.004)
    assert costs.io == Linear(pytest.approx(0.0005), 0.0)  # 4 ms over 8 messages
    assert [n.node for n in nodes] == ["pserver:0", "trainer:0"]
    assert costs.message("send", "never-seen", 0) == costs.default["send"].per_message


def test_io_costs_per_byte_are_told_apart_where_the_nodes_move_different_sizes() -> None:
    fit = fit_io([10, 10], [10 * 1024, 10 * 1024 * 1024], [10 * 1e-5 + 10 * 1024 * 1e-9,
                                                           10 * 1e-5 + 10 * 1024 * 1024 * 1e-9])
    assert fit.per_message == pytest.approx(1e-5) and fit.per_byte == pytest.approx(1e-9)
    assert fit_io([4, 4], [400, 400], [1e-3, 3e-3]) == Linear(pytest.approx(5e-4), 0.0)


def test_the_meter_charges_an_outer_span_only_what_its_inner_spans_did_not_take() -> None:
    meter = Meter("pserver")

    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    outer = meter.start()
    burn(0.01)
    inner = meter.start()
    burn(0.02)
    meter.stop_message(inner, "send", "reply", 10)
    meter.stop_message(outer, "receive", "get", 20)
    ((_, reply),) = meter.samples["send", "reply"]
    ((_, get),) = meter.samples["receive", "get"]
    assert reply >= 0.02 and 0.01 <= get < 0.02


def test_a_profiles_runtime_section_round_trips() -> None:
    costs = RuntimeCosts({("send", "get"): Linear(1e-4, 1e-9)}, {"send": Linear(2e-4)},
                         1e-6, 2e-4, 3e-5, Linear(5e-6, 1e-10), {"cores": 2})
    assert RuntimeCosts.from_document(costs.document()) == costs


def test_with_a_small_messages_io_cost_known_the_rest_of_the_io_time_is_per_byte() -> None:
    fit = fit_io([10, 30], [10_000, 10_000], [10e-5 + 10_000e-9, 30e-5 + 10_000e-9], 1e-5)
    assert fit.per_message == 1e-5 and fit.per_byte == pytest.approx(1e-9)
    # never more per message than the nodes spent in all
    assert fit_io([10], [0], [5e-5], 1e-5) == Linear(5e-6, 0.0)


CURVE = SizeCurve((64, 1024, 5120), (0.0, 2e-6, 10e-6))


def test_a_size_curve_is_straight_lines_through_its_points_and_beyond_the_last() -> None:
    assert [CURVE.extra(n) for n in (0, 64, 1024, 5120)] == [0.0, 0.0, 2e-6, 10e-6]
    assert CURVE.extra(544) == pytest.approx(1e-6, rel=1e-12)  # halfway along the first line
    assert CURVE.extra(3072) == pytest.approx(6e-6, rel=1e-12)
    assert CURVE.extra(9216) == pytest.approx(18e-6, rel=1e-12)  # the last line's slope on
    with pytest.raises(ValueError, match="must rise"):
        SizeCurve((64, 64), (0.0, 1.0))
    with pytest.raises(ValueError, match="two points"):
        SizeCurve((64,), (0.0,))


TCP = SizeCurve((64, 1024), (3e-6, 7e-6))


def test_a_messages_io_cost_is_its_per_message_cost_and_what_its_size_adds() -> None:
    costs = RuntimeCosts(io=Linear(5e-6, 0.0), io_by_size=CURVE, io_by_size_tcp=TCP,
                         variants={"table": RuntimeCosts(io_by_size=CURVE, io_by_size_tcp=TCP)})
    assert costs.io_seconds(3072) == pytest.approx(11e-6, rel=1e-12)
    assert costs.io_seconds(10) == 5e-6
    assert RuntimeCosts.from_document(costs.document()) == costs
    # over TCP: the TCP curve, from the smallest message on, for every family
    tcp = costs.over_tcp()
    assert (tcp.io_seconds(10), tcp.io_seconds(1024)) == pytest.approx((8e-6, 12e-6), rel=1e-12)
    assert tcp.for_job("table").io_by_size == TCP
    assert RuntimeCosts(io_by_size=CURVE).over_tcp().io_by_size == CURVE  # none measured


def test_a_run_fitted_with_the_curve_prices_its_io_by_it() -> None:
    """A small message's cost measured beside the curve is the cost per message, whatever the
    run's own I/O time (`RuntimeCosts.io_by_size`'s DESIGN); without it the curve is refused."""
    run = {"trainer:0": record("trainer", main=0.01, cpu=0.01 + 16e-6,
                               messages=[messages("send", "send", [1024, 5120], [1e-5, 1e-5]),
                                         messages("receive", "reply", [1024], [1e-5])],
                               steps=1)}
    costs, _ = fit_costs(run, 3e-6, io_by_size=CURVE, io_by_size_tcp=TCP)
    assert (costs.io, costs.io_by_size, costs.io_by_size_tcp) == (Linear(3e-6, 0.0), CURVE, TCP)
    with pytest.raises(ValueError, match="needs io_per_message"):
        fit_costs(run, io_by_size=CURVE, io_by_size_tcp=TCP)


def test_what_measuring_itself_costs_is_not_charged_as_the_runtimes() -> None:
    """Recording kernel samples happens inside the op spans; an unmeasured run does not pay it."""
    base = record("trainer", main=0.010, cpu=0.010, ops=100, op_seconds=0.004, kernels=0.001,
                  messages=[messages("send", "send", [10], [0.001])])
    costs, _ = fit_costs({"trainer:0": {**base, "bookkeeping_seconds": 0.002}})
    assert costs.op_overhead == pytest.approx(0.001 / 100)
    assert costs.messages["send", "send"].per_message == pytest.approx(0.006)


def test_the_kernel_timer_counts_its_own_bookkeeping() -> None:
    times = KernelTimes()
    scope = Scope()
    scope.put("y", np.ones(8, np.float32))
    times.record(Op("relu", {"X": ["x"]}, {"Out": ["y"]}, {}), scope, 1e-3)
    assert times.samples["relu"].elements == [8] and 0 < times.bookkeeping < 1e-3


def test_the_kernel_timer_keeps_each_calls_work_and_a_record_carries_it() -> None:
    times = KernelTimes()
    scope = Scope()
    scope.put("x", np.ones(8, np.float32))
    scope.put("y", np.ones(8, np.float32))
    op = Op("relu", {"X": ["x"]}, {"Out": ["y"]}, {})
    times.record(op, scope, 1e-3)
    work = op_work(op, scope)
    samples = times.samples["relu"]
    assert (samples.flops, samples.bytes) == ([work.flops], [work.bytes]) and work.bytes == 64
    assert samples.document() == {"elements": [8], "seconds": [1e-3], "flops": [work.flops],
                                  "bytes": [64]}
    merged = KernelTimes()
    merged.merge("relu", [8], [1e-3])  # a record from before the work was kept
    assert merged.samples["relu"].flops == [] and merged.samples["relu"].seconds == [1e-3]


# -- measuring's own cost, and the residual split -------------------------------------------

U = 2.0**-12
"""Seconds; every figure below is a small multiple of a power of two, so sums are exact."""
SPANS = SpanCost(span=U, inner=U / 4, kernel=U / 2)


def measured_trainer() -> dict[str, Any]:
    """16 ops in 16 spans (16 kernel calls, 16U of kernels, 8U of bookkeeping), 4 steps in 8
    spans, 2 sends and 2 replies, 2 discarded spans: 30 spans; 256U of main-thread CPU."""
    return {**record("trainer", main=256 * U, cpu=256 * U, ops=16, op_seconds=64 * U,
                     kernels=16 * U, steps=4, step_seconds=8 * U, messages=[
                         messages("send", "send", [100, 100], [4 * U, 4 * U]),
                         messages("receive", "reply", [10, 10], [2 * U, 2 * U])]),
            "bookkeeping_seconds": 8 * U, "spans": 30, "op_spans": 16, "step_spans": 8}


def measured_pserver(rounds: int) -> dict[str, Any]:
    """2 requests in, 2 replies out, `rounds` rounds of 2U each; 64U of main-thread CPU."""
    return {**record("pserver", main=64 * U, cpu=64 * U, rounds=rounds,
                     round_seconds=2 * U * rounds, messages=[
                         messages("receive", "send", [100, 100], [4 * U, 4 * U]),
                         messages("send", "reply", [10, 10], [2 * U, 2 * U])]),
            "spans": 4 + rounds, "op_spans": 0, "step_spans": 0}


def test_what_each_span_and_timed_kernel_cost_is_taken_out_of_the_model() -> None:
    """Measuring: 30 spans x U + 16 kernel calls x U/2 = 38U. Each timed stretch held U/4 of
    its span; each op's span U/2 more per kernel call. The rest of the residual is even."""
    trainer = measured_trainer()
    assert measuring_seconds(trainer, SPANS) == 38 * U
    costs, (node,) = fit_costs({"trainer:0": trainer}, spans=SPANS)
    assert costs.op_overhead == (64 - 16 - 8 - 4 - 8) * U / 16 == 1.75 * U
    assert costs.step_overhead == (8 - 2) * U / 4
    # timed 84U less bookkeeping 8U, inner parts 7U, kernel calls 8U: 61U; residual
    # 256 - 8 - 38 - 61 = 149U, a quarter on each message
    assert node.timed_seconds == 61 * U and node.measuring_seconds == 46 * U
    assert costs.messages["send", "send"] == Linear(4 * U - U / 4 + 37.25 * U)
    assert costs.messages["receive", "reply"] == Linear(2 * U - U / 4 + 37.25 * U)
    modelled = (2 * costs.message("send", "send", 100) + 2 * costs.message("receive", "reply", 10)
                + 16 * costs.op_overhead + 16 * U + 4 * costs.step_overhead)
    assert modelled == 256 * U - 8 * U - 38 * U  # the CPU of an unmeasured run
    assert costs.step_residual == 0.0 and costs.round_residual == 0.0


def test_the_residual_is_the_loops_per_message_received_and_the_rest_per_step_or_round() -> None:
    costs, nodes = fit_costs({"trainer:0": measured_trainer(), "pserver:0": measured_pserver(2)},
                             spans=SPANS, loop_per_message=8 * U)
    # trainer: residual 149U, 8U on each of its 2 replies, 133U over its 4 steps
    assert costs.messages["send", "send"] == Linear(3.75 * U)
    assert costs.messages["receive", "reply"] == Linear(1.75 * U + 8 * U)
    assert costs.step_residual == 133 * U / 4
    # pserver: 6 spans (6U); timed 16U less 1.5U inner; residual 64 - 6 - 14.5 = 43.5U:
    # 8U on each of its 2 requests, 27.5U over its 2 rounds
    assert costs.messages["receive", "send"] == Linear(3.75 * U + 8 * U)
    assert costs.messages["send", "reply"] == Linear(1.75 * U)
    assert costs.round_overhead == 1.75 * U and costs.round_residual == 13.75 * U
    pserver, trainer = nodes
    assert pserver.residual_per_step == 13.75 * U and trainer.residual_per_step == 33.25 * U
    assert pserver.residual_per_message == 4 * U  # 16U of residual on its 4 messages
    trainer_total = (2 * costs.message("send", "send", 100)
                     + 2 * costs.message("receive", "reply", 10) + 16 * costs.op_overhead
                     + 16 * U + 4 * (costs.step_overhead + costs.step_residual))
    pserver_total = (2 * costs.message("receive", "send", 100)
                     + 2 * costs.message("send", "reply", 10)
                     + 2 * (costs.round_overhead + costs.round_residual))
    assert (trainer_total, pserver_total) == (210 * U, 58 * U)


def test_a_node_with_no_rounds_keeps_the_rest_of_its_residual_per_message() -> None:
    """An asynchronous pserver: residual 64 - 4 - (12 - 1) = 49U, 8U on each request, the
    other 33U over all 4 messages."""
    costs, _ = fit_costs({"pserver:0": measured_pserver(0)}, spans=SPANS,
                         loop_per_message=8 * U)
    assert costs.messages["receive", "send"] == Linear(3.75 * U + 8 * U + 8.25 * U)
    assert costs.messages["send", "reply"] == Linear(1.75 * U + 8.25 * U)
    assert costs.round_residual == 0.0


def test_a_residual_under_the_loops_cost_all_goes_to_the_messages_received() -> None:
    assert split_residual(8 * U, received=4, messages=8, periods=2, loop_per_message=4 * U) == \
        Residual(per_received=2 * U)
    assert split_residual(8 * U, 4, 8, 2) == Residual(per_message=U)
    assert split_residual(8 * U, 0, 0, 2, 4 * U) == Residual(per_period=4 * U)


def test_a_record_from_before_spans_were_counted_fits_as_it_did() -> None:
    old = record("trainer", main=0.010, cpu=0.012, ops=100, op_seconds=0.002, kernels=0.0015,
                 steps=4, step_seconds=0.0004,
                 messages=[messages("send", "send", [1000, 1000], [0.001, 0.001])])
    assert measuring_seconds(old, SPANS) == 0.0
    assert fit_costs({"trainer:0": old}, spans=SPANS) == fit_costs({"trainer:0": old})


def test_the_meter_counts_its_spans_by_what_they_timed() -> None:
    meter = Meter("pserver")
    meter.stop_ops(meter.start(), 3)
    meter.add_step_time(meter.start())
    meter.stop_step(meter.start())
    meter.stop_round(meter.start())
    meter.discard(meter.start())
    meter.stop_message(meter.start(), "receive", "send", 10)
    meter.stop_message(meter.start(), "receive", "send", 0, again=True)
    done = meter.record(0.0, 0)
    assert (done["spans"], done["op_spans"], done["step_spans"], done["ops"]) == (7, 1, 2, 3)
    assert done["messages"] == [{"side": "receive", "kind": "send", "bytes": [10],
                                 "seconds": done["messages"][0]["seconds"],
                                 "again": done["messages"][0]["again"], "again_spans": 1}]


def test_a_span_costs_some_cpu_part_of_it_inside_what_it_times() -> None:
    cost = calibrate_span(2000)
    assert 0 < cost.inner <= cost.span < 1e-3 and 0 <= cost.kernel < 1e-3
