"""``paddle.dataset.image``: Paddle's image helpers for its readers (`flowers`), on Pillow
instead of OpenCV.

An image is a uint8 array in HWC layout, colour in OpenCV's BGR order as Paddle's (which reads
with ``cv2.imdecode``), or HW for grey. `load_image_bytes` decodes with Pillow (any format it
reads); `resize_short` scales the shorter side to `size` with Pillow's bicubic filter, so the
pixels differ slightly from OpenCV's bicubic ones while the shapes are Paddle's; the crops,
flip, CHW transpose and mean subtraction are Paddle's, the random ones drawing from numpy's
global generator as Paddle's do. Pillow is imported when an image is decoded or resized; without
it the error says what to install.
"""

from __future__ import annotations

import io
from typing import Any, Sequence

import numpy as np

__all__ = ["center_crop", "left_right_flip", "load_and_transform", "load_image",
           "load_image_bytes", "random_crop", "resize_short", "simple_transform", "to_chw"]


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError("paddle.dataset.image decodes and resizes images with Pillow, which "
                          "is not installed: pip install pillow") from exc
    return Image


def load_image_bytes(data: bytes, is_color: bool = True) -> np.ndarray:
    """The image encoded in `data`: HWC BGR, or HW grey unless `is_color`."""
    with _pillow().open(io.BytesIO(data)) as im:
        pixels = np.asarray(im.convert("RGB" if is_color else "L"))
    return np.ascontiguousarray(pixels[:, :, ::-1]) if is_color else pixels


def load_image(file: str, is_color: bool = True) -> np.ndarray:
    """The image in the file `file` (see `load_image_bytes`)."""
    with open(file, "rb") as f:
        return load_image_bytes(f.read(), is_color)


def resize_short(im: np.ndarray, size: int) -> np.ndarray:
    """`im` scaled (bicubic) so that its shorter side is `size`, the longer one
    ``size * long // short``."""
    h, w = im.shape[:2]
    h_new, w_new = (size * h // w, size) if h > w else (size, size * w // h)
    image = _pillow()
    resized = image.fromarray(im).resize((w_new, h_new), image.Resampling.BICUBIC)
    return np.asarray(resized)


def to_chw(im: np.ndarray, order: Sequence[int] = (2, 0, 1)) -> np.ndarray:
    """HWC to CHW (or `order`)."""
    if len(im.shape) != len(order):
        raise ValueError(f"to_chw: an image of {len(im.shape)} dims, an order of {len(order)}")
    return im.transpose(order)


def center_crop(im: np.ndarray, size: int, is_color: bool = True) -> np.ndarray:
    """The centred `size` x `size` square (its start rounded down)."""
    h, w = im.shape[:2]
    top, left = (h - size) // 2, (w - size) // 2
    return im[top:top + size, left:left + size]


def random_crop(im: np.ndarray, size: int, is_color: bool = True) -> np.ndarray:
    """A `size` x `size` square at a random place (``np.random.randint``)."""
    h, w = im.shape[:2]
    top = np.random.randint(0, h - size + 1)
    left = np.random.randint(0, w - size + 1)
    return im[top:top + size, left:left + size]


def left_right_flip(im: np.ndarray, is_color: bool = True) -> np.ndarray:
    """The image mirrored left to right."""
    return im[:, ::-1]


def simple_transform(im: np.ndarray, resize_size: int, crop_size: int, is_train: bool,
                     is_color: bool = True, mean: Any = None) -> np.ndarray:
    """Paddle's augmentation: `resize_short`, then in training a random crop flipped half the
    time (``np.random.randint(2) == 0``), else the centre crop; CHW float32, less `mean` (one
    value per channel, or per element)."""
    im = resize_short(im, resize_size)
    if is_train:
        im = random_crop(im, crop_size, is_color)
        if np.random.randint(2) == 0:
            im = left_right_flip(im, is_color)
    else:
        im = center_crop(im, crop_size, is_color)
    if im.ndim == 3:
        im = to_chw(im)
    im = im.astype(np.float32)
    if mean is not None:
        means = np.array(mean, dtype=np.float32)
        if means.ndim == 1 and is_color:
            means = means[:, np.newaxis, np.newaxis]
        im -= means
    return im


def load_and_transform(filename: str, resize_size: int, crop_size: int, is_train: bool,
                       is_color: bool = True, mean: Any = None) -> np.ndarray:
    """`simple_transform` of the image in `filename`."""
    return simple_transform(load_image(filename, is_color), resize_size, crop_size, is_train,
                            is_color, mean)
