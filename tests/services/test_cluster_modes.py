"""Async, half-async, geo and DC-ASGD jobs train: the loss falls by a stated factor.

They do not equal local training (updates are applied as they come), so the check is the
loss: every trainer's mean over its last 5 steps is below a third of its first 5 steps'. Measured
(seed 3, 60 steps, 2 trainers x 2 pservers): about 20x for async, half-async and DC-ASGD,
70x for geo.
"""

from __future__ import annotations

import numpy as np
import pytest

from cluster_helpers import FAST_DRAIN, make_job, run

MODEL = ("{name: mlp, sizes: [64, 64, 10], optimizer: {type: sgd, learning_rate: 0.1}%s}")
DECAY = ", lr: {type: exponential_decay, decay_steps: 20, decay_rate: 0.5}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode,transpiler,lr", [
    ("async", "", DECAY),
    ("half_async", "", DECAY),
    ("geo", "geo_push_every: 5", ""),
    ("async", "dc_asgd: true", ""),
])
def test_mode_trains(mode: str, transpiler: str, lr: str) -> None:
    job = make_job(MODEL % lr, trainers=2, pservers=2, steps=60, mode=mode, transpiler=transpiler,
                   retry_after=FAST_DRAIN)
    result = run(job)
    for report in result.trainers:
        assert len(report.losses) == 60
        first, last = np.mean(report.losses[:5]), np.mean(report.losses[-5:])
        assert last < first / 3, (mode, transpiler, first, last)
    assert all(s.errors == 0 for s in result.pservers)
