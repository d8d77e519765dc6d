"""``paddle.dataset.flowers``: Oxford's 102 flowers from Paddle's cache, ``DATA_HOME/flowers``
(`common`): the images in ``102flowers.tgz`` (``jpg/image_NNNNN.jpg``), their classes in
``imagelabels.mat`` and the split in ``setid.mat``.

As Paddle's: `train` reads the set ``tstid`` and `test` the set ``trnid`` (the official test
set is the larger, so Paddle swaps them), `valid` the set ``valid``; a sample is the mapper's
output of ``(jpeg bytes, label)``, label the class less 1 (0..101); the default mappers decode
to BGR, resize the short side to 256, crop 224 (random and flipped half the time in training,
centred otherwise), and give the CHW image less the per-channel mean [103.94, 116.78, 123.68]
as a flat float32 vector (`image`). Images come in the archive's order (Paddle first copies them
into batch files, in an order of the file system's, and maps them in threads unordered).

Reading the ``.mat`` files needs scipy and decoding the images Pillow (`image`): the ``[data]``
extra installs both (scipy with its scikit-learn); without them the reader's error says to
``pip install scipy pillow``.
"""

from __future__ import annotations

import functools
import os
import tarfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from runtime.paddle.dataset import image
from runtime.paddle.dataset.common import Source, locate
from runtime.paddle.reader import Reader, map_readers, xmap_readers

__all__ = ["default_mapper", "fetch", "test", "test_mapper", "train", "train_mapper", "valid"]

DATA = Source("http://paddlemodels.cdn.bcebos.com/flowers/102flowers.tgz",
              "52808999861908f626f3c1f4e79d11fa")
LABEL = Source("http://paddlemodels.cdn.bcebos.com/flowers/imagelabels.mat",
               "e0620be6f572b9609742df49c70aed4d")
SETID = Source("http://paddlemodels.cdn.bcebos.com/flowers/setid.mat",
               "a5357ecc9cb78c4bef273ce3793fc85c")
TRAIN_FLAG, TEST_FLAG, VALID_FLAG = "tstid", "trnid", "valid"
MEAN = [103.94, 116.78, 123.68]
Sample = tuple[bytes, int]


def default_mapper(is_train: bool, sample: Sample) -> tuple[np.ndarray, int]:
    """Paddle's mapper: the decoded, resized, cropped, mean-subtracted image, flattened."""
    data, label = sample
    im = image.simple_transform(image.load_image_bytes(data), 256, 224, is_train, mean=MEAN)
    return im.flatten().astype(np.float32), label


train_mapper = functools.partial(default_mapper, True)
test_mapper = functools.partial(default_mapper, False)


def _loadmat() -> Callable[[Path], dict[str, Any]]:
    try:
        import scipy.io
        import PIL  # noqa: F401  (the mappers decode with it: fail before reading anything)
    except ImportError as exc:
        raise ImportError("paddle.dataset.flowers reads imagelabels.mat and setid.mat with "
                          "scipy and decodes the images with Pillow: pip install scipy "
                          f"pillow ({exc})") from exc
    return scipy.io.loadmat  # type: ignore[no-any-return]


def _labels(label_file: Path, setid_file: Path, flag: str) -> dict[str, int]:
    """Archive name -> label (0-based) of each image of the set `flag`."""
    loadmat = _loadmat()
    labels, ids = loadmat(label_file)["labels"][0], loadmat(setid_file)[flag][0]
    return {f"jpg/image_{int(i):05d}.jpg": int(labels[int(i) - 1]) - 1 for i in ids}


def _images(data_file: Path, labels: dict[str, int], cycle: bool) -> Iterator[Sample]:
    while True:
        with tarfile.open(data_file) as tar:
            for member in tar:
                if member.name in labels:
                    f = tar.extractfile(member)
                    if f is not None:
                        yield f.read(), labels[member.name]
        if not cycle:
            return


def _reader(flag: str, mapper: Callable[[Sample], Any], buffered_size: int, use_xmap: bool,
            cycle: bool = False) -> Reader:
    data_file, label_file, setid_file = locate("flowers", DATA, LABEL, SETID)
    labels = _labels(label_file, setid_file, flag)

    def samples() -> Iterator[Sample]:
        return _images(data_file, labels, cycle)
    if use_xmap:
        workers = int(os.environ.get("CPU_NUM", os.cpu_count() or 1))
        return xmap_readers(mapper, samples, workers, buffered_size, order=True)
    return map_readers(mapper, samples)


def train(mapper: Callable[[Sample], Any] = train_mapper, buffered_size: int = 1024,
          use_xmap: bool = True, cycle: bool = False) -> Reader:
    """The training set (``tstid``: 6,149 images), endlessly with `cycle`."""
    return _reader(TRAIN_FLAG, mapper, buffered_size, use_xmap, cycle)


def test(mapper: Callable[[Sample], Any] = test_mapper, buffered_size: int = 1024,
         use_xmap: bool = True, cycle: bool = False) -> Reader:
    """The test set (``trnid``: 1,020 images)."""
    return _reader(TEST_FLAG, mapper, buffered_size, use_xmap, cycle)


def valid(mapper: Callable[[Sample], Any] = test_mapper, buffered_size: int = 1024,
          use_xmap: bool = True) -> Reader:
    """The validation set (``valid``: 1,020 images)."""
    return _reader(VALID_FLAG, mapper, buffered_size, use_xmap)


def fetch() -> None:
    """Paddle downloads the three files; here they must be there already."""
    locate("flowers", DATA, LABEL, SETID)
