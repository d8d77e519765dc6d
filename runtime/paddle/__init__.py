"""Paddle's names for a ported script: ``import paddle`` becomes ``import runtime.paddle as
paddle`` and ``import paddle.fluid as fluid`` becomes ``import runtime.paddle.fluid as fluid``
(`runtime.paddle.fluid`); nothing else in the script changes.

This package holds what a classic script takes from ``paddle`` itself: `batch` (a reader of
samples into a reader of lists of them) and `dataset` (`runtime.paddle.dataset`): Paddle's own
data sets (``paddle.dataset.mnist``, ``uci_housing``, ``imikolov``, ``imdb``, ``movielens``,
``flowers``, and ``ctr`` for fluid's ``dist_ctr.py``), read from the files in Paddle's cache
(``~/.cache/paddle/dataset``; never downloaded), and pslab's built-in ones as Paddle readers:
``paddle.dataset.digits.train()`` (scikit-learn's bundled 8x8 digits, the ``[data]`` extra),
``synthetic_regression`` and ``synthetic_classification`` (`runtime.execution.data`).

Also `reader`, Paddle's reader decorators (``paddle.reader.shuffle``, ``buffered``, ``chain``,
``compose``, ``map_readers``, ``firstn``, ``xmap_readers``, ``cache``: `runtime.paddle.reader`),
and `compat`, fluid 1.x's ``paddle.compat`` (``to_text``, ``to_bytes``, ``round``,
``floor_division``, ``get_exception_message``: `runtime.paddle.compat`).

Paddle 2.x's names work too (``import runtime.paddle as paddle``, ``from runtime.paddle import
base``): ``paddle.base`` (2.x's name of ``paddle.fluid``, the same module), ``paddle.static``
(`runtime.paddle.static`: ``Program``, ``program_guard``, ``data``, ``nn.fc``,
``nn.embedding``, ``Executor``, ...), ``paddle.nn`` (`runtime.paddle.nn`: ``functional``,
``initializer``, ``ClipGradByValue``, ``HSigmoidLoss``), ``paddle.optimizer`` with
``paddle.optimizer.lr`` (`runtime.paddle.optimizer`), ``paddle.regularizer`` (``L2Decay``,
``L1Decay``), ``paddle.distributed.transpiler`` (`runtime.paddle.distributed`: its configs
follow the 2.x programs) and the tensor functions ``paddle.mean``, ``reshape``, ``add``,
``multiply``, ``sum``, ``matmul``, ``concat``, ``full``, ``seed`` (`runtime.paddle.tensor`).

Layers: a facade on top of `runtime`, like `runtime.cli`: it imports the parts and nothing
imports it.
"""

from __future__ import annotations

from typing import Any, Iterator

from runtime.paddle import compat, dataset, reader
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


import sys  # noqa: E402

from transpiler import regularizer  # noqa: E402  (``paddle.regularizer``)

from runtime.paddle import fluid  # noqa: E402  (``paddle.fluid`` after ``import paddle``)
from runtime.paddle import distributed, nn, optimizer, static  # noqa: E402
from runtime.paddle.tensor import (add, concat, divide, full, matmul, mean,  # noqa: E402
                                   multiply, reshape, seed, subtract, sum)

base = fluid
"""2.x's ``paddle.base``: fluid renamed, the same module."""
sys.modules[f"{__name__}.base"] = fluid  # ``import paddle.base``

__all__ = ["Reader", "add", "base", "batch", "compat", "concat", "dataset", "distributed",
           "divide", "fluid", "full", "matmul", "mean", "multiply", "nn", "optimizer", "reader",
           "regularizer", "reshape", "seed", "static", "subtract", "sum"]
