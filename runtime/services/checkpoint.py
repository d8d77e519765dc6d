"""Checkpoints: a pserver's whole state in a directory, written atomically and read back checked.

A pserver's state is what its startup program initializes: every persistable var of its program
that the startup writes (param blocks, its shard of the distributed table, optimizer
accumulators, learning rates and step counters, DC-ASGD backups), plus the step of its sync round
(the first step whose gradients the state has not seen). Gradients and temporaries are no state:
every step makes them anew.

A checkpoint directory holds::

    manifest.json   {"format": "pslab-checkpoint", "version": 1, "step": 10,
                     "vars": [{"name": ..., "file": ..., "shape": [...], "dtype": ...}, ...]}
    <var>.npy       one numpy file per var, written and read with allow_pickle=False; the var's
                    name %-escaped where a file name could not hold it

`Staging` writes one: files go into a fresh hidden directory beside the target (a file that
something else wrote there, such as the table a pserver's checkpoint block saves, is checked and
kept); `commit` adds the missing files and the manifest (each written and synced to disk by
`runtime.config.atomic`) and renames the directory into place, moving an older checkpoint out
of the way first. A reader finds the old checkpoint or the new one, never part of one; a write
that fails (a full disk: ``OSError`` ENOSPC) removes the staging directory and leaves the older
checkpoint as it was. `load` checks the manifest against the vars a
program declares, naming every missing, extra or mismatched var before it reads any data.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Mapping
from urllib.parse import quote

import numpy as np

from transpiler.ir import Program, Var

from runtime.config.atomic import atomic_open, fsync_dir, write_atomic

MANIFEST = "manifest.json"
FORMAT, VERSION = "pslab-checkpoint", 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or does not fit the program; names the var or file."""


def state_vars(program: Program, startup: Program) -> dict[str, Var]:
    """The vars of `program` that make up its state: persistable, and written by `startup`."""
    written = {n for op in startup.global_block().ops for n in op.output_arg_names}
    return {name: var for name, var in program.global_block().vars.items()
            if var.persistable and name in written}


def file_name(var: str) -> str:
    return quote(var, safe="@.-_+") + ".npy"


class Staging:
    """A checkpoint being written to `target`; use as a context manager, then `commit`. Left
    without a commit (an error), the partial checkpoint is removed and `target` is untouched."""

    def __init__(self, target: Path) -> None:
        self.target = target
        target.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        self._committed = False

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._committed:
            shutil.rmtree(self.dir, ignore_errors=True)

    def file_of(self, var: str) -> Path:
        """Where var `var` goes (for a writer of its own, such as a `save` op)."""
        return self.dir / file_name(var)

    def commit(self, state: Mapping[str, np.ndarray], step: int) -> None:
        """Write every var of `state` not written yet, the manifest, and move into place."""
        entries = [self._write(name, value) for name, value in state.items()]
        manifest = {"format": FORMAT, "version": VERSION, "step": int(step), "vars": entries}
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
    if not target.exists():
        stage.rename(target)
        return
    old = stage.with_name(stage.name + ".old")
    target.rename(old)
    stage.rename(target)
    shutil.rmtree(old)


# -- loading ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    values: dict[str, np.ndarray]
    step: int


def load(directory: Path, declared: Mapping[str, Var]) -> Checkpoint:
    """The checkpoint in `directory`, which must hold exactly the `declared` vars, each with
    its declared shape and dtype."""
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
                      manifest["step"])


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: no readable checkpoint manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or manifest.get("version") != VERSION:
        raise CheckpointError(f"{path}: not a {FORMAT} manifest of version {VERSION}")
    if not isinstance(manifest.get("step"), int) or not isinstance(manifest.get("vars"), list) \
            or not all(_valid_entry(e) for e in manifest["vars"]):
        raise CheckpointError(f"{path}: needs an int 'step' and a list 'vars' of "
                              "{name, file, shape, dtype} entries, each file a plain .npy name")
    return manifest


def _valid_entry(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("name"), str) \
        and isinstance(entry.get("dtype"), str) and entry["dtype"] in np.sctypeDict \
        and isinstance(entry.get("shape"), list) and all(isinstance(d, int) for d in entry["shape"]) \
        and isinstance(entry.get("file"), str) and entry["file"].endswith(".npy") \
        and "/" not in entry["file"]


def _read_var(directory: Path, entry: dict[str, Any]) -> np.ndarray:
    path = directory / entry["file"]
    try:
        value = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"var {entry['name']!r}: cannot read {path}: {exc}") from None
    if list(value.shape) != entry["shape"] or value.dtype != np.dtype(entry["dtype"]):
        raise CheckpointError(f"var {entry['name']!r}: {path.name} holds {_spec(value)}, the "
                              f"manifest says {entry['dtype']}{entry['shape']}")
    return value


def _spec(value: np.ndarray) -> str:
    return f"{value.dtype}{list(value.shape)}"
