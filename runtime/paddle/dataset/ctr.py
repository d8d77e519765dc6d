"""``paddle.dataset.ctr``: the Avazu-derived click-through sample set of fluid's
``dist_ctr.py`` (its ``dist_ctr_reader.py``), from Paddle's cache,
``DATA_HOME/avazu_ctr_data/avazu_ctr_data.tgz`` (`common`): ``avazu_ctr_data/train.txt``,
``test.txt``, ``infer.txt`` and ``data.meta.txt``.

A line is ``dnn ids<TAB>lr id:value pairs<TAB>click`` (no click in infer.txt); a sample is
dist_ctr_reader's list ``[dnn_input, lr_input, click]`` (``[dnn_input, lr_input]`` for infer):
the dnn ids as ints, the lr pairs' ids as ints (their values dropped, as there), the click an
int. `load_data_meta` gives ``[dnn_input_dim, lr_input_dim]`` from data.meta.txt. The archive
is read (whole file, as there) each time a reader is iterated. An unmodified
``dist_ctr_reader.py`` also runs: its ``paddle.dataset.common.download`` finds this archive.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Iterator

from runtime.paddle.dataset.common import Source, locate
from runtime.paddle.reader import Reader

__all__ = ["Dataset", "infer", "load_data_meta", "read_data", "test", "train"]

SOURCE = Source("http://paddle-ctr-data.bj.bcebos.com/avazu_ctr_data.tgz",
                "c11df99fbd14e53cd4bfa6567344b26e")
MODULE = "avazu_ctr_data"
feeding_index = {"dnn_input": 0, "lr_input": 1, "click": 2}


def _archive() -> Path:
    return locate(MODULE, SOURCE)[0]


def read_data(file_name: str) -> list[str]:
    """The lines of the archive's (last) member whose name ends with `file_name`."""
    archive = _archive()
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name.endswith(file_name)]
        f = tar.extractfile(members[-1]) if members else None
        if f is None:
            raise ValueError(f"{archive}: no file {file_name!r}: not the avazu CTR archive")
        return [line.decode("utf-8") for line in f.readlines()]


def _sample(line: str, with_click: bool) -> list[object]:
    fields = line.strip().split("\t")
    dnn = [int(v) for v in fields[0].split()]
    lr = [int(pair.split(":")[0]) for pair in fields[1].split()]
    return [dnn, lr, int(fields[2])] if with_click else [dnn, lr]


def _reader(file_name: str, with_click: bool) -> Reader:
    _archive()

    def samples() -> Iterator[list[object]]:
        for line in read_data(file_name):
            yield _sample(line, with_click)
    return samples


class Dataset:
    """dist_ctr_reader's ``Dataset()``: `train`, `test` and `infer` readers."""

    def train(self) -> Reader:
        return _reader("train.txt", True)

    def test(self) -> Reader:
        return _reader("test.txt", True)

    def infer(self) -> Reader:
        return _reader("infer.txt", False)


def train() -> Reader:
    """The samples of train.txt."""
    return Dataset().train()


def test() -> Reader:
    """The samples of test.txt."""
    return Dataset().test()


def infer() -> Reader:
    """The samples of infer.txt (no click)."""
    return Dataset().infer()


def load_data_meta() -> list[int]:
    """``[dnn_input_dim, lr_input_dim]``, from data.meta.txt's two ``name: dim`` lines."""
    lines = read_data("data.meta.txt")
    if len(lines) != 2 or "dnn_input_dim:" not in lines[0] or "lr_input_dim:" not in lines[1]:
        raise ValueError("avazu_ctr_data/data.meta.txt: wrong meta format")
    return [int(line.split(":")[1]) for line in lines]
