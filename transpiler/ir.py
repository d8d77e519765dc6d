"""Program IR: the data the front end builds, the transpiler rewrites and the runtime executes.

A `Program` is a list of `Block`s (block 0 is global, every other block names its parent). A
block owns `Var`s (name -> declaration) and an ordered list of `Op`s. An op names its inputs and
outputs by slot (``{"X": ["fc_0.tmp_0"]}``) and carries plain attributes; a sub-block attribute
is stored as a `BlockRef` so that it survives serialization and can be checked by `verify`.

Everything here is plain data: no numpy, no IO. A program round-trips exactly through
`to_dict`/`from_dict` (and so through JSON and msgpack, see `dumps`/`loads`).
"""

from __future__ import annotations

import copy
import enum
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, Sequence

GRAD_SUFFIX = "@GRAD"
OP_ROLE_ATTR = "op_role"
OP_ROLE_VAR_ATTR = "op_role_var"
OP_IS_TEST_ATTR = "is_test"
_TEST_MODE_OPS = frozenset({"dropout", "batch_norm"})
"""Ops that compute differently in evaluation (``is_test``), whether or not they say it yet."""

DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")


class OpRole(enum.IntFlag):
    """Op roles as bit flags, with the original's values (Backward | Loss = 257)."""

    Forward = 0
    Backward = 1
    Optimize = 2
    RPC = 4
    Dist = 8
    LRSched = 16
    Loss = 256


class VarType(str, enum.Enum):
    LOD_TENSOR = "LOD_TENSOR"
    SELECTED_ROWS = "SELECTED_ROWS"
    RAW = "RAW"


class IRError(ValueError):
    """A malformed program; the message names the block, op and var at fault."""


@dataclass(frozen=True)
class BlockRef:
    """An op attribute that refers to a block of the same program by index."""

    idx: int


@dataclass(frozen=True)
class WeightDecayRegularizer:
    """The weight decay a parameter carries (`Var.regularizer`): a kind and a coefficient, kept
    and serialized with the program. `transpiler.regularizer` turns it into ops.

    DESIGN: the description lives in the IR, and only the ops it becomes in the front end,
    because a var's `from_dict` must rebuild it: the IR depends on nothing of the front end."""

    regularization_coeff: float = 0.0

    kind = ""

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "coeff": self.regularization_coeff}


@dataclass(frozen=True)
class L2Decay(WeightDecayRegularizer):
    """Adds `coeff * param` to the grad."""

    kind = "l2"


@dataclass(frozen=True)
class L1Decay(WeightDecayRegularizer):
    """Adds `coeff * sign(param)` to the grad."""

    kind = "l1"


def regularizer_from_dict(d: dict[str, Any]) -> WeightDecayRegularizer:
    kinds: dict[str, type[WeightDecayRegularizer]] = {"l2": L2Decay, "l1": L1Decay}
    if d.get("type") not in kinds:
        raise ValueError(f"unknown regularizer type {d.get('type')!r}; one of {sorted(kinds)}")
    return kinds[d["type"]](float(d["coeff"]))


def grad_name(name: str) -> str:
    return name + GRAD_SUFFIX


def strip_grad_suffix(name: str) -> str:
    pos = name.find(GRAD_SUFFIX)
    return name[:pos] if pos >= 0 else name


_NO_ATTRS: Mapping[str, Any] = MappingProxyType({})
_SHAPES: dict[tuple[int, ...], tuple[int, ...]] = {}
"""Each shape a var was declared with, as the one tuple its vars share: a sync 1,000-trainer
job's pservers declare a var per trainer's copy of every gradient block, nearly all of one
shape."""


@dataclass
class Var:
    name: str
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    persistable: bool = False
    type: VarType = VarType.LOD_TENSOR
    lod_level: int = 0
    stop_gradient: bool = False
    is_parameter: bool = False
    trainable: bool = True
    is_data: bool = False
    """Fed by the script: declared by `layers.data` (fluid's ``Variable.is_data``, which a
    harness reads to find a program's feeds)."""
    # Parameter-only metadata (the front end reads it when building backward/optimizer ops).
    regularizer: WeightDecayRegularizer | None = None
    optimize_attr: Mapping[str, Any] = field(default_factory=lambda: _NO_ATTRS)
    """Read only, replaced whole (none: one shared empty map; a 1,000-trainer job's pservers
    declare hundreds of thousands of vars)."""
    # Front-end clipping wishes (fluid's ``ParamAttr(need_clip=, gradient_clip=)``), read by
    # `minimize`; not serialized: clipping is ops by the time a program travels.
    need_clip: bool = field(default=True, repr=False, compare=False)
    gradient_clip: Any = field(default=None, repr=False, compare=False)
    # The block that declares the var; set by `Block`, not serialized.
    block: "Block | None" = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        self.shape = _SHAPES.setdefault(shape, shape)
        self.type = VarType(self.type)
        if self.dtype not in DTYPES:
            raise IRError(f"var {self.name!r}: unknown dtype {self.dtype!r} (one of {DTYPES})")

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "persistable": self.persistable,
            "type": self.type.value,
            "lod_level": self.lod_level,
            "stop_gradient": self.stop_gradient,
        }
        if self.is_parameter:
            d["is_parameter"] = True
            d["trainable"] = self.trainable
            d["optimize_attr"] = dict(self.optimize_attr)
            if self.regularizer is not None:
                d["regularizer"] = self.regularizer.to_dict()
        if self.is_data:
            d["is_data"] = True
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Var":
        reg = d.get("regularizer")
        return Var(
            name=d["name"],
            shape=tuple(d["shape"]),
            dtype=d["dtype"],
            persistable=d["persistable"],
            type=VarType(d["type"]),
            lod_level=d["lod_level"],
            stop_gradient=d["stop_gradient"],
            is_parameter=d.get("is_parameter", False),
            trainable=d.get("trainable", True),
            is_data=d.get("is_data", False),
            regularizer=None if reg is None else regularizer_from_dict(reg),
            optimize_attr=dict(d["optimize_attr"]) if d.get("optimize_attr") else _NO_ATTRS,
        )

    def __str__(self) -> str:
        flags = []
        if self.is_parameter:
            flags.append("param" if self.trainable else "param(frozen)")
        elif self.persistable:
            flags.append("persist")
        if self.type is not VarType.LOD_TENSOR:
            flags.append(self.type.value)
        if self.lod_level:
            flags.append(f"lod={self.lod_level}")
        extra = (" " + " ".join(flags)) if flags else ""
        return f"{self.name}: {self.dtype}{list(self.shape)}{extra}"


def keeps_rows(x_shape: Sequence[int], shape: Sequence[int]) -> bool:
    """Whether a reshape of X to `shape` keeps X's first dim: its rows, so its LoD holds. The
    one rule the front end (`layers`, a reshape's Out's lod_level) and the kernels (the LoD
    a reshape passes on at run time) share."""
    return bool(len(x_shape) and len(shape)) and x_shape[0] == shape[0]


def _attr_to_plain(value: Any) -> Any:
    if isinstance(value, BlockRef):
        return {"__block__": value.idx}
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, BlockRef) for v in value):
            return {"__blocks__": [v.idx for v in value]}
        return [_attr_to_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _attr_from_plain(value: Any) -> Any:
    if isinstance(value, dict):
        if "__block__" in value:
            return BlockRef(int(value["__block__"]))
        if "__blocks__" in value:
            return [BlockRef(int(i)) for i in value["__blocks__"]]
    if isinstance(value, list):
        return [_attr_from_plain(v) for v in value]
    return value


@dataclass
class Op:
    type: str
    inputs: dict[str, list[str]] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.inputs = {k: list(v) for k, v in self.inputs.items()}
        self.outputs = {k: list(v) for k, v in self.outputs.items()}
        self.attrs.setdefault(OP_ROLE_ATTR, int(OpRole.Forward))

    # -- access ---------------------------------------------------------------------------------
    def input(self, slot: str) -> list[str]:
        return self.inputs.get(slot, [])

    def output(self, slot: str) -> list[str]:
        return self.outputs.get(slot, [])

    @property
    def input_names(self) -> list[str]:
        """The input slots, in order (fluid's ``Operator.input_names``)."""
        return list(self.inputs)

    @property
    def output_names(self) -> list[str]:
        """The output slots, in order (fluid's ``Operator.output_names``)."""
        return list(self.outputs)

    @property
    def input_arg_names(self) -> list[str]:
        return [n for names in self.inputs.values() for n in names]

    @property
    def output_arg_names(self) -> list[str]:
        return [n for names in self.outputs.values() for n in names]

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def has_attr(self, name: str) -> bool:
        return name in self.attrs

    def all_attrs(self) -> dict[str, Any]:
        """A copy of the attributes; a sub-block attribute is a `BlockRef` (``.idx``)."""
        return dict(self.attrs)

    @property
    def role(self) -> OpRole:
        return OpRole(int(self.attrs.get(OP_ROLE_ATTR, 0)))

    @role.setter
    def role(self, value: int) -> None:
        self.attrs[OP_ROLE_ATTR] = int(value)

    @property
    def role_var(self) -> list[str]:
        return list(self.attrs.get(OP_ROLE_VAR_ATTR, []))

    def rename_input(self, old: str, new: str) -> None:
        for names in self.inputs.values():
            for i, n in enumerate(names):
                if n == old:
                    names[i] = new

    def rename_output(self, old: str, new: str) -> None:
        for names in self.outputs.values():
            for i, n in enumerate(names):
                if n == old:
                    names[i] = new

    def sub_block_refs(self) -> list[BlockRef]:
        refs: list[BlockRef] = []
        for v in self.attrs.values():
            if isinstance(v, BlockRef):
                refs.append(v)
            elif isinstance(v, list):
                refs.extend(x for x in v if isinstance(x, BlockRef))
        return refs

    # -- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "inputs": {k: list(v) for k, v in self.inputs.items()},
            "outputs": {k: list(v) for k, v in self.outputs.items()},
            "attrs": {k: _attr_to_plain(v) for k, v in self.attrs.items()},
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Op":
        return Op(
            type=d["type"],
            inputs={k: list(v) for k, v in d["inputs"].items()},
            outputs={k: list(v) for k, v in d["outputs"].items()},
            attrs={k: _attr_from_plain(v) for k, v in d["attrs"].items()},
        )

    def __str__(self) -> str:
        def slots(s: dict[str, list[str]]) -> str:
            return ", ".join(f"{k}={v[0] if len(v) == 1 else v}" for k, v in s.items() if v)

        shown = {k: v for k, v in self.attrs.items() if k not in (OP_ROLE_ATTR, OP_ROLE_VAR_ATTR)}
        role = self.role
        parts = [f"{slots(self.outputs) or '_'} = {self.type}({slots(self.inputs)})"]
        if shown:
            parts.append("{" + ", ".join(f"{k}={_short(v)}" for k, v in shown.items()) + "}")
        if role != OpRole.Forward:
            parts.append(f"[{_role_str(role)}]")
        return " ".join(parts)


def _short(value: Any) -> str:
    if isinstance(value, BlockRef):
        return f"block{value.idx}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _role_str(role: OpRole) -> str:
    names = [r.name for r in OpRole if r.value and (role & r) and r.name]
    return "|".join(n for n in names if n)


class Block:
    def __init__(self, program: "Program", idx: int, parent_idx: int = -1) -> None:
        self.program = program
        self.idx = idx
        self.parent_idx = parent_idx
        self.vars: dict[str, Var] = {}
        self.ops: list[Op] = []
        self.forward_block_idx = -1

    # -- vars -----------------------------------------------------------------------------------
    def create_var(self, name: str, **kwargs: Any) -> Var:
        if name in self.vars:
            return self.vars[name]
        var = Var(name=name, **kwargs)
        return self.add_var(var)

    def add_var(self, var: Var) -> Var:
        var.block = self
        self.vars[var.name] = var
        return var

    def has_var(self, name: str) -> bool:
        return name in self.vars

    def var(self, name: str) -> Var:
        try:
            return self.vars[name]
        except KeyError:
            raise IRError(f"block {self.idx}: no var {name!r}") from None

    def find_var_recursive(self, name: str) -> Var | None:
        block: Block | None = self
        while block is not None:
            if name in block.vars:
                return block.vars[name]
            block = block.parent
        return None

    def remove_var(self, name: str) -> None:
        self.vars.pop(name, None)

    def create_parameter(self, name: str | None = None, shape: Iterable[int] = (),
                         dtype: str = "float32", initializer: Any = None, trainable: bool = True,
                         regularizer: WeightDecayRegularizer | None = None,
                         optimize_attr: Mapping[str, Any] | None = None,
                         need_clip: bool = True, gradient_clip: Any = None,
                         stop_gradient: bool = False) -> Var:
        """fluid's ``Block.create_parameter``: a parameter declared in the program's global
        block (persistable, trainable unless told). With an `initializer` (called as
        ``initializer(var, block)``) its op goes into *this* block, unless an op there already
        writes the parameter; fluid's layers call this on the startup program's block, a
        script that calls it on the main program's gets the init op in the main program, as
        in fluid. An existing parameter of the same shape is returned as it is."""
        gblock = self.program.global_block()
        if name is None:
            name = f"_generated_var_{sum(len(b.vars) for b in self.program.blocks)}"
        shape = tuple(int(d) for d in shape)
        if name in gblock.vars:
            param = gblock.vars[name]
            if param.shape != shape:
                raise IRError(f"parameter {name!r}: declared with shape {param.shape}, "
                              f"asked for {shape}")
        else:
            if not shape or any(d <= 0 for d in shape):
                raise IRError(f"parameter {name!r}: shape must be positive dims, got {shape}")
            param = gblock.add_var(Var(name, shape, dtype, persistable=True, is_parameter=True,
                                       trainable=trainable,
                                       stop_gradient=stop_gradient or not trainable,
                                       regularizer=regularizer,
                                       optimize_attr=dict(optimize_attr or {"learning_rate": 1.0}),
                                       need_clip=need_clip, gradient_clip=gradient_clip))
        if initializer is not None and not any(name in op.output_arg_names for op in self.ops):
            initializer(param, self)
        return param

    @property
    def parent(self) -> "Block | None":
        return self.program.blocks[self.parent_idx] if self.parent_idx >= 0 else None

    def all_parameters(self) -> list[Var]:
        return [v for v in self.vars.values() if v.is_parameter]

    # -- ops ------------------------------------------------------------------------------------
    def append_op(self, type: str, inputs: dict[str, Any] | None = None,
                  outputs: dict[str, Any] | None = None, attrs: dict[str, Any] | None = None) -> Op:
        op = Op(type, _names(inputs), _names(outputs), dict(attrs or {}))
        self.ops.append(op)
        return op

    def insert_op(self, index: int, type: str, inputs: dict[str, Any] | None = None,
                  outputs: dict[str, Any] | None = None, attrs: dict[str, Any] | None = None) -> Op:
        op = Op(type, _names(inputs), _names(outputs), dict(attrs or {}))
        self.ops.insert(index, op)
        return op

    def prepend_op(self, type: str, inputs: dict[str, Any] | None = None,
                   outputs: dict[str, Any] | None = None, attrs: dict[str, Any] | None = None) -> Op:
        return self.insert_op(0, type, inputs, outputs, attrs)

    def remove_op(self, index: int) -> None:
        del self.ops[index]

    # -- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "idx": self.idx,
            "parent_idx": self.parent_idx,
            "forward_block_idx": self.forward_block_idx,
            "vars": [v.to_dict() for v in self.vars.values()],
            "ops": [op.to_dict() for op in self.ops],
        }

    def __str__(self) -> str:
        lines = [f"block {self.idx} (parent {self.parent_idx}):"]
        lines += [f"  var {v}" for v in self.vars.values()]
        lines += [f"  {i:3d}: {op}" for i, op in enumerate(self.ops)]
        return "\n".join(lines)


def _names(slots: dict[str, Any] | None) -> dict[str, list[str]]:
    """Slot values may be a name, a Var, or a list of either."""
    out: dict[str, list[str]] = {}
    for slot, value in (slots or {}).items():
        items = value if isinstance(value, (list, tuple)) else [value]
        out[slot] = [v.name if isinstance(v, Var) else str(v) for v in items if v is not None]
    return out


class _DistAttr:
    """One of fluid's ``Program._is_distributed``-style attributes, kept in `Program.attrs`
    (where the transpiler writes them), with fluid's default when unset."""

    def __init__(self, default: Any) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, program: "Program | None", owner: type) -> Any:
        if program is None:
            return self
        value = program.attrs.get(self.name, self.default)
        return copy.copy(value) if isinstance(value, list) else value

    def __set__(self, program: "Program", value: Any) -> None:
        program.attrs[self.name] = value


@dataclass(frozen=True)
class VarShape:
    """A var's name and shape, where the original handed scripts a var of another program."""

    name: str
    shape: tuple[int, ...]


class _SliceVars:
    """fluid 1.2's ``Program._slice_vars_and_attrs`` of a pserver program: ``[origin,
    first row, block var]`` per block of a cut parameter it holds, read from the plain
    ``{"origin", "shape", "offset", "block"}`` entries the transpiler keeps in `attrs`."""

    def __get__(self, program: "Program | None", owner: type) -> Any:
        if program is None:
            return self
        return [[VarShape(e["origin"], tuple(e["shape"])), e["offset"],
                 program.global_block().var(e["block"])]
                for e in program.attrs.get("_slice_vars_and_attrs", [])]


class Program:
    # fluid's distributed-training attributes as Python attributes (``trainer._is_chief``):
    # each reads and writes `attrs`, where the transpiler writes them, with fluid's default.
    _is_distributed = _DistAttr(False)
    _is_chief = _DistAttr(False)
    _parameters_on_pservers = _DistAttr(None)
    _slice_vars_and_attrs = _SliceVars()
    _endpoints = _DistAttr([])
    _ps_endpoint = _DistAttr(None)
    _trainers_endpoints = _DistAttr([])
    _distributed_lookup_table = _DistAttr(None)
    _use_dgc = _DistAttr(False)
    _nccl_comm_num = _DistAttr(1)
    _use_hierarchical_allreduce = _DistAttr(False)
    _hierarchical_allreduce_inter_nranks = _DistAttr(0)

    def __init__(self) -> None:
        self.blocks: list[Block] = [Block(self, 0, -1)]
        self.current_block_idx = 0
        self.random_seed = 0
        self.attrs: dict[str, Any] = {}

    # -- blocks ---------------------------------------------------------------------------------
    def global_block(self) -> Block:
        return self.blocks[0]

    def block(self, idx: int) -> Block:
        return self.blocks[idx]

    def current_block(self) -> Block:
        return self.blocks[self.current_block_idx]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def create_block(self, parent_idx: int | None = None) -> Block:
        parent = self.current_block_idx if parent_idx is None else parent_idx
        block = Block(self, len(self.blocks), parent)
        self.blocks.append(block)
        self.current_block_idx = block.idx
        return block

    def rollback(self) -> None:
        self.current_block_idx = self.current_block().parent_idx

    def list_vars(self) -> Iterator[Var]:
        for block in self.blocks:
            yield from block.vars.values()

    def all_parameters(self) -> list[Var]:
        return self.global_block().all_parameters()

    def clone(self, for_test: bool = False) -> "Program":
        """A deep copy. With `for_test` (fluid's ``clone(for_test=True)``), the copy of the
        forward pass alone, for evaluation: if the program has a backward pass (an op of role
        Backward | Loss, the loss's gradient), every op with a Backward, Optimize or LRSched
        role goes (the gradients, the optimizer, the learning-rate schedule) and each block
        keeps only the vars its remaining ops name; and every op with an ``is_test``
        attribute, and every ``dropout`` and ``batch_norm``, gets ``is_test`` True (dropout
        passes its input through scaled, batch norm reads its running statistics). Blocks keep
        their indices: a backward sub-block is left empty rather than removed."""
        copy = Program.from_dict(self.to_dict())
        if for_test:
            copy._keep_forward()
        return copy

    def _keep_forward(self) -> None:
        """`clone(for_test=True)`'s pruning, in place."""
        loss_grad = int(OpRole.Backward | OpRole.Loss)
        if any(op.attrs.get(OP_ROLE_ATTR) == loss_grad
               for block in self.blocks for op in block.ops):
            training = int(OpRole.Backward | OpRole.Optimize | OpRole.LRSched)
            for block in self.blocks:
                block.ops = [op for op in block.ops if not op.role & training]
                named = {n for op in block.ops for n in (*op.input_arg_names, *op.output_arg_names)}
                block.vars = {n: v for n, v in block.vars.items() if n in named}
        for block in self.blocks:
            for op in block.ops:
                if op.type in _TEST_MODE_OPS or OP_IS_TEST_ATTR in op.attrs:
                    op.attrs[OP_IS_TEST_ATTR] = True

    def take_contents(self, other: "Program") -> None:
        """Become `other` in place: its blocks (now this program's), seed and attributes.
        What holds this object (`default_main_program`, a caller's variable) then sees
        `other`; `other` must not be used afterwards."""
        self.blocks = other.blocks
        for block in self.blocks:
            block.program = self
        self.current_block_idx = other.current_block_idx
        self.random_seed = other.random_seed
        self.attrs = other.attrs

    # -- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "random_seed": self.random_seed,
            "attrs": {k: _attr_to_plain(v) for k, v in self.attrs.items()},
            "blocks": [b.to_dict() for b in self.blocks],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Program":
        prog = Program()
        prog.random_seed = d["random_seed"]
        prog.attrs = {k: _attr_from_plain(v) for k, v in d.get("attrs", {}).items()}
        prog.blocks = []
        for bd in d["blocks"]:
            block = Block(prog, bd["idx"], bd["parent_idx"])
            block.forward_block_idx = bd.get("forward_block_idx", -1)
            for vd in bd["vars"]:
                block.add_var(Var.from_dict(vd))
            block.ops = [Op.from_dict(od) for od in bd["ops"]]
            prog.blocks.append(block)
        return prog

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and self.to_dict() == other.to_dict()

    def __str__(self) -> str:
        head = f"program (seed {self.random_seed})"
        if self.attrs:
            head += " " + ", ".join(f"{k}={_short(v)}" for k, v in self.attrs.items())
        return "\n".join([head] + [str(b) for b in self.blocks])

    def __deepcopy__(self, memo: dict[int, Any]) -> "Program":
        return self.clone()


def dumps_json(program: Program) -> str:
    return json.dumps(program.to_dict(), sort_keys=True)


def loads_json(text: str) -> Program:
    return Program.from_dict(json.loads(text))


def dumps_msgpack(program: Program) -> bytes:
    import msgpack

    return msgpack.packb(program.to_dict(), use_bin_type=True)


def loads_msgpack(data: bytes) -> Program:
    import msgpack

    return Program.from_dict(msgpack.unpackb(data, raw=False, strict_map_key=False))


def op_types(block: Block) -> list[str]:
    return [op.type for op in block.ops]


def verify(program: Program) -> None:
    """Check structure: parents, sub-block references, roles, and that every op input exists.

    An op may read a var declared in its block or any ancestor block. Raises `IRError` naming the
    block, op index and type, and the var or attribute at fault.
    """
    n = len(program.blocks)
    for i, block in enumerate(program.blocks):
        if block.idx != i:
            raise IRError(f"block {i}: stored index {block.idx} does not match position")
        if i == 0 and block.parent_idx != -1:
            raise IRError("block 0: the global block must have no parent")
        if i > 0 and not (0 <= block.parent_idx < n) or block.parent_idx == i:
            raise IRError(f"block {i}: parent index {block.parent_idx} is not a valid block")
        for name, var in block.vars.items():
            if name != var.name:
                raise IRError(f"block {i}: var stored as {name!r} is named {var.name!r}")
        for j, op in enumerate(block.ops):
            where = f"block {i}, op {j} ({op.type})"
            role = op.attrs.get(OP_ROLE_ATTR)
            if not isinstance(role, int) or role & ~sum(int(r) for r in OpRole):
                raise IRError(f"{where}: op_role {role!r} is not a combination of OpRole flags")
            role_var = op.attrs.get(OP_ROLE_VAR_ATTR, [])
            if len(role_var) % 2:
                raise IRError(f"{where}: op_role_var {role_var!r} is not a list of (param, grad) pairs")
            for ref in op.sub_block_refs():
                if not (0 < ref.idx < n) or ref.idx == i:
                    raise IRError(f"{where}: sub-block reference {ref.idx} is not a valid block")
            for slot, names in op.inputs.items():
                for name in names:
                    if block.find_var_recursive(name) is None:
                        raise IRError(f"{where}: input {slot} var {name!r} is not declared")
            for slot, names in op.outputs.items():
                for name in names:
                    if block.find_var_recursive(name) is None:
                        raise IRError(f"{where}: output {slot} var {name!r} is not declared")


def iter_ops(program: Program) -> Iterable[tuple[Block, int, Op]]:
    for block in program.blocks:
        for i, op in enumerate(block.ops):
            yield block, i, op


__all__ = [
    "BlockRef", "Block", "IRError", "Op", "OpRole", "Program", "Var", "VarType", "GRAD_SUFFIX",
    "grad_name", "strip_grad_suffix", "verify", "dumps_json", "loads_json", "dumps_msgpack",
    "loads_msgpack", "op_types", "iter_ops", "keeps_rows",
]
