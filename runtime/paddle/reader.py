"""``paddle.reader`` for a ported script: Paddle's reader decorators.

A reader is a function that returns a fresh iterator of samples (`Reader`); each decorator
takes readers and returns a new one, reading its inputs only when iterated (but `cache`, which
reads its input once, at once). `shuffle` uses Python's `random` module, as Paddle's does, so a
script that seeds ``random`` gets the same order on every run.

DESIGN: `buffered` reads ahead in a thread, as Paddle's does (an error there reaches the
consumer; a consumer that stops early stops the thread). `xmap_readers` maps in the reading
thread, one sample after another: its output is Paddle's ``order=True`` output whatever
`order` says (Paddle's unordered output is whichever of its threads finished first, of which
this order is one), and `process_num` and `buffer_size` are checked but spawn nothing, since
the mappers a script gives are Python code that threads would not run side by side anyway.
"""

from __future__ import annotations

import itertools
import queue
import random
import threading
from typing import Any, Callable, Iterator

Reader = Callable[[], Iterator[Any]]
"""Paddle's reader: a function returning a fresh iterator."""

_END = object()
"""Marks a reader's end in `buffered`'s queue and `compose`'s zip."""


class ComposeNotAligned(ValueError):
    """`compose`'s readers ran out at different samples."""


def cache(reader: Reader) -> Reader:
    """Every sample of `reader`, read once now and kept in memory."""
    samples = tuple(reader())

    def cached() -> Iterator[Any]:
        yield from samples
    return cached


def map_readers(func: Callable[..., Any], *readers: Reader) -> Reader:
    """``func(a, b, ...)`` of the readers' samples taken side by side (until one runs out)."""
    def mapped() -> Iterator[Any]:
        yield from map(func, *(r() for r in readers))
    return mapped


def shuffle(reader: Reader, buf_size: int) -> Reader:
    """`reader`'s samples in `buf_size` chunks, each shuffled (`random.shuffle`) before it is
    yielded: a sample moves at most within its chunk."""
    if buf_size < 1:
        raise ValueError(f"shuffle: buf_size must be >= 1, got {buf_size}")

    def shuffled() -> Iterator[Any]:
        chunk: list[Any] = []
        for sample in reader():
            chunk.append(sample)
            if len(chunk) == buf_size:
                random.shuffle(chunk)
                yield from chunk
                chunk = []
        random.shuffle(chunk)
        yield from chunk
    return shuffled


def chain(*readers: Reader) -> Reader:
    """Every sample of the first reader, then of the second, and so on."""
    def chained() -> Iterator[Any]:
        for r in readers:
            yield from r()
    return chained


def _flat(sample: Any) -> tuple[Any, ...]:
    return sample if isinstance(sample, tuple) else (sample,)


def compose(*readers: Reader, check_alignment: bool = True) -> Reader:
    """The readers' samples side by side as one tuple (a tuple sample's fields in place): from
    ``(1, 2)``, ``3`` and ``(4, 5)``, ``(1, 2, 3, 4, 5)``. With `check_alignment` a reader that
    ends before the others is a `ComposeNotAligned`; without, the output stops at the
    shortest."""
    def composed() -> Iterator[tuple[Any, ...]]:
        iterators = [r() for r in readers]
        rows: Iterator[tuple[Any, ...]] = (
            itertools.zip_longest(*iterators, fillvalue=_END) if check_alignment
            else zip(*iterators))
        for row in rows:
            if any(sample is _END for sample in row):
                raise ComposeNotAligned("outputs of readers are not aligned.")
            yield tuple(field for sample in row for field in _flat(sample))
    return composed


def buffered(reader: Reader, size: int) -> Reader:
    """`reader`'s samples, read ahead by a thread into a buffer of up to `size` samples."""
    def read_ahead() -> Iterator[Any]:
        buffer: queue.Queue[Any] = queue.Queue(maxsize=max(size, 1))
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    buffer.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    pass
            return False

        def fill() -> None:
            try:
                for sample in reader():
                    if not put(sample):
                        return
            except BaseException as exc:  # handed to the consumer, raised there
                put(_Failed(exc))
                return
            put(_END)

        worker = threading.Thread(target=fill, name="paddle.reader.buffered", daemon=True)
        worker.start()
        try:
            while True:
                item = buffer.get()
                if item is _END:
                    return
                if isinstance(item, _Failed):
                    raise item.exc
                yield item
        finally:
            stop.set()
    return read_ahead


class _Failed:
    """An exception of `buffered`'s reading thread, on its way to the consumer."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def firstn(reader: Reader, n: int) -> Reader:
    """At most the first `n` samples of `reader`."""
    def first() -> Iterator[Any]:
        yield from itertools.islice(reader(), n)
    return first


def xmap_readers(mapper: Callable[[Any], Any], reader: Reader, process_num: int,
                 buffer_size: int, order: bool = False) -> Reader:
    """``mapper(sample)`` of every sample of `reader`, in order, in the reading thread (see the
    module)."""
    if process_num < 1 or buffer_size < 1:
        raise ValueError(f"xmap_readers: process_num and buffer_size must be >= 1, got "
                         f"{process_num} and {buffer_size}")

    def xmapped() -> Iterator[Any]:
        yield from map(mapper, reader())
    return xmapped


__all__ = ["ComposeNotAligned", "Reader", "buffered", "cache", "chain", "compose", "firstn",
           "map_readers", "shuffle", "xmap_readers"]
