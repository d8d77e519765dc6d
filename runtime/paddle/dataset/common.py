"""Where Paddle's data sets are: ``paddle.dataset.common`` of fluid 1.x, without the network.

Paddle keeps each data set's files in its cache, ``DATA_HOME/<module>/<file>``, with
``DATA_HOME`` = ``~/.cache/paddle/dataset`` (``os.path.expanduser`` when the module is
imported, so ``$HOME`` decides; no environment variable of its own), and downloads a file
there when it is missing or its MD5 differs. pslab never downloads: a reader finds its files
where Paddle would have put them (`locate`, `download`), and a missing one is a
`DatasetFileMissing` naming each file, the URL it comes from, its MD5 and where to put it. A
file present is read as it is (its MD5 is not checked: `md5file` computes it for one who wants
to). ``DATA_HOME`` is read when a reader is made, so a script may set
``paddle.dataset.common.DATA_HOME`` first, as with Paddle.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DATA_HOME", "DatasetFileMissing", "Source", "download", "locate", "md5file"]

DATA_HOME = os.path.expanduser("~/.cache/paddle/dataset")
"""Paddle's cache of data sets; each module's files are in ``DATA_HOME/<module>``."""


@dataclass(frozen=True)
class Source:
    """One file of a data set: where Paddle downloads it from, its MD5, the name Paddle saves it
    under (default: the URL's last part) and other names a Paddle version saved it under."""

    url: str
    md5: str
    name: str = ""
    also: tuple[str, ...] = ()

    @property
    def file_name(self) -> str:
        return self.name or self.url.rsplit("/", 1)[-1]


class DatasetFileMissing(FileNotFoundError):
    """A data set's file is not in Paddle's cache: the message says which, from where, and
    where to put it. `missing` holds each such path and its `Source`."""

    def __init__(self, module: str, missing: list[tuple[Path, Source]]) -> None:
        self.module = module
        self.missing = missing
        files = "; ".join(f"{path} (from {source.url}, md5 {source.md5})"
                          for path, source in missing)
        super().__init__(
            f"paddle.dataset.{module}: missing {files}. pslab reads Paddle's data sets from "
            f"Paddle's cache and never downloads: fetch each file and put it at that path "
            f"(paddle.dataset.common.DATA_HOME/{module}/, DATA_HOME being {DATA_HOME})")


def md5file(fname: str | os.PathLike[str]) -> str:
    """The hex MD5 of a file, as Paddle compares it with a data set's."""
    digest = hashlib.md5()
    with open(fname, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _found(folder: Path, source: Source) -> Path | None:
    for name in (source.file_name,) + source.also:
        if (folder / name).is_file():
            return folder / name
    return None


def locate(module: str, *sources: Source) -> list[Path]:
    """The paths of `module`'s files in ``DATA_HOME`` (read now), in the order given; one
    `DatasetFileMissing` naming every file that is not there."""
    folder = Path(DATA_HOME) / module
    found = [_found(folder, source) for source in sources]
    missing = [(folder / s.file_name, s) for s, path in zip(sources, found) if path is None]
    if missing:
        raise DatasetFileMissing(module, missing)
    return [path for path in found if path is not None]


def download(url: str, module_name: str, md5sum: str, save_name: str | None = None) -> str:
    """Paddle's ``common.download``, which here only finds the file: its path in
    ``DATA_HOME/module_name`` (named `save_name`, else the URL's last part), or
    `DatasetFileMissing`. A script's own reader (fluid's ``dist_ctr_reader.py``) calls it."""
    return str(locate(module_name, Source(url, md5sum, save_name or ""))[0])
