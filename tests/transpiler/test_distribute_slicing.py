"""Slicing (docs/transpiler.md §4) and dispatch (§5), including HashName's fixes."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import transpiler as T
from transpiler.distribute.dispatch import placement_key
from transpiler.distribute.slicing import slice_shapes


@dataclass
class V:
    name: str
    shape: tuple[int, ...]


def blocks(shape: tuple[int, ...], count: int, min_block: int = 8192) -> list[str]:
    return [str(b) for b in T.slice_variable([V("v", shape)], count, min_block)]


def test_spec_examples() -> None:
    assert blocks((1000, 1000), 2) == ["v:0:500000", "v:1:500000"]
    assert blocks((1000,), 2) == ["v:0:1000"]
    assert blocks((1000, 1000), 2, 1048576) == ["v:0:1000000"]


def test_blocks_are_whole_rows() -> None:
    # 3 x 7 rows of 10000: ceil(70000 / 3) = 23334 rounds up to 30000 (3 rows) -> 3 blocks
    assert blocks((7, 10000), 3) == ["v:0:30000", "v:1:30000", "v:2:10000"]
    assert slice_shapes((7, 10000), T.slice_variable([V("v", (7, 10000))], 3, 8192)) == [
        ((3, 10000), 0), ((3, 10000), 3), ((1, 10000), 6)]


def test_min_block_size_limits_the_count() -> None:
    assert len(blocks((100000,), 16)) == 12  # floor(100000 / 8192) = 12 blocks at most
    assert blocks((100000,), 16)[-1] == "v:11:8326"  # 11 blocks of 8334, then the rest


def test_rank_one_blocks_are_elements() -> None:
    assert blocks((20000,), 2) == ["v:0:10000", "v:1:10000"]
    assert slice_shapes((20000,), T.slice_variable([V("v", (20000,))], 2, 8192)) == [
        ((10000,), 0), ((10000,), 10000)]


def test_var_block_string_and_fields() -> None:
    b = T.VarBlock("fc_w", 1, 500000)
    assert str(b) == "fc_w:1:500000" and (b.varname, b.offset, b.size) == ("fc_w", 1, 500000)


@pytest.mark.parametrize("shape", [(-1, 10), (0,)])
def test_unknown_or_empty_shapes_are_refused(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="'v' has shape"):
        T.slice_variable([V("v", shape)], 2, 8192)


def test_bad_slice_arguments() -> None:
    with pytest.raises(ValueError, match="slice_count"):
        T.slice_variable([V("v", (10,))], 0, 8192)


# -- dispatch --------------------------------------------------------------------------------------

EPS = ["a:1", "b:2", "c:3"]


def test_round_robin_cycles_and_resets() -> None:
    rr = T.RoundRobin(EPS)
    assert rr.dispatch(["x", "y"]) == ["a:1", "b:2"]
    assert rr.dispatch([V("z", (1,))]) == ["c:3"]
    assert rr.dispatch(["w"]) == ["a:1"]
    rr.reset()
    assert rr.dispatch(["x"]) == ["a:1"]
    assert rr.eps == EPS


def test_hash_name_accepts_vars_and_names_and_places_grads_with_params() -> None:
    hn = T.HashName(EPS)
    var_eps = hn.dispatch([V("fc_w.block1", (1,))])
    assert var_eps == hn.dispatch(["fc_w.block1"])
    assert hn.dispatch(["fc_w@GRAD.block1.trainer_0"]) == var_eps
    assert hn.dispatch(["fc_w@GRAD.block1.trainer_7"]) == var_eps
    assert placement_key("fc_w@GRAD.block1.trainer_12") == "fc_w.block1"


def test_hash_name_spreads_names() -> None:
    hn = T.HashName(EPS)
    assert set(hn.dispatch([f"w_{i}" for i in range(30)])) == set(EPS)


def test_hash_name_is_stable_across_processes() -> None:
    code = ("import transpiler as T; "
            "print(T.HashName(['a:1','b:2','c:3','d:4']).dispatch([f'p_{i}.block0' for i in range(40)]))")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": seed},
                              cwd=Path(__file__).resolve().parents[2]).stdout
               for seed in ("1", "2", "random")}
    assert len(outputs) == 1
    here = str(T.HashName(["a:1", "b:2", "c:3", "d:4"]).dispatch([f"p_{i}.block0" for i in range(40)]))
    assert outputs == {here + "\n"}


def test_dispatcher_needs_endpoints() -> None:
    with pytest.raises(ValueError, match="pserver_endpoints is empty"):
        T.RoundRobin([])
