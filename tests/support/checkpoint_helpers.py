"""Checkpoints and the files pslab writes, as tests drive them: a ctr_dnn job of 2 pservers x 2
trainers, a pserver's state as bytes to compare bit for bit, and a full disk."""

from __future__ import annotations

import errno
import io
import os
from typing import Any

import numpy as np
import pytest

from runtime.config import atomic
from runtime.services.job import Job
from runtime.services.pserver import PserverService

from cluster_helpers import FAST_DRAIN, make_job


CTR_MODEL = ("{{name: ctr_dnn, vocab: 100, embed_dim: 4, hidden: [{hidden}], is_distributed: true, "
         "optimizer: {{type: {opt}, learning_rate: 0.05}}, "
         "lr: {{type: exponential_decay, decay_steps: 4, decay_rate: 0.7}}}}")


def ctr_job(hidden: int = 8, opt: str = "adam") -> Job:
    return make_job(CTR_MODEL.format(hidden=hidden, opt=opt), trainers=2, pservers=2, batch=8,
                    retry_after=FAST_DRAIN)


def state_bytes(service: PserverService) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {n: (str(v.dtype), v.shape, v.tobytes())
            for n in service.state for v in [np.asarray(service.scope.get(n))]}


class FullDisk(io.FileIO):
    """A file on a full disk: every write fails as the kernel's would."""

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, every file `atomic_open` opens is on a full disk."""
    monkeypatch.setattr(atomic.os, "fdopen", lambda fd, mode: FullDisk(fd, "wb"))
