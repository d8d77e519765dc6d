"""Paddle 2.x's ``paddle.static`` for a ported script (``import runtime.paddle as paddle``):
the static-graph names 2.x gathered there, each pslab's fluid equivalent (the same programs
and ops): ``Program``, ``program_guard``, ``default_main_program``,
``default_startup_program``, ``Executor``, ``CPUPlace``, ``CUDAPlace``, ``global_scope``,
``data`` (2.x's: the shape as given, its batch dimension written by the script as -1 or
None), and ``paddle.static.nn``: ``fc`` (2.x's keywords ``weight_attr`` and ``activation``;
`mul` + `elementwise_add` as fluid's ``layers.fc``), ``embedding`` (`lookup_table`, fluid's
``layers.embedding``), ``nce`` and ``sequence_lod.sequence_pool``.

Layers: a facade on top of `transpiler` and `runtime.paddle.fluid`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Sequence

from transpiler import layers
from transpiler.framework import (ParamAttr, default_main_program, default_startup_program,
                                  program_guard)
from transpiler.ir import Program, Var

from runtime.paddle.fluid import CPUPlace, CUDAPlace, Executor, global_scope

__all__ = ["CPUPlace", "CUDAPlace", "Executor", "Program", "data", "default_main_program",
           "default_startup_program", "global_scope", "nn", "program_guard"]


def data(name: str, shape: Sequence[int | None], dtype: str = "float32",
         lod_level: int = 0) -> Var:
    """A fed input var of exactly `shape` (None is -1, an unknown dim); unlike fluid 1.x's
    ``layers.data`` no batch dimension is prepended."""
    dims = [-1 if d is None else int(d) for d in shape]
    return layers.data(name, dims, dtype, lod_level=lod_level, append_batch_size=False)


def fc(x: Var | Sequence[Var], size: int, num_flatten_dims: int = 1,
       weight_attr: ParamAttr | str | None = None,
       bias_attr: ParamAttr | str | bool | None = None, activation: str | None = None,
       name: str | None = None) -> Var:
    """2.x's ``static.nn.fc``: ``activation(x @ w + b)``, fluid's `fc` ops (`mul`,
    `elementwise_add`, the activation), `weight_attr` naming fluid's `param_attr`."""
    return layers.fc(x, size, num_flatten_dims, param_attr=weight_attr, bias_attr=bias_attr,
                     act=activation, name=name)


def embedding(input: Var, size: Sequence[int], is_sparse: bool = False,
              is_distributed: bool = False, padding_idx: int | None = None,
              param_attr: ParamAttr | str | None = None, dtype: str = "float32") -> Var:
    """2.x's ``static.nn.embedding``: fluid's ``layers.embedding``, a `lookup_table` op."""
    return layers.embedding(input, size, is_sparse, is_distributed, padding_idx, param_attr,
                            dtype)


def sequence_pool(input: Var, pool_type: str, is_test: bool = False,
                  pad_value: float = 0.0) -> Var:
    """2.x's ``static.nn.sequence_lod.sequence_pool``: one row per sequence of the LoD
    `input` (`pool_type` "average", "sum", "max", ...), a `sequence_pool` op. 2.x declares no
    LoD (``static.data`` has no ``lod_level`` to give; the fed tensor brings it), so an
    `input` declared without one is taken as one level of sequences."""
    if input.lod_level < 1:
        input.lod_level = 1
    return layers.sequence_pool(input, pool_type)


def nce(input: Var, label: Var, num_total_classes: int, sample_weight: Var | None = None,
        param_attr: ParamAttr | str | None = None,
        bias_attr: ParamAttr | str | bool | None = None, num_neg_samples: int | None = None,
        name: str | None = None, sampler: str = "uniform",
        custom_dist: Sequence[float] | None = None, seed: int = 0,
        is_sparse: bool = False) -> Var:
    """2.x's ``static.nn.nce``: fluid's ``layers.nce`` (one `nce` op, its cost scaled)."""
    return layers.nce(input, label, num_total_classes, sample_weight, param_attr, bias_attr,
                      num_neg_samples, name, sampler, custom_dist, seed, is_sparse)


def _sequence_lod() -> Any:
    return SimpleNamespace(sequence_pool=sequence_pool)


nn = SimpleNamespace(fc=fc, embedding=embedding, nce=nce, sequence_lod=_sequence_lod(),
                     sequence_pool=sequence_pool)
"""``paddle.static.nn``: the static-graph layers 2.x keeps there."""
