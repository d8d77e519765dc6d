"""``paddle.dataset.mnist``: MNIST from Paddle's cache, ``DATA_HOME/mnist`` (`common`), in the
original gzipped IDX files (``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
``t10k-images-idx3-ubyte.gz``, ``t10k-labels-idx1-ubyte.gz``).

A sample is Paddle's: ``(image, label)``, the image a float32 vector of rows x cols (784)
pixels scaled to [-1, 1] as ``x / 255 * 2 - 1``, the label an int in [0, 9], in the files'
order. The files are read (whole) when the reader is iterated; they are looked for when
`train` or `test` is called, so a missing one fails there, naming it.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Iterator

import numpy as np

from runtime.paddle.dataset.common import Source, locate
from runtime.paddle.reader import Reader

__all__ = ["fetch", "test", "train"]

URL_PREFIX = "https://dataset.bj.bcebos.com/mnist/"
TRAIN_IMAGE = Source(URL_PREFIX + "train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873")
TRAIN_LABEL = Source(URL_PREFIX + "train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432")
TEST_IMAGE = Source(URL_PREFIX + "t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3")
TEST_LABEL = Source(URL_PREFIX + "t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c")
IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049


def _idx(path: Path, magic: int, dims: int) -> tuple[tuple[int, ...], bytes]:
    """The dims and the data of a gzipped IDX file, checked against its magic number."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    header = struct.unpack_from(f">{dims + 1}I", raw)
    if header[0] != magic:
        raise ValueError(f"{path}: magic number {header[0]}, not {magic}: not an MNIST IDX file")
    return tuple(header[1:]), raw[4 * (dims + 1):]


def _read(images: Path, labels: Path) -> Iterator[tuple[np.ndarray, int]]:
    (count, rows, cols), pixels = _idx(images, IMAGE_MAGIC, 3)
    (label_count,), label_bytes = _idx(labels, LABEL_MAGIC, 1)
    if label_count != count:
        raise ValueError(f"{images} holds {count} images, {labels} {label_count} labels")
    scaled = np.frombuffer(pixels, np.uint8, count * rows * cols).astype(np.float32)
    scaled = (scaled / 255.0 * 2.0 - 1.0).reshape(count, rows * cols)
    for image, label in zip(scaled, label_bytes[:count]):
        yield image, int(label)


def _reader(image: Source, label: Source) -> Reader:
    images, labels = locate("mnist", image, label)
    return lambda: _read(images, labels)


def train() -> Reader:
    """The 60,000 training samples."""
    return _reader(TRAIN_IMAGE, TRAIN_LABEL)


def test() -> Reader:
    """The 10,000 test samples."""
    return _reader(TEST_IMAGE, TEST_LABEL)


def fetch() -> None:
    """Paddle downloads the four files; here they must be there already (one error naming
    those that are not)."""
    locate("mnist", TRAIN_IMAGE, TRAIN_LABEL, TEST_IMAGE, TEST_LABEL)
