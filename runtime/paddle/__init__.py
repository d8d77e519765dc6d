"""Paddle's names for a ported script: ``import paddle`` becomes ``import runtime.paddle as
paddle`` and ``import paddle.fluid as fluid`` becomes ``import runtime.paddle.fluid as fluid``
(`runtime.paddle.fluid`); nothing else in the script changes.

This package holds what a classic script takes from ``paddle`` itself: `batch` (a reader of
samples into a reader of lists of them) and `dataset`, pslab's built-in data sets as Paddle
readers: ``paddle.dataset.digits.train()`` (scikit-learn's bundled 8x8 digits, the ``[data]``
extra), ``synthetic_regression`` and ``synthetic_classification``
(`runtime.execution.data`). A reader yields one ``(field, field, ...)`` tuple per example, in
the order of the data set's first seeded epoch, so every process reading it sees the same
stream. Paddle's own data sets (``uci_housing``, ``mnist``, ...) download their data and are
not here.

Also `reader`, Paddle's reader decorators (``paddle.reader.shuffle``, ``buffered``, ``chain``,
``compose``, ``map_readers``, ``firstn``, ``xmap_readers``, ``cache``: `runtime.paddle.reader`),
and `compat`, fluid 1.x's ``paddle.compat`` (``to_text``, ``to_bytes``, ``round``,
``floor_division``, ``get_exception_message``: `runtime.paddle.compat`).

Layers: a facade on top of `runtime`, like `runtime.cli`: it imports the parts and nothing
imports it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Iterator

from runtime.execution.data import Dense, load_dataset
from runtime.paddle import compat, reader
from runtime.paddle.reader import Reader


def batch(reader: Reader, batch_size: int, drop_last: bool = False) -> Reader:
    """Paddle's ``paddle.batch``: lists of `batch_size` consecutive samples of `reader` (the
    last one shorter unless `drop_last`)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    def batches() -> Iterator[list[Any]]:
        chunk: list[Any] = []
        for sample in reader():
            chunk.append(sample)
            if len(chunk) == batch_size:
                yield chunk
                chunk = []
        if chunk and not drop_last:
            yield chunk
    return batches


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


dataset = SimpleNamespace(**{name: BuiltinDataset(name) for name in
                             ("digits", "synthetic_regression", "synthetic_classification")})
"""``paddle.dataset.digits.train()`` and the others."""

from runtime.paddle import fluid  # noqa: E402  (``paddle.fluid`` after ``import paddle``)

__all__ = ["Reader", "batch", "compat", "dataset", "fluid", "reader"]
