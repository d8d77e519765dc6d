"""``paddle.dataset``: Paddle's data sets read from Paddle's own cache, and pslab's built-in
ones.

Paddle's (``mnist``, ``uci_housing``, ``imikolov``, ``imdb``, ``movielens``, ``flowers``, and
``ctr``, the sample set of fluid's ``dist_ctr.py``) read the original files where Paddle keeps
them, ``DATA_HOME/<module>/<file>`` with ``DATA_HOME`` = ``~/.cache/paddle/dataset``
(`common`), and yield Paddle's samples; nothing is ever downloaded: a missing file is one
`common.DatasetFileMissing` naming it, its URL and where to put it. ``image`` holds Paddle's
image helpers (`flowers` decodes with them). pslab's own (`builtin`): ``digits``,
``synthetic_regression``, ``synthetic_classification``.
"""

from __future__ import annotations

from runtime.paddle.dataset import (common, ctr, flowers, image, imdb, imikolov, mnist, movielens,
                                    uci_housing)
from runtime.paddle.dataset.builtin import BuiltinDataset

digits = BuiltinDataset("digits")
synthetic_regression = BuiltinDataset("synthetic_regression")
synthetic_classification = BuiltinDataset("synthetic_classification")

__all__ = ["common", "ctr", "digits", "flowers", "image", "imdb", "imikolov", "mnist",
           "movielens", "synthetic_classification", "synthetic_regression", "uci_housing"]
