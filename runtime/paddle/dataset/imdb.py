"""``paddle.dataset.imdb``: the IMDB reviews of ``aclImdb_v1.tar.gz`` from Paddle's cache,
``DATA_HOME/imdb`` (`common`; Paddle 2's name for it, ``imdb%2FaclImdb_v1.tar.gz``, is found
too).

As Paddle's under Python 3: a review is tokenized as its bytes with trailing newlines dropped,
ASCII punctuation removed, lower-cased and split on whitespace; `word_dict` keeps the words of
every train and test review seen more than 150 times, the most frequent first (equal counts in
byte order), with ``'<unk>'`` last. `train`/`test` yield ``(ids, label)`` per review: the
positive reviews first (label 0), then the negative ones (label 1), each in the archive's
order; they read the archive when called.
"""

from __future__ import annotations

import collections
import re
import string
import tarfile
from pathlib import Path
from typing import Iterator, Pattern, Union

from runtime.paddle.dataset.common import Source, locate
from runtime.paddle.reader import Reader

__all__ = ["build_dict", "fetch", "test", "tokenize", "train", "word_dict"]

SOURCE = Source("http://ai.stanford.edu/%7Eamaas/data/sentiment/aclImdb_v1.tar.gz",
                "7c2ac02c03563afcf9b574c7e56c153a", also=("imdb%2FaclImdb_v1.tar.gz",))
PUNCTUATION = string.punctuation.encode("ascii")
Word = Union[bytes, str]
"""A review's word (bytes), or ``'<unk>'``."""


def _archive() -> Path:
    return locate("imdb", SOURCE)[0]


def tokenize(pattern: Pattern[str]) -> Iterator[list[bytes]]:
    """The words of each review whose archive name `pattern` matches, in archive order."""
    with tarfile.open(_archive()) as tar:
        for member in tar:  # sequential: the archive is read once, front to back
            if pattern.match(member.name):
                f = tar.extractfile(member)
                if f is not None:
                    text = f.read().rstrip(b"\n\r").translate(None, PUNCTUATION)
                    yield text.lower().split()


def build_dict(pattern: Pattern[str], cutoff: int) -> dict[Word, int]:
    """Word -> id of the words of the matching reviews seen more than `cutoff` times, most
    frequent first; ``'<unk>'`` last."""
    freq: collections.Counter[bytes] = collections.Counter()
    for words in tokenize(pattern):
        freq.update(words)
    kept = sorted(((w, c) for w, c in freq.items() if c > cutoff), key=lambda x: (-x[1], x[0]))
    word_idx: dict[Word, int] = {word: i for i, (word, _) in enumerate(kept)}
    word_idx["<unk>"] = len(kept)
    return word_idx


def word_dict() -> dict[Word, int]:
    """Paddle's dictionary: every review's words seen more than 150 times."""
    return build_dict(re.compile(r"aclImdb/((train)|(test))/((pos)|(neg))/.*\.txt$"), 150)


def _reader(part: str, word_idx: dict[Word, int]) -> Reader:
    unk = word_idx["<unk>"]
    samples = [([word_idx.get(w, unk) for w in words], label)
               for label, kind in enumerate(("pos", "neg"))
               for words in tokenize(re.compile(rf"aclImdb/{part}/{kind}/.*\.txt$"))]
    return lambda: iter(samples)


def train(word_idx: dict[Word, int]) -> Reader:
    """The 25,000 training reviews as ``(ids, label)``."""
    return _reader("train", word_idx)


def test(word_idx: dict[Word, int]) -> Reader:
    """The 25,000 test reviews as ``(ids, label)``."""
    return _reader("test", word_idx)


def fetch() -> None:
    """Paddle downloads the archive; here it must be there already."""
    _archive()
