"""Data sets' feeds as their tests compare them."""

from __future__ import annotations

import numpy as np

from runtime.execution import data as D


def join(parts: list[D.Feed]) -> D.Feed:
    """Concatenate per-trainer feeds in trainer order, re-basing LoD offsets."""
    out: D.Feed = {}
    for name, first in parts[0].items():
        if isinstance(first, tuple):
            values = np.concatenate([p[name][0] for p in parts])
            offsets = [0]
            for p in parts:
                offsets += [offsets[-1] + o for o in p[name][1][0][1:]]
            out[name] = (values, [offsets])
        else:
            out[name] = np.concatenate([p[name] for p in parts])
    return out


def assert_feeds_equal(a: D.Feed, b: D.Feed) -> None:
    assert list(a) == list(b)
    for name in a:
        if isinstance(a[name], tuple):
            np.testing.assert_array_equal(a[name][0], b[name][0])
            assert a[name][1] == b[name][1]
        else:
            np.testing.assert_array_equal(a[name], b[name])
