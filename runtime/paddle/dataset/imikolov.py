"""``paddle.dataset.imikolov``: the Penn Treebank of Mikolov's ``simple-examples.tgz`` from
Paddle's cache, ``DATA_HOME/imikolov`` (`common`; the name Paddle 2 saves it under,
``imikolov%2Fsimple-examples.tgz``, is found too). Training reads
``simple-examples/data/ptb.train.txt``, testing ``ptb.valid.txt``.

As Paddle's under Python 3: words are the archive's bytes (``b'the'``) and the markers are
str: ``'<s>'`` and ``'<e>'`` (counted once per line) and ``'<unk>'`` (the last id, for words
not in the dictionary; the corpus's own ``b'<unk>'`` is an ordinary word). `build_dict` keeps
the words seen more than `min_word_freq` times in both files, the most frequent first, equal
counts in byte order (a marker as its UTF-8 bytes: where Paddle would compare a str with bytes
and fail). `train`/`test` yield, per line, ``NGRAM`` tuples of `n` consecutive ids of ``<s>
line <e>``, or a ``SEQ`` pair ``(<s> + ids, ids + <e>)`` (lines whose first exceeds `n` > 0
left out).
"""

from __future__ import annotations

import collections
import tarfile
from pathlib import Path
from typing import IO, Iterable, Iterator, Union

from runtime.paddle.dataset.common import Source, locate
from runtime.paddle.reader import Reader

__all__ = ["DataType", "build_dict", "fetch", "test", "train"]

SOURCE = Source("http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz",
                "30177ea32e27c525793142b6bf2c8e2d", also=("imikolov%2Fsimple-examples.tgz",))
TRAIN_FILE = "./simple-examples/data/ptb.train.txt"
TEST_FILE = "./simple-examples/data/ptb.valid.txt"
Word = Union[bytes, str]
"""A corpus word (bytes) or a marker (str), as Paddle's dictionary keys them."""


class DataType:
    """What a reader yields: n-gram tuples, or (source, target) sequences."""

    NGRAM = 1
    SEQ = 2


def _archive() -> Path:
    return locate("imikolov", SOURCE)[0]


def _lines(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    """The member `name` of the archive, with or without its leading ``./``."""
    wanted = name.removeprefix("./")
    for member in tar.getmembers():
        if member.name.removeprefix("./") == wanted:
            f = tar.extractfile(member)
            if f is not None:
                return f
    raise ValueError(f"imikolov: the archive has no {name!r}: not Mikolov's simple-examples.tgz")


def _count(lines: Iterable[bytes], freq: collections.Counter[Word]) -> None:
    for line in lines:
        freq.update(line.split())
        freq.update(("<s>", "<e>"))


def _order(item: tuple[Word, int]) -> tuple[int, bytes]:
    word, count = item
    return -count, word.encode() if isinstance(word, str) else word


def build_dict(min_word_freq: int = 50) -> dict[Word, int]:
    """Word -> id of the words of both files seen more than `min_word_freq` times, most
    frequent first; ``'<unk>'`` last."""
    freq: collections.Counter[Word] = collections.Counter()
    with tarfile.open(_archive()) as tar:
        for name in (TRAIN_FILE, TEST_FILE):
            _count(_lines(tar, name), freq)
    freq.pop("<unk>", None)
    kept = sorted(((w, c) for w, c in freq.items() if c > min_word_freq), key=_order)
    word_idx: dict[Word, int] = {word: i for i, (word, _) in enumerate(kept)}
    word_idx["<unk>"] = len(kept)
    return word_idx


def _samples(ids: list[int], word_idx: dict[Word, int], n: int,
             data_type: int) -> Iterator[tuple[int, ...] | tuple[list[int], list[int]]]:
    unk = word_idx["<unk>"]
    start, end = word_idx.get("<s>", unk), word_idx.get("<e>", unk)
    if data_type == DataType.NGRAM:
        line = [start, *ids, end]
        for i in range(n, len(line) + 1):
            yield tuple(line[i - n:i])
    elif data_type == DataType.SEQ:
        if n <= 0 or len(ids) + 1 <= n:
            yield [start, *ids], [*ids, end]
    else:
        raise ValueError(f"unknown data type {data_type!r}: DataType.NGRAM or DataType.SEQ")


def _reader(name: str, word_idx: dict[Word, int], n: int, data_type: int) -> Reader:
    if data_type == DataType.NGRAM and n < 0:
        raise ValueError(f"imikolov: n-gram length {n} is negative")
    archive, unk = _archive(), word_idx["<unk>"]

    def samples() -> Iterator[tuple[int, ...] | tuple[list[int], list[int]]]:
        with tarfile.open(archive) as tar:
            for line in _lines(tar, name):
                ids = [word_idx.get(w, unk) for w in line.split()]
                yield from _samples(ids, word_idx, n, data_type)
    return samples


def train(word_idx: dict[Word, int], n: int, data_type: int = DataType.NGRAM) -> Reader:
    """The samples of ``ptb.train.txt``: `n` the n-gram length, or the longest source
    sequence (0: any)."""
    return _reader(TRAIN_FILE, word_idx, n, data_type)


def test(word_idx: dict[Word, int], n: int, data_type: int = DataType.NGRAM) -> Reader:
    """The samples of ``ptb.valid.txt`` (Paddle tests on the validation file)."""
    return _reader(TEST_FILE, word_idx, n, data_type)


def fetch() -> None:
    """Paddle downloads the archive; here it must be there already."""
    _archive()
