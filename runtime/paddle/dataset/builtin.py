"""pslab's built-in data sets as Paddle readers: ``paddle.dataset.digits`` (scikit-learn's
bundled 8x8 digits, the ``[data]`` extra), ``synthetic_regression`` and
``synthetic_classification`` (`runtime.execution.data`). A reader yields one
``(field, field, ...)`` tuple per example, in the order of the data set's first seeded epoch,
so every process reading it sees the same stream."""

from __future__ import annotations

from typing import Any, Iterator

from runtime.execution.data import Dense, load_dataset
from runtime.paddle.reader import Reader

__all__ = ["BUILTIN", "BuiltinDataset"]

BUILTIN = ("digits", "synthetic_regression", "synthetic_classification")
"""The names of pslab's data sets served as ``paddle.dataset.<name>``."""


class BuiltinDataset:
    """One of pslab's data sets as Paddle's ``paddle.dataset.<name>`` module."""

    def __init__(self, name: str) -> None:
        self.name = name

    def train(self, seed: int = 0) -> Reader:
        """A reader of every example, in the data set's first epoch's (seeded) order."""
        def samples() -> Iterator[tuple[Any, ...]]:
            data = load_dataset(self.name, seed)
            columns = []
            for field, column in data.columns.items():
                if not isinstance(column, Dense):
                    raise ValueError(f"paddle.dataset.{self.name}: field {field!r} is not dense")
                columns.append(column.values)
            for i in data.epoch_order(0):
                yield tuple(values[i] for values in columns)
        return samples
