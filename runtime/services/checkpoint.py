"""Checkpoints: a pserver's whole state in a directory, written atomically and read back checked.

A pserver's state is what its startup program initializes: every persistable var of its program
that the startup writes (param blocks, its shard of the distributed table, optimizer
accumulators, learning rates and step counters, DC-ASGD backups), plus the step of its sync round
(the first step whose gradients the state has not seen). Gradients and temporaries are no state:
every step makes them anew.

A checkpoint directory holds::

    manifest.json   {"format": "pslab-checkpoint", "version": 2, "step": 10, "id": "<hex>",
                     "vars": [{"name": ..., "file": ..., "shape": [...], "dtype": ...,
                               "deltas": [{"file": ..., "rows": 100}, ...]}, ...]}
    <var>.npy       one numpy file per var, written and read with allow_pickle=False; the var's
                    name %-escaped where a file name could not hold it
    <var>.<k>.npz   delta k of a row-tracked var (optional): ``rows`` (int64 row ids) and
                    ``values`` (those rows), applied in order over the .npy base, later rows winning

`Staging` writes one: files go into a fresh hidden staging directory ``.<name>.<8 chars>``
beside the target (a file that something else wrote there, such as the table a pserver's
checkpoint block saves, is checked and kept); `commit` adds the missing files and the manifest
(each written and synced to disk by `runtime.config.atomic`, the manifest last) and swaps the
directory in: the checkpoint at the target is renamed to ``.<name>.old``, the staging directory
to the target (the commit point), the directory entries synced after each rename, and the old
checkpoint removed. A write that fails (a full disk: ``OSError`` ENOSPC) removes the staging
directory and leaves the older checkpoint as it was.

A process killed at any point of this leaves the last committed checkpoint recoverable:
before the commit point it is at the target, or (killed between the two renames) whole at
``.<name>.old`` with no target; after it, the new one is at the target. `recover` puts it back:
with no target it renames ``.<name>.old`` into place (the commit had not happened: the old
checkpoint is the last committed one), and it removes every staging directory and ``.old``
left beside the target. A pserver recovers its target before it starts (`make_pserver` in
`runtime.services.cluster`) and `Staging` before each write, so what killed writes leave is
removed then, not left forever; `load` also moves an ``.old`` back where it finds no target.
DESIGN: two renames and a reader that rolls back, rather than versioned directories behind a
pointer: the checkpoint stays at ``<dir>/<server name>/`` where every reader (and the hard
links below) expects it, and checkpoints written before keep loading as they are. `load`
checks the manifest against the vars a program declares, naming every missing, extra or
mismatched var before it reads any data.

Sparse checkpoints cost O(rows written since the last one), not O(table): for a var whose
writer tracks the rows it changed since checkpoint ``id`` (the distributed table's shard, see
`runtime.execution.table.TouchedRows`), `Staging.write_delta` hard-links the previous
checkpoint's base and deltas of that var into the staging directory (``os.link``: no bytes
copied; the previous checkpoint's files stay as they are, so the swap and its recovery above
hold as for a full checkpoint) and writes only the changed rows as a new delta. It writes a full
base instead (compaction) when the previous checkpoint is not the one the rows are counted from
(another ``id``, or none), holds the var with another shape or dtype, cannot be linked (another
file system, a file gone), or when its deltas and the new one would hold more than `COMPACT_AT`
of the var's rows or be more than `MAX_DELTAS` files. Version 1 manifests (no ids, no deltas)
still load.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Mapping
from urllib.parse import quote

import numpy as np

from transpiler.ir import Program, Var

from runtime.config.atomic import atomic_open, fsync_dir, write_atomic

MANIFEST = "manifest.json"
FORMAT, VERSION = "pslab-checkpoint", 2
READABLE = (1, VERSION)
COMPACT_AT = 0.5
"""A var's deltas may hold at most this fraction of its rows; beyond, a full base is written."""
MAX_DELTAS = 32
"""And at most this many delta files (loading reads them all)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or does not fit the program; names the var or file."""


def state_vars(program: Program, startup: Program) -> dict[str, Var]:
    """The vars of `program` that make up its state: persistable, and written by `startup`."""
    written = {n for op in startup.global_block().ops for n in op.output_arg_names}
    return {name: var for name, var in program.global_block().vars.items()
            if var.persistable and name in written}


def file_name(var: str) -> str:
    return quote(var, safe="@.-_+") + ".npy"


def delta_name(var: str, index: int) -> str:
    return f"{quote(var, safe='@.-_+')}.{index}.npz"


class Staging:
    """A checkpoint being written to `target`; use as a context manager, then `commit`. Left
    without a commit (an error), the partial checkpoint is removed and `target` is untouched."""

    def __init__(self, target: Path) -> None:
        self.target = target
        target.parent.mkdir(parents=True, exist_ok=True)
        recover(target)  # the checkpoint a killed write moved out back, its leftovers gone
        self.dir = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
        self.dir.mkdir(mode=0o700)
        self.id = uuid.uuid4().hex
        """This checkpoint's identity in its manifest: what rows written later are counted from."""
        self._committed = False
        self._entries: dict[str, dict[str, Any]] = {}
        """Vars already written as deltas (`write_delta`), by name."""

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._committed:
            shutil.rmtree(self.dir, ignore_errors=True)

    def file_of(self, var: str) -> Path:
        """Where var `var` goes (for a writer of its own, such as a `save` op)."""
        return self.dir / file_name(var)

    def write_delta(self, name: str, value: np.ndarray, rows: np.ndarray | None,
                    since: str | None) -> bool:
        """Write var `name` as the previous checkpoint's base and deltas (linked) plus a delta of
        its `rows` (sorted unique row ids written since checkpoint `since`; None: any row may
        have changed). False, with nothing written, where a full base is due instead (see the
        module docstring); `commit` then writes it."""
        previous = self._previous_entry(name, since)
        if rows is None or previous is None or not isinstance(value, np.ndarray) \
                or value.ndim == 0 or previous["shape"] != list(value.shape) \
                or previous["dtype"] != value.dtype.name:
            return False
        deltas = list(previous.get("deltas", []))
        if sum(d["rows"] for d in deltas) + len(rows) > COMPACT_AT * value.shape[0] \
                or len(deltas) + (len(rows) > 0) > MAX_DELTAS:
            return False
        linked: list[Path] = []
        try:
            for file in [previous["file"], *(d["file"] for d in deltas)]:
                os.link(self.target / file, self.dir / file)
                linked.append(self.dir / file)
        except OSError:  # another file system, links refused, a file gone: a full base
            for path in linked:
                path.unlink()
            return False
        if len(rows):  # no rows written: the previous files are the var
            rows = np.asarray(rows, np.int64)
            file = delta_name(name, len(deltas))
            with atomic_open(self.dir / file, binary=True) as f:
                np.savez(f, rows=rows, values=np.ascontiguousarray(value[rows]))
            deltas.append({"file": file, "rows": len(rows)})
        self._entries[name] = {**previous, "deltas": deltas}
        return True

    def _previous_entry(self, name: str, since: str | None) -> dict[str, Any] | None:
        """Var `name`'s entry in the checkpoint now at the target if that is checkpoint `since`."""
        manifest = self._previous
        if since is None or manifest is None or manifest.get("id") != since:
            return None
        return next((e for e in manifest["vars"] if e["name"] == name), None)

    @functools.cached_property
    def _previous(self) -> dict[str, Any] | None:
        """The manifest of the checkpoint now at the target (None: none, or unreadable), read
        once for every var written as a delta."""
        if not (self.target / MANIFEST).exists():
            return None
        try:
            return _read_manifest(self.target)
        except CheckpointError:
            return None

    def commit(self, state: Mapping[str, np.ndarray], step: int) -> None:
        """Write every var of `state` not written yet, the manifest, and move into place."""
        entries = [self._entries.get(name) or self._write(name, value)
                   for name, value in state.items()]
        manifest = {"format": FORMAT, "version": VERSION, "step": int(step), "id": self.id,
                    "vars": entries}
        write_atomic(self.dir / MANIFEST, json.dumps(manifest, indent=1))
        _swap_in(self.dir, self.target)
        fsync_dir(self.target.parent)
        self._committed = True

    def _write(self, name: str, value: np.ndarray) -> dict[str, Any]:
        if not isinstance(value, np.ndarray):
            raise CheckpointError(f"var {name!r}: only dense values are checkpointed, got "
                                  f"{type(value).__name__}")
        path = self.file_of(name)
        if path.exists():
            written = np.load(path, mmap_mode="r", allow_pickle=False)
            if written.shape != value.shape or written.dtype != value.dtype:
                raise CheckpointError(f"var {name!r}: {path.name} holds {_spec(written)}, the "
                                      f"scope {_spec(value)}")
        else:
            with atomic_open(path, binary=True) as f:
                np.save(f, np.ascontiguousarray(value), allow_pickle=False)
        return {"name": name, "file": path.name, "shape": list(value.shape),
                "dtype": value.dtype.name}


def _swap_in(stage: Path, target: Path) -> None:
    """Move the complete checkpoint `stage` to `target` (see the module docstring: the rename
    of `stage` is the commit point; a kill before it leaves the old checkpoint for `recover`)."""
    previous = previous_of(target)
    if target.exists():
        os.rename(target, previous)
        fsync_dir(target.parent)
    os.rename(stage, target)
    fsync_dir(target.parent)
    shutil.rmtree(previous, ignore_errors=True)  # committed: what is left, `recover` removes


# -- recovery from a killed write ------------------------------------------------------------------

def previous_of(target: Path) -> Path:
    """Where a commit moves the checkpoint at `target` while it moves the new one in."""
    return target.with_name(f".{target.name}.old")


def leftovers(target: Path) -> list[Path]:
    """What killed writes of `target` left beside it: staging directories ``.<name>.<8 chars>``
    and moved-out checkpoints ``.<name>.old`` (also ``.<name>.<8 chars>.old``, the name an
    earlier version of this module moved them to)."""
    name = re.escape(target.name)
    pattern = re.compile(rf"\.{name}\.(old|[a-z0-9_]{{8}}(\.old)?)")
    if not target.parent.is_dir():
        return []
    return sorted(p for p in target.parent.iterdir() if pattern.fullmatch(p.name))


def recover(target: Path) -> bool:
    """Make `target` hold its last committed checkpoint again and remove what killed writes left
    beside it (see the module docstring); whether there is a checkpoint. Only the checkpoint's
    writer calls it: a staging directory it removes may be a write under way."""
    roll_back(target)
    for path in leftovers(target):
        shutil.rmtree(path, ignore_errors=True)
    return (target / MANIFEST).exists()


def roll_back(target: Path) -> None:
    """Where a write was killed between moving the checkpoint at `target` out and the new one
    in, move the old one back: with no `target`, the moved-out checkpoint with the latest step."""
    if target.exists():
        return
    moved = [path for path in leftovers(target)
             if path.name.endswith(".old") and (path / MANIFEST).is_file()]
    if moved:
        os.rename(max(moved, key=_step_of), target)
        fsync_dir(target.parent)


def _step_of(directory: Path) -> int:
    try:
        return _read_manifest(directory)["step"]
    except CheckpointError:
        return -1


# -- loading ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    values: dict[str, np.ndarray]
    step: int
    id: str | None = None
    """The manifest's id (none in version 1): what rows written after loading are counted from."""


def load(directory: Path, declared: Mapping[str, Var]) -> Checkpoint:
    """The checkpoint in `directory`, which must hold exactly the `declared` vars, each with
    its declared shape and dtype. Where a write was killed between its two renames, the old
    checkpoint is moved back first (`roll_back`)."""
    roll_back(directory)
    manifest = _read_manifest(directory)
    entries = {e["name"]: e for e in manifest["vars"]}
    problems = [f"var {n!r} is missing" for n in sorted(set(declared) - set(entries))]
    problems += [f"var {n!r} is not part of the program's state"
                 for n in sorted(set(entries) - set(declared))]
    for name in sorted(set(declared) & set(entries)):
        var, entry = declared[name], entries[name]
        if np.dtype(entry["dtype"]) != np.dtype(var.dtype) or len(entry["shape"]) != len(var.shape) \
                or any(d not in (-1, s) for d, s in zip(var.shape, entry["shape"])):
            problems.append(f"var {name!r} is {entry['dtype']}{entry['shape']} in the checkpoint "
                            f"but {var.dtype}{list(var.shape)} in the program")
    if problems:
        raise CheckpointError(f"{directory}: the checkpoint does not fit the program: "
                              + "; ".join(problems))
    return Checkpoint({name: _read_var(directory, entries[name]) for name in declared},
                      manifest["step"], manifest.get("id"))


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: no readable checkpoint manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or manifest.get("version") not in READABLE:
        raise CheckpointError(f"{path}: not a {FORMAT} manifest of version "
                              f"{' or '.join(map(str, READABLE))}")
    if not isinstance(manifest.get("step"), int) or not isinstance(manifest.get("vars"), list) \
            or not isinstance(manifest.get("id"), (str, type(None))) \
            or not all(_valid_entry(e) for e in manifest["vars"]):
        raise CheckpointError(f"{path}: needs an int 'step' and a list 'vars' of "
                              "{name, file, shape, dtype} entries, each file a plain .npy name "
                              "and each delta {file, rows} a plain .npz name")
    return manifest


def _valid_entry(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("name"), str) \
        and isinstance(entry.get("dtype"), str) and entry["dtype"] in np.sctypeDict \
        and isinstance(entry.get("shape"), list) and all(isinstance(d, int) for d in entry["shape"]) \
        and _plain(entry.get("file"), ".npy") \
        and isinstance(entry.get("deltas", []), list) \
        and all(isinstance(d, dict) and _plain(d.get("file"), ".npz")
                and isinstance(d.get("rows"), int) for d in entry.get("deltas", []))


def _plain(file: Any, suffix: str) -> bool:
    """A file name in the checkpoint directory itself, ending with `suffix`."""
    return isinstance(file, str) and file.endswith(suffix) and "/" not in file \
        and "\\" not in file and file not in (suffix, "." + suffix)


def _read_var(directory: Path, entry: dict[str, Any]) -> np.ndarray:
    path = directory / entry["file"]
    try:
        value = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"var {entry['name']!r}: cannot read {path}: {exc}") from None
    if list(value.shape) != entry["shape"] or value.dtype != np.dtype(entry["dtype"]):
        raise CheckpointError(f"var {entry['name']!r}: {path.name} holds {_spec(value)}, the "
                              f"manifest says {entry['dtype']}{entry['shape']}")
    for delta in entry.get("deltas", []):
        _apply_delta(value, entry["name"], directory / delta["file"], delta["rows"])
    return value


def _apply_delta(value: np.ndarray, name: str, path: Path, count: int) -> None:
    """Write delta file `path`'s rows into `value` (later rows win), checked first."""
    try:
        with np.load(path, allow_pickle=False) as delta:
            rows, rows_of = delta["rows"], delta["values"]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"var {name!r}: cannot read delta {path}: {exc}") from None
    if rows.ndim != 1 or rows.dtype != np.int64 or len(rows) != count \
            or rows_of.dtype != value.dtype or rows_of.shape != (count,) + value.shape[1:]:
        raise CheckpointError(f"var {name!r}: delta {path.name} holds rows {_spec(rows)} and "
                              f"values {_spec(rows_of)}, the manifest says {count} rows of "
                              f"{value.dtype}{list(value.shape[1:])}")
    if count and (rows.min() < 0 or rows.max() >= value.shape[0]):
        raise CheckpointError(f"var {name!r}: delta {path.name} holds rows outside the var's "
                              f"{value.shape[0]} rows")
    value[rows] = rows_of


def _spec(value: np.ndarray) -> str:
    return f"{value.dtype}{list(value.shape)}"
