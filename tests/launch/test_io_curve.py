"""What a message's size costs ZeroMQ's I/O thread (`runtime.launch.io_curve`), measured between
two processes: a curve that starts at nothing, never falls, and leaves no process behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.launch import io_curve


def children() -> set[str]:
    return set(Path(f"/proc/self/task/{os.getpid()}/children").read_text().split())


@pytest.mark.timeout(60)
def test_a_large_message_costs_the_io_thread_more_than_a_small_one() -> None:
    before = children()
    measured = io_curve.measure_io_curves(sizes=(64, 4096, 2**20), repeats=1)
    assert children() == before  # both server processes have ended
    local, tcp = measured.local, measured.tcp
    assert 0 < measured.per_message < 1e-3
    for curve in (local, tcp):
        assert curve.sizes == (64, 4096, 2**20)
        assert curve.seconds[0] <= curve.seconds[1] <= curve.seconds[2]
        # copying a MiB into and out of a socket takes the I/O threads some microseconds, and
        # less than a few milliseconds on any machine that runs this suite
        assert 1e-6 < curve.seconds[2] < 5e-3
    assert local.seconds[0] == 0.0  # the smallest local message is what the others exceed


def test_a_curve_never_falls_and_is_taken_beyond_the_local_smallest() -> None:
    client = {64: 10e-6, 4096: 9e-6, 2**20: 100e-6}
    server = {64: 12e-6, 4096: 12e-6, 2**20: 80e-6}
    curve = io_curve._curve((64, 4096, 2**20), client, server, base=(8e-6, 10e-6))
    assert curve.seconds == pytest.approx((2e-6, 2e-6, 81e-6), rel=1e-9)


def test_a_batch_sends_enough_bytes_within_bounds() -> None:
    assert io_curve.rounds_for(64) == io_curve.MAX_ROUNDS
    assert io_curve.rounds_for(8 * 2**20) == io_curve.MIN_ROUNDS
    assert io_curve.rounds_for(2**17) == io_curve.BATCH_BYTES // 2**17
