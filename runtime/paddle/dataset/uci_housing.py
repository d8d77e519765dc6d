"""``paddle.dataset.uci_housing``: the Boston housing table from Paddle's cache,
``DATA_HOME/uci_housing/housing.data`` (`common`): 14 whitespace-separated numbers per row, 13
features then the price.

As Paddle's: each feature is normalized over the whole table as ``(x - mean) / (max - min)``
(the mean being the column's sum over its row count), the price left as it is; the first
``int(rows * 0.8)`` rows are the training set and the rest the test set; a sample is
``(features, price)``, float64 arrays of 13 and of 1. The table is read when `train` or `test`
is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from runtime.paddle.dataset.common import Source, locate
from runtime.paddle.reader import Reader

__all__ = ["feature_names", "fetch", "load_data", "predict_reader", "test", "train"]

SOURCE = Source("http://paddlemodels.bj.bcebos.com/uci_housing/housing.data",
                "d4accdce7a25600298819f8e28e8d593")
feature_names = ["CRIM", "ZN", "INDUS", "CHAS", "NOX", "RM", "AGE", "DIS", "RAD", "TAX",
                 "PTRATIO", "B", "LSTAT"]
FEATURE_NUM = 14
TRAIN_RATIO = 0.8


def load_data(filename: str | Path, feature_num: int = FEATURE_NUM,
              ratio: float = TRAIN_RATIO) -> tuple[np.ndarray, np.ndarray]:
    """The normalized table of `filename`, split into its training and test rows."""
    data = np.array(Path(filename).read_text().split(), dtype=np.float64)
    if data.size % feature_num:
        raise ValueError(f"{filename}: {data.size} numbers, not rows of {feature_num}")
    data = data.reshape(-1, feature_num)
    maximums, minimums = data.max(axis=0), data.min(axis=0)
    avgs = data.sum(axis=0) / data.shape[0]
    for i in range(feature_num - 1):
        data[:, i] = (data[:, i] - avgs[i]) / (maximums[i] - minimums[i])
    offset = int(data.shape[0] * ratio)
    return data[:offset], data[offset:]


def _rows(part: int) -> np.ndarray:
    return load_data(locate("uci_housing", SOURCE)[0])[part]


def _reader(rows: np.ndarray) -> Reader:
    def samples() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for row in rows:
            yield row[:-1], row[-1:]
    return samples


def train() -> Reader:
    """The first 80% of the rows."""
    return _reader(_rows(0))


def test() -> Reader:
    """The last 20% of the rows."""
    return _reader(_rows(1))


def predict_reader() -> tuple[np.ndarray]:
    """Paddle's one inference input: the first test row's features."""
    return (_rows(1)[0][:-1],)


def fetch() -> None:
    """Paddle downloads the table; here it must be there already."""
    locate("uci_housing", SOURCE)
