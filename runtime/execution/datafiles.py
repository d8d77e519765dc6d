"""Data of one's own, read from a file: npz arrays, csv columns, libsvm lines or Criteo logs.

A file is a table of records (an npz's rows, a text file's non-blank lines) whose columns map to
the model's feeds by name: `feeds` says, per feed, which column or columns fill it (a name, an
fnmatch pattern such as ``"px*"``, or a list of them, taken in file order); a feed it does not
mention reads the column of its own name. A dense feed of shape ``[d]`` takes ``d`` column values
per record; a LoD feed (``lod_level`` 1, e.g. ids) takes the record's values as one sequence.
Values are converted to the feed's declared dtype.

Records are read as the built-in data sets are (`runtime.execution.data`): step ``s`` of
``T`` trainers with ``B`` examples each reads the global batch of stream positions
``[s*B*T, (s+1)*B*T)``, and trainer ``t`` the ``t``-th slice of ``B``; position ``p`` is record
``p mod N`` (epochs wrap around), or with `shuffle` the ``p mod N``-th record of epoch
``p // N``'s permutation, drawn from the seed and the epoch. So the trainers of a sync job
together train on exactly the batches local training reads.

Files larger than memory are streamed. An npz's arrays stored uncompressed (`np.savez`) are
memory-mapped where they lie inside the zip (numpy's ``np.load(mmap_mode=...)`` does not map the
members of an npz); compressed ones (`np.savez_compressed`) are decompressed as a stream. Text
files are read line by line, parsing only the records a trainer needs: no pass over the whole
file happens before training (the number of records is learnt at the first end of file),
except with `shuffle`, which first indexes where each record starts (16 bytes a record).

Every error names the file, the line (or npz array) and the column, e.g.
``data.csv:17: column 'x3': could not convert 'abc' to float32``; a feed that no column fills, or
whose columns do not fit its declared shape or dtype, is named when the data set is opened,
before training starts.

Formats:

- ``npz``: each array is a column whose rows are its first axis; the arrays all have N rows.
- ``csv``: a header line names the columns (or, with ``header: false``, they are ``c0, c1,
  ...``); one record a line, fields split by `delimiter` (quoting as Python's `csv` reads it).
- ``libsvm``: ``label idx:value idx:value ...``; the columns are ``label`` and ``features``.
  ``features`` fills a dense feed as the vector with ``value`` at ``idx`` (indices 1-based, as
  libsvm's are, unless `zero_based`) and zeros elsewhere, or a LoD int64 feed as the sequence of
  its indices (the values unused). Labels are taken as written: a softmax model needs classes
  0..k-1, not libsvm's customary -1/+1.
- ``criteo``: the Criteo display-advertising logs: tab-separated ``label``, 13 integer features
  ``I1..I13`` and 26 categorical features ``C1..C26`` (32-bit hashes, 8 hex digits), any field
  but the label possibly empty. An empty integer is 0, and with `log_ints` (the default) an
  integer ``x`` becomes ``log(1 + max(x, 0))``, as is customary for these heavy-tailed counts. A
  categorical value ``h`` of column ``Cj`` becomes the id ``1 + (h + (j-1) * 1000003) mod
  (V - 1)``, ``V`` the rows of the embedding table the feed looks up (so columns sharing a table
  do not share ids for equal hashes), and an empty one the id 0. By default the model's label
  feed reads ``label``, a float feed of width 13 reads ``I1..I13``, and the model's LoD feeds
  share ``C1..C26`` in order, as evenly as they split (26 slots: one each; `ctr_dnn`'s default
  two: ``C1..C13`` and ``C14..C26``), each record's values of a slot one sequence.
"""

from __future__ import annotations

import csv
import struct
import weakref
import zipfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

import numpy as np

from transpiler.models import Model

from runtime.execution.data import DataError, Feed, epoch_permutation, stream_start
from runtime.execution.tensor import Phantom

FORMATS = ("npz", "csv", "libsvm", "criteo")

FeedSources = Mapping[str, str | Sequence[str]]

CRITEO_INTS = [f"I{j}" for j in range(1, 14)]
CRITEO_CATS = [f"C{j}" for j in range(1, 27)]
CRITEO_COLUMNS = ["label"] + CRITEO_INTS + CRITEO_CATS
CRITEO_STRIDE = 1000003  # spreads equal hashes of different columns apart


@dataclass(frozen=True)
class FileOptions:
    """How to read a file; each field belongs to the formats its name says."""

    shuffle: bool = False  # every epoch a permutation of the records, seeded
    seed: int = 0
    size: int | None = None  # read only the first `size` records
    header: bool = True  # csv: the first line names the columns
    delimiter: str = ","  # csv
    zero_based: bool = False  # libsvm: feature indices start at 0 (libsvm's own start at 1)
    log_ints: bool = True  # criteo: log(1 + max(x, 0)) of the integer features


@dataclass(frozen=True)
class Target:
    """A feed as the model declares it: dtype, the shape of one example, and LoD or not."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    lod: bool
    vocab: int | None  # rows of the embedding table the feed looks up, if it is ids
    is_label: bool = False  # the model's label feed

    @property
    def width(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)}" + (" (LoD)" if self.lod else "")


def targets(model: Model) -> dict[str, Target]:
    """The model's feeds, in declaration order."""
    block = model.main.global_block()
    tables = {op.input("Ids")[0]: block.var(op.input("W")[0]).shape[0]
              for op in block.ops if op.type in ("lookup_table", "lookup_table_v2")}
    out = {}
    for name in model.feeds:
        var = block.var(name)
        vocab = tables.get(name, model.data_params.get("vocab"))
        out[name] = Target(name, np.dtype(var.dtype), tuple(var.shape[1:]), var.lod_level > 0,
                           int(vocab) if vocab else None, name == model.label)
    return out


# -- which columns fill a feed ----------------------------------------------------------------------

def select(columns: Sequence[str], source: str | Sequence[str], feed: str, where: str) -> list[int]:
    """Indices (file order) of the columns `source` names: names or fnmatch patterns."""
    items = [source] if isinstance(source, str) else list(source)
    if not items:
        raise DataError(f"{where}: feeds.{feed}: names no column")
    picked: list[int] = []
    for item in items:
        if item in columns:
            picked.append(list(columns).index(item))
            continue
        matched = [i for i, c in enumerate(columns) if fnmatchcase(c, str(item))]
        if not matched:
            raise DataError(f"{where}: feeds.{feed}: no column {item!r}; the file has "
                            f"{_listing(columns)}")
        picked += matched
    return picked


def _listing(columns: Sequence[str]) -> str:
    shown = ", ".join(repr(c) for c in columns[:12])
    return f"columns {shown}" + (f", ... ({len(columns)} in all)" if len(columns) > 12 else "")


def _check_width(target: Target, width: int, names: Sequence[str], where: str) -> None:
    """`width` values per record fit the feed: all of a dense one, whole elements of a LoD one."""
    fits = width % target.width == 0 if target.lod else width == target.width
    if not fits or width == 0:
        cols = ", ".join(repr(n) for n in names[:6]) + (", ..." if len(names) > 6 else "")
        raise DataError(f"{where}: feed {target.name!r} is {target.describe()}, but its "
                        f"column(s) {cols} hold {width} value(s) a record")


def _as_feed(target: Target, values: np.ndarray) -> Any:
    """A feed value from `values`, one row of column values per record."""
    rows = len(values)
    if not target.lod:
        return values.reshape((rows,) + target.shape)
    per = values.shape[1] // target.width if values.ndim > 1 else 1
    lod = [list(range(0, rows * per + 1, per))] if rows else [[0]]
    return values.reshape((rows * per,) + target.shape), lod


def _ragged_feed(target: Target, sequences: list[np.ndarray]) -> Any:
    """A LoD feed of one sequence per record."""
    lengths = [len(s) for s in sequences]
    values = np.concatenate(sequences) if sequences else np.zeros(0, target.dtype)
    return (values.astype(target.dtype).reshape((-1,) + target.shape),
            [np.concatenate([[0], np.cumsum(lengths)]).astype(int).tolist()])


# -- record order ---------------------------------------------------------------------------------

class Order:
    """Which record stream position `p` reads: ``p mod N``, or with `shuffle` the ``p mod N``-th
    of epoch ``p // N``'s seeded permutation (the last epoch's kept)."""

    def __init__(self, count: int, shuffle: bool, seed: int) -> None:
        self.count, self.shuffle, self.seed = count, shuffle, seed
        self._epoch, self._perm = -1, np.zeros(0, dtype=np.int64)

    def record(self, position: int) -> int:
        epoch, offset = divmod(position, self.count)
        if not self.shuffle:
            return offset
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, epoch_permutation(self.seed, epoch, self.count)
        return int(self._perm[offset])


# -- readers: one trainer's access to a file --------------------------------------------------------

class Reader(ABC):
    """Reads the feeds of stream positions; each trainer has one (its own file handles)."""

    @abstractmethod
    def feed(self, positions: range, names: Sequence[str]) -> Feed: ...

    def close(self) -> None:
        """Release file handles."""


class FileDataset:
    """A file read as a data set: `shard(t, T)` is trainer `t`'s slice of every global batch."""

    def __init__(self, kind: str, path: Path, model: Model, feeds: FeedSources | None,
                 options: FileOptions = FileOptions()) -> None:
        if kind not in FORMATS:
            raise DataError(f"unknown data format {kind!r}; one of {list(FORMATS)}")
        if not path.is_file():
            raise DataError(f"{path}: no such file" + ("" if path.exists() else
                            " (a relative data.path starts from the scenario file's folder)"))
        self.kind, self.path, self.options = kind, path, options
        self.name = f"{kind}:{path.name}"
        self.targets = targets(model)
        unknown = [name for name in feeds or {} if name not in self.targets]
        if unknown:
            raise DataError(f"{path}: feeds.{unknown[0]}: model {model.name!r} has no such feed; "
                            f"its feeds are {list(self.targets)}")
        self._open: Callable[[], Reader] = OPENERS[kind](path, self.targets, dict(feeds or {}),
                                                         options)
        self._whole: FileShard | None = None
        first = self.shard(0, 1)
        try:
            first.batch(0, 1)  # the first record parses, before training starts
        finally:
            first.reader.close()

    @property
    def fields(self) -> list[str]:
        return list(self.targets)

    def shard(self, trainer_id: int, trainers: int) -> "FileShard":
        if trainers < 1 or not 0 <= trainer_id < trainers:
            raise DataError(f"shard: trainer_id {trainer_id} is not in [0, trainers={trainers})")
        return FileShard(self._open(), trainer_id, trainers)

    def batch(self, step: int, batch_size: int, feeds: Sequence[str] | None = None) -> Feed:
        """The whole (unsharded) batch of `step`."""
        if self._whole is None:
            self._whole = self.shard(0, 1)
        return self._whole.batch(step, batch_size, feeds)

    def phantom_batch(self, batch_size: int, feeds: Sequence[str] | None = None) -> dict[str, Phantom]:
        """Timing mode's batch: the shapes of the first batch."""
        out = {}
        for name, value in self.shard(0, 1).batch(0, batch_size, feeds).items():
            if isinstance(value, tuple):
                array, lod = value
                out[name] = Phantom(array.shape, array.dtype, lod=tuple(map(tuple, lod)))
            else:
                out[name] = Phantom(value.shape, value.dtype)
        return out

    def check_model(self, model: Model) -> None:
        """Opening the file checked it against `model`'s feeds; another model must match them."""
        if targets(model) != self.targets:
            raise DataError(f"{self.path}: opened for other feeds than model {model.name!r}'s")


@dataclass
class FileShard:
    """Trainer `trainer_id`'s slice of every global batch of a file."""

    reader: Reader
    trainer_id: int
    trainers: int

    def batch(self, step: int, batch_size: int, feeds: Sequence[str] | None = None) -> Feed:
        start = stream_start(step, batch_size, self.trainer_id, self.trainers)
        return self.reader.feed(range(start, start + batch_size), list(feeds or []))

    def batches(self, batch_size: int, steps: int, feeds: Sequence[str] | None = None,
                start: int = 0) -> Any:
        for step in range(start, start + steps):
            yield self.batch(step, batch_size, feeds)


# -- npz ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Member:
    """One array of an npz: where its data starts in the file (stored) or in its member
    (compressed), its dtype, shape and order."""

    name: str
    info: zipfile.ZipInfo
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fortran: bool
    start: int  # data offset: in the zip file when stored, in the member when compressed

    @property
    def stored(self) -> bool:
        return self.info.compress_type == zipfile.ZIP_STORED

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize


def _npz_members(path: Path) -> dict[str, _Member]:
    members = {}
    try:
        with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                name = info.filename[:-4]
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, fortran, dtype = read(f)
                    header = f.tell()
                if dtype.hasobject:
                    raise DataError(f"{path}: array {name!r} holds Python objects; only numeric "
                                    "arrays can be read")
                if not shape:
                    raise DataError(f"{path}: array {name!r} is a scalar; a column needs a row "
                                    "per record")
                start = header
                if info.compress_type == zipfile.ZIP_STORED:
                    raw.seek(info.header_offset + 26)
                    name_len, extra_len = struct.unpack("<HH", raw.read(4))
                    start += info.header_offset + 30 + name_len + extra_len
                members[name] = _Member(name, info, dtype, tuple(shape), fortran, start)
    except (zipfile.BadZipFile, ValueError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{path}: not an npz file: {err}") from None
    if not members:
        raise DataError(f"{path}: holds no arrays")
    return members


class _NpzReader(Reader):
    def __init__(self, path: Path, members: dict[str, _Member], plan: dict[str, list[str]],
                 targets: dict[str, Target], order: Order) -> None:
        self.path, self.plan, self.targets, self.order = path, plan, targets, order
        self._zip: zipfile.ZipFile | None = None
        self._streams: dict[str, IO[bytes]] = {}
        self._arrays: dict[str, np.ndarray] = {}
        for name in {n for names in plan.values() for n in names}:
            m = members[name]
            if m.stored:
                self._arrays[name] = np.memmap(path, m.dtype, "r", offset=m.start, shape=m.shape,
                                               order="F" if m.fortran else "C")
            else:
                self._zip = self._zip or zipfile.ZipFile(path)
                self._streams[name] = self._zip.open(m.info)
        self.members = members
        weakref.finalize(self, _close_all, list(self._streams.values()), self._zip)

    def _rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        if name in self._arrays:
            return np.asarray(self._arrays[name][rows])
        m, stream = self.members[name], self._streams[name]
        parts, i = [], 0
        while i < len(rows):  # contiguous runs, one read each
            j = i + 1
            while j < len(rows) and rows[j] == rows[j - 1] + 1:
                j += 1
            _advance(stream, m.start + int(rows[i]) * m.row_bytes)
            data = stream.read((j - i) * m.row_bytes)
            parts.append(np.frombuffer(data, m.dtype).reshape((j - i,) + m.shape[1:]))
            i = j
        return np.concatenate(parts)

    def feed(self, positions: range, names: Sequence[str]) -> Feed:
        rows = np.array([self.order.record(p) for p in positions], dtype=np.int64)
        out = {}
        for feed in names or list(self.plan):
            target = self.targets[feed]
            cols = [self._rows(n, rows).reshape(len(rows), -1) for n in self.plan[feed]]
            values = np.concatenate(cols, axis=1) if len(cols) > 1 else cols[0]
            out[feed] = _as_feed(target, values.astype(target.dtype, copy=False))
        return out

    def close(self) -> None:
        _close_all(list(self._streams.values()), self._zip)


def _advance(stream: IO[bytes], offset: int, chunk: int = 1 << 18) -> None:
    """Move a decompressing `stream` to `offset`, decompressing at most `chunk` bytes at a time
    (its own `seek` reads 16 MB at a time); behind, it starts again from the beginning."""
    if offset < stream.tell():
        stream.seek(0)
    while (gap := offset - stream.tell()) > 0:
        if not stream.read(min(gap, chunk)):
            raise DataError(f"{getattr(stream, 'name', 'npz member')}: ends before byte {offset}")


def _close_all(streams: list[IO[bytes]], archive: zipfile.ZipFile | None) -> None:
    for stream in streams:
        stream.close()
    if archive is not None:
        archive.close()


def open_npz(path: Path, targets: dict[str, Target], feeds: dict[str, Any],
             options: FileOptions) -> Callable[[], Reader]:
    members = _npz_members(path)
    columns = list(members)
    plan: dict[str, list[str]] = {}
    for feed, target in targets.items():
        picked = [columns[i] for i in select(columns, feeds.get(feed, feed), feed, str(path))]
        for name in picked:
            m = members[name]
            if not np.can_cast(m.dtype, target.dtype, "same_kind"):
                raise DataError(f"{path}: array {name!r} is {m.dtype}, which feed {feed!r} "
                                f"({target.describe()}) cannot take")
        width = sum(int(np.prod(members[n].shape[1:], dtype=np.int64)) for n in picked)
        _check_width(target, width, picked, str(path))
        plan[feed] = picked
    count = _npz_rows(path, members, plan)
    if options.shuffle and any(not members[n].stored for names in plan.values() for n in names):
        raise DataError(f"{path}: shuffle reads records in random order, which a compressed "
                        "array (np.savez_compressed) cannot serve; save it with np.savez")
    count = min(count, options.size or count)
    return lambda: _NpzReader(path, members, plan, targets, Order(count, options.shuffle,
                                                                  options.seed))


def _npz_rows(path: Path, members: dict[str, _Member], plan: dict[str, list[str]]) -> int:
    used = {n: members[n].shape[0] for names in plan.values() for n in names}
    if len(set(used.values())) > 1:
        raise DataError(f"{path}: the arrays the feeds read have different numbers of rows: "
                        f"{used}")
    count = next(iter(used.values()))
    if count == 0:
        raise DataError(f"{path}: the arrays have no rows")
    return count


# -- text files -----------------------------------------------------------------------------------

class _End(Exception):
    """Record index past the end of the file."""


class Lines:
    """The records (non-blank lines after any header) of a text file, read line by line: record
    `r` is found by reading on from the last one read, or from the start when `r` is behind it.
    With an `index` (record start offsets and line numbers) a record is one seek away."""

    def __init__(self, path: Path, skip: int, limit: int | None,
                 index: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.path, self.skip, self.limit, self.index = path, skip, limit, index
        self.file = open(path, "rb")
        weakref.finalize(self, self.file.close)
        self.count: int | None = len(index[0]) if index is not None else None
        self._rewind()

    def _rewind(self) -> None:
        self.file.seek(0)
        for _ in range(self.skip):
            self.file.readline()
        self.next, self.lineno = 0, self.skip

    def _line(self) -> bytes | None:
        """The next non-blank line, None at the end."""
        while True:
            line = self.file.readline()
            if not line:
                return None
            self.lineno += 1
            if line.strip():
                return line

    def record(self, r: int) -> tuple[int, str]:
        """Record `r`'s line number and text; `_End` when the file has no record `r`."""
        if self.index is not None:
            offsets, linenos = self.index
            self.file.seek(int(offsets[r]))
            return int(linenos[r]), self._decode(self.file.readline(), int(linenos[r]))
        if r < self.next:
            self._rewind()
        while self.limit is None or self.next < self.limit:
            line = self._line()
            if line is None:
                break
            self.next += 1
            if self.next == r + 1:
                return self.lineno, self._decode(line, self.lineno)
        self.count = self.next
        self._rewind()
        raise _End

    def _decode(self, line: bytes, lineno: int) -> str:
        try:
            return line.decode("utf-8").rstrip("\r\n").removeprefix("\ufeff")
        except UnicodeDecodeError as err:
            raise DataError(f"{self.path}:{lineno}: not UTF-8 text: {err.reason}") from None

    def close(self) -> None:
        self.file.close()


def index_lines(path: Path, skip: int, limit: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Where each record starts and its line number: one pass over the file."""
    offsets, linenos = [], []
    with open(path, "rb") as f:
        for _ in range(skip):
            f.readline()
        lineno, pos = skip, f.tell()
        for line in iter(f.readline, b""):
            lineno += 1
            if line.strip():
                offsets.append(pos)
                linenos.append(lineno)
                if limit is not None and len(offsets) == limit:
                    break
            pos += len(line)
    return np.array(offsets, dtype=np.int64), np.array(linenos, dtype=np.int64)


Parse = Callable[[str, int], Any]  # a record's text and line number -> the parsed record
Build = Callable[[list[tuple[int, Any]]], Any]  # (line number, parsed record)s -> a feed value


class _TextReader(Reader):
    def __init__(self, lines: Lines, parse: Parse, builders: dict[str, Build],
                 shuffle: bool, seed: int) -> None:
        self.lines, self.parse, self.builders = lines, parse, builders
        self.shuffle, self.seed = shuffle, seed
        self.order = Order(lines.count, shuffle, seed) if lines.count else None

    def _record(self, position: int) -> tuple[int, str]:
        if self.order is None:
            try:
                return self.lines.record(position)
            except _End:
                if not self.lines.count:
                    raise DataError(f"{self.lines.path}: holds no records") from None
                self.order = Order(self.lines.count, self.shuffle, self.seed)
        return self.lines.record(self.order.record(position))

    def feed(self, positions: range, names: Sequence[str]) -> Feed:
        records = []
        for p in positions:
            lineno, text = self._record(p)
            records.append((lineno, self.parse(text, lineno)))
        return {name: self.builders[name](records) for name in names or list(self.builders)}

    def close(self) -> None:
        self.lines.close()


def _text_opener(path: Path, skip: int, options: FileOptions, parse: Parse,
                 builders: dict[str, Build]) -> Callable[[], Reader]:
    index = index_lines(path, skip, options.size) if options.shuffle else None
    if index is not None and not len(index[0]):
        raise DataError(f"{path}: holds no records")
    return lambda: _TextReader(Lines(path, skip, options.size, index), parse, builders,
                               options.shuffle, options.seed)


def _converter(dtype: np.dtype[Any]) -> Callable[[str], Any]:
    if dtype.kind in "iu":
        return int
    if dtype.kind == "b":
        return lambda s: bool(int(s))
    return float


def _convert(text: str, convert: Callable[[str], Any], dtype: np.dtype[Any], where: str,
             column: str) -> Any:
    try:
        return convert(text)
    except ValueError:
        raise DataError(f"{where}: column {column!r}: could not convert {text!r} to "
                        f"{dtype}") from None


AtOnce = Callable[[list[tuple[int, Any]]], "np.ndarray | None"]


def _columns_builder(path: Path, target: Target, picked: list[int], columns: Sequence[str],
                     value: Callable[[str, int, str], Any], at_once: AtOnce) -> Build:
    """A feed from the values of columns `picked` of each record (a list of fields):
    `at_once(records)` converts a batch's, or gives None when a value does not convert; then
    `value(text, column index, where)` converts them one by one, to name the culprit."""
    def one_by_one(records: list[tuple[int, Any]]) -> np.ndarray:
        return np.array([[value(fields[i], i, f"{path}:{lineno}") for i in picked]
                         for lineno, fields in records], dtype=target.dtype)

    def build(records: list[tuple[int, Any]]) -> Any:
        values = at_once(records)
        values = one_by_one(records) if values is None else values
        return _as_feed(target, values.reshape(len(records), -1))
    _check_width(target, len(picked), [columns[i] for i in picked], str(path))
    return build


def _at_once(records: list[tuple[int, Any]], picked: list[int],
             dtype: np.dtype[Any]) -> np.ndarray | None:
    """The fields `picked` of every record as `dtype` (floats parsed by Python's `float`, as
    float64, then cast), or None when one does not convert."""
    text = [fields[i] for _, fields in records for i in picked]
    wide = (float, np.float64) if dtype.kind in "fc" else (int, np.int64)
    if dtype.kind not in "fciu":
        return None
    try:
        return np.fromiter(map(wide[0], text), wide[1], len(text)).astype(dtype, copy=False)
    except (ValueError, OverflowError):
        return None


# -- csv ------------------------------------------------------------------------------------------

def open_csv(path: Path, targets: dict[str, Target], feeds: dict[str, Any],
             options: FileOptions) -> Callable[[], Reader]:
    delimiter = options.delimiter
    with open(path, "rb") as f:
        first = next((line for line in f if line.strip()), b"").decode("utf-8", "replace")
    first = first.removeprefix("\ufeff")  # a byte order mark is no part of the first name
    if not first:
        raise DataError(f"{path}: holds no records")
    head = next(csv.reader([first.rstrip("\r\n")], delimiter=delimiter))
    columns = [c.strip() for c in head] if options.header else [f"c{i}" for i in range(len(head))]

    def parse(text: str, lineno: int) -> list[str]:
        quoted = '"' in text
        fields = next(csv.reader([text], delimiter=delimiter)) if quoted else text.split(delimiter)
        if len(fields) != len(columns):
            raise DataError(f"{path}:{lineno}: {len(fields)} fields, but the "
                            f"{'header names' if options.header else 'first line has'} "
                            f"{len(columns)}")
        return fields

    def value(target: Target) -> Callable[[str, int, str], Any]:
        convert = _converter(target.dtype)
        return lambda text, i, where: _convert(text, convert, target.dtype, where, columns[i])

    def at_once(picked: list[int], target: Target) -> AtOnce:
        return lambda records: _at_once(records, picked, target.dtype)

    builders = {}
    for feed, target in targets.items():
        picked = select(columns, feeds.get(feed, feed), feed, str(path))
        builders[feed] = _columns_builder(path, target, picked, columns, value(target),
                                          at_once(picked, target))
    skip = _header_lines(path) if options.header else 0
    return _text_opener(path, skip, options, parse, builders)


def _header_lines(path: Path) -> int:
    """Lines up to and including the header (the first non-blank one)."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                return n
    return 0


# -- libsvm ---------------------------------------------------------------------------------------

def open_libsvm(path: Path, targets: dict[str, Target], feeds: dict[str, Any],
                options: FileOptions) -> Callable[[], Reader]:
    columns = ["label", "features"]
    base = 0 if options.zero_based else 1

    def parse(text: str, lineno: int) -> tuple[str, list[tuple[int, str]]]:
        tokens = text.split("#", 1)[0].split()
        pairs = []
        for k, token in enumerate(tokens[1:], 1):
            idx, sep, val = token.partition(":")
            if not sep or not idx.lstrip("-").isdigit():
                raise DataError(f"{path}:{lineno}: column 'features': item {k} {token!r} is "
                                "not index:value")
            pairs.append((int(idx) - base, val))
        return tokens[0], pairs

    builders = {}
    for feed, target in targets.items():
        default = feed if feed in columns else "label" if target.is_label else "features"
        picked = select(columns, feeds.get(feed, default), feed, str(path))
        if len(picked) != 1:
            raise DataError(f"{path}: feeds.{feed}: takes one column, 'label' or 'features'")
        builders[feed] = (_libsvm_label(path, target) if picked[0] == 0
                          else _libsvm_features(path, target, base))
    return _text_opener(path, 0, options, parse, builders)


def _libsvm_label(path: Path, target: Target) -> Build:
    _check_width(target, 1, ["label"], str(path))
    convert = _converter(target.dtype)

    def build(records: list[tuple[int, Any]]) -> Any:
        labels = [_convert(rec[0], convert, target.dtype, f"{path}:{n}", "label")
                  for n, rec in records]
        return _as_feed(target, np.array(labels, dtype=target.dtype).reshape(-1, 1))
    return build


def _libsvm_features(path: Path, target: Target, base: int) -> Build:
    convert = _converter(target.dtype)
    if target.lod:
        if target.dtype.kind not in "iu" or target.width != 1:
            raise DataError(f"{path}: feed {target.name!r} is {target.describe()}; the "
                            "indices of 'features' fill int ids of shape [1]")

        def ids(records: list[tuple[int, Any]]) -> Any:
            return _ragged_feed(target, [np.array([i for i, _ in rec[1]], dtype=np.int64)
                                         for _, rec in records])
        return ids

    def dense(records: list[tuple[int, Any]]) -> Any:
        out = np.zeros((len(records), target.width), dtype=target.dtype)
        for row, (lineno, (_, pairs)) in enumerate(records):
            for idx, val in pairs:
                if not 0 <= idx < target.width:
                    raise DataError(f"{path}:{lineno}: column 'features': index {idx + base} "
                                    f"is outside feed {target.name!r} of width {target.width} "
                                    f"(indices start at {base})")
                out[row, idx] = _convert(val, convert, target.dtype, f"{path}:{lineno}",
                                         f"features[{idx + base}]")
        return out.reshape((len(records),) + target.shape)
    return dense


# -- criteo ---------------------------------------------------------------------------------------

def criteo_id(value: str, column: int, vocab: int) -> int:
    """The id of hashed categorical `value` (hex) of column ``C<column+1>`` in a table of
    `vocab` rows: 0 for an empty field, else ``1 + (h + column * 1000003) mod (vocab - 1)``."""
    if not value:
        return 0
    return 1 + (int(value, 16) + column * CRITEO_STRIDE) % (vocab - 1)


def open_criteo(path: Path, targets: dict[str, Target], feeds: dict[str, Any],
                options: FileOptions) -> Callable[[], Reader]:
    def parse(text: str, lineno: int) -> list[str]:
        fields = text.split("\t")
        if len(fields) != len(CRITEO_COLUMNS):
            raise DataError(f"{path}:{lineno}: {len(fields)} tab-separated fields; a Criteo "
                            "record has 40 (label, I1..I13, C1..C26)")
        return fields

    def value(target: Target) -> Callable[[str, int, str], Any]:
        def one(text: str, i: int, where: str) -> Any:
            column = CRITEO_COLUMNS[i]
            if i == 0:
                return _convert(text, int, target.dtype, where, column)
            if i <= len(CRITEO_INTS):
                x = _convert(text, int, np.dtype(np.int64), where, column) if text else 0
                return np.log1p(max(x, 0)) if options.log_ints else x
            try:
                return criteo_id(text, i - 1 - len(CRITEO_INTS), target.vocab or 0)
            except ValueError:
                raise DataError(f"{where}: column {column!r}: {text!r} is not a hexadecimal "
                                "hash") from None
        return one

    def at_once(picked: list[int], target: Target) -> AtOnce:
        def convert(records: list[tuple[int, Any]]) -> np.ndarray | None:
            try:
                columns = [_criteo_column([fields[i] for _, fields in records], i,
                                          target.vocab or 0, options.log_ints) for i in picked]
            except (ValueError, OverflowError):
                return None
            return np.stack(columns, axis=1).astype(target.dtype)
        return convert

    sources = _criteo_defaults(path, targets, feeds)
    builders = {}
    for feed, target in targets.items():
        picked = select(CRITEO_COLUMNS, sources[feed], feed, str(path))
        if any(i > len(CRITEO_INTS) for i in picked):
            if target.dtype.kind not in "iu" or not target.vocab or target.vocab < 2:
                raise DataError(f"{path}: feed {target.name!r} ({target.describe()}) takes "
                                "categorical columns, which need int ids looked up in an "
                                "embedding table of at least 2 rows")
        builders[feed] = _columns_builder(path, target, picked, CRITEO_COLUMNS, value(target),
                                          at_once(picked, target))
    return _text_opener(path, 0, options, parse, builders)


def _criteo_column(text: list[str], i: int, vocab: int, log_ints: bool) -> np.ndarray:
    """Column `i` (of `CRITEO_COLUMNS`) of a batch, converted as `open_criteo` describes."""
    if i == 0:
        return np.fromiter(map(int, text), np.int64, len(text))
    if i <= len(CRITEO_INTS):
        x = np.fromiter((int(t) if t else 0 for t in text), np.int64, len(text))
        return np.log1p(np.maximum(x, 0).astype(np.float64)) if log_ints else x
    h = np.fromiter((int(t, 16) if t else 0 for t in text), np.int64, len(text))
    empty = np.fromiter((not t for t in text), bool, len(text))
    j = i - 1 - len(CRITEO_INTS)
    return np.where(empty, 0, 1 + (h + j * CRITEO_STRIDE) % (vocab - 1))


def _criteo_defaults(path: Path, targets: dict[str, Target],
                     feeds: dict[str, Any]) -> dict[str, Any]:
    """Each feed's columns: as `feeds` says, else by the defaults the module describes."""
    sources = dict(feeds)
    free = [t for name, t in targets.items() if name not in feeds]
    slots = [t for t in free if t.lod]
    for k, part in enumerate(np.array_split(np.array(CRITEO_CATS), len(slots)) if slots else []):
        sources[slots[k].name] = list(part)
    for t in free:
        if t.lod:
            continue
        if t.name in CRITEO_COLUMNS:
            sources[t.name] = t.name
        elif t.is_label:
            sources[t.name] = "label"
        elif t.dtype.kind == "f" and t.width == len(CRITEO_INTS):
            sources[t.name] = CRITEO_INTS
        else:
            raise DataError(f"{path}: feed {t.name!r} ({t.describe()}): no Criteo column is its "
                            "by default; name its columns in data.feeds")
    return sources


OPENERS: dict[str, Callable[[Path, dict[str, Target], dict[str, Any], FileOptions],
                            Callable[[], Reader]]] = {
    "npz": open_npz, "csv": open_csv, "libsvm": open_libsvm, "criteo": open_criteo}


__all__ = ["CRITEO_COLUMNS", "FORMATS", "FileDataset", "FileOptions", "FileShard", "Lines",
           "Order", "Reader", "Target", "criteo_id", "index_lines", "select", "targets"]
