"""A trainer prints its progress line for its first and last steps, a step whose loss is not
finite, and otherwise once a second; the launcher still hears of every step."""

from __future__ import annotations

import math

from runtime.services.node import PROGRESS_LINE_SECONDS, ShownProgress
from runtime.services.progress import Progress


def test_lines_come_for_the_first_and_last_steps_and_once_a_second_between() -> None:
    now = [0.0]
    shown = ShownProgress(clock=lambda: now[0])
    printed = []
    for step in range(1, 41):
        now[0] = step * PROGRESS_LINE_SECONDS / 8  # 8 steps a second (exact in binary)
        loss = math.nan if step == 20 else 1.0
        if shown.due(Progress(step, 40, loss, 0.0)):
            printed.append(step)
    assert printed == [1, 9, 17, 20, 28, 36, 40]
