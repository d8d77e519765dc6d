"""``python -m transpiler show``: print the program one role of a distributed job runs.

The job comes from a scenario file (its ``model``, ``seed``, ``cluster`` and ``transpiler``
sections; the rest belongs to the runtime and the simulator) or from a model name and cluster
flags. Both go through `distribute.from_spec`, as the runtime's jobs do, so what is shown is
what a node of that job runs. The YAML is read here with ``yaml.safe_load`` (the transpiler does
not import the runtime's schema); unknown fields of the sections read are errors.

Formats:

- ``text``: the program attributes (the pserver placement as a table), then each block, indented
  under its parent and labelled with its job (LR decay, optimize <grad>, prefetch, checkpoint,
  sub-block of an op), its vars, and one op a line:
  ``outputs = type(inputs) {attrs} [role param <- grad]``;
- ``json``: ``program.to_dict()``, which `Program.from_dict` reads back to an equal program;
- ``dot``: a Graphviz dataflow graph: ops are boxes, vars ellipses (persistable ones filled),
  an edge per input and output, each sub-block a cluster inside its parent's, and a dashed edge
  from an op to each block it runs.

Bad arguments exit with status 2 and a message naming the argument.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from .distribute.from_spec import MODES, SPLIT_METHODS, TranspileArgs, transpile_args
from .distribute.from_spec import transpile_from_spec
from .ir import OP_ROLE_VAR_ATTR, Block, BlockRef, Op, Program, Var
from .models import DEFAULT_OPTIMIZERS, MODELS, Model, build_model
from .optimizer import OPTIMIZERS

FORMATS = ("text", "json", "dot")
# runtime.config.scenario's defaults for the fields read here (OptimizerSpec, Scenario.seed).
SCENARIO_OPTIMIZER = {"type": "sgd", "learning_rate": 0.1}
MODEL_FIELDS = ("name", "optimizer", "lr")
# Flags that stand for a scenario field when a job is given by --model.
FLAG_OF_FIELD = {"cluster.pservers": "--pservers", "cluster.trainers": "--trainers",
                 "transpiler.min_block_size": "--min-block-size",
                 "transpiler.geo_push_every": "--geo-push-every", "transpiler.dc_asgd": "--dc-asgd"}
MODEL_FLAGS = ("pservers", "trainers", "mode", "split_method", "min_block_size", "no_slice",
               "dc_asgd", "geo_push_every", "optimizer", "lr", "seed")
MAX_ATTR = 100


class UsageError(ValueError):
    """A bad argument; `argument` is how the command line spells it."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"argument {argument}: {message}")


# -- roles ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeRole:
    """The node whose program is shown (``--role trainer:0``), spelled as `runtime.config.nodes`
    names nodes (the transpiler imports nothing of the runtime)."""

    kind: str  # trainer | pserver
    index: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"


def parse_role(text: str) -> NodeRole:
    match = re.fullmatch(r"(trainer|pserver):(\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected trainer:N or pserver:N, got {text!r}")
    return NodeRole(match.group(1), int(match.group(2)))


# -- the job --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TranspileJob:
    """A model and how to transpile it; `argument` and `prefix` say where they came from."""

    model: Model
    args: TranspileArgs
    argument: str
    prefix: str = ""


def read_scenario(path: str) -> dict[str, Any]:
    """The scenario file as a mapping, with a `model` mapping that names its builder."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise UsageError("SCENARIO", f"cannot read {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError("SCENARIO", f"{path}: not valid YAML{where}: "
                                     f"{getattr(err, 'problem', None) or err}") from None
    if not isinstance(raw, dict):
        raise UsageError("SCENARIO", f"{path}: a scenario is a mapping of sections")
    model = raw.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("name"), str):
        raise UsageError("SCENARIO", f"{path}: model.name: a model section naming a builder "
                                     f"({', '.join(sorted(MODELS))}) is required")
    if not isinstance(model.get("optimizer") or {}, dict):
        raise UsageError("SCENARIO", f"{path}: model.optimizer: must be a mapping such as "
                                     "{type: sgd, learning_rate: 0.1}")
    return raw


def scenario_job(path: str) -> TranspileJob:
    raw = read_scenario(path)
    spec = raw["model"]
    kwargs = {k: v for k, v in spec.items() if k not in MODEL_FIELDS}
    optimizer = {**SCENARIO_OPTIMIZER, **(spec.get("optimizer") or {})}
    try:
        model = build_model(spec["name"], optimizer=optimizer, lr=spec.get("lr"),
                            seed=raw.get("seed", 0), **kwargs)
        return TranspileJob(model, transpile_args(raw.get("transpiler"), raw.get("cluster")),
                            "SCENARIO", f"{path}: ")
    except ValueError as err:
        raise UsageError("SCENARIO", f"{path}: {err}") from None


def flags_job(args: argparse.Namespace) -> TranspileJob:
    optimizer = dict(DEFAULT_OPTIMIZERS[args.model])
    if args.optimizer:
        optimizer["type"] = args.optimizer
    if args.lr is not None:
        optimizer["learning_rate"] = args.lr
    transpiler = {"mode": args.mode or "sync", "slice_var_up": not args.no_slice,
                  "split_method": args.split_method or "round_robin", "dc_asgd": bool(args.dc_asgd)}
    transpiler.update({k: v for k, v in (("min_block_size", args.min_block_size),
                                         ("geo_push_every", args.geo_push_every)) if v is not None})
    cluster = {"pservers": 1 if args.pservers is None else args.pservers,
               "trainers": 1 if args.trainers is None else args.trainers}
    try:
        model = build_model(args.model, optimizer=optimizer, seed=args.seed or 0)
    except ValueError as err:
        raise UsageError("--optimizer" if args.lr is None else "--lr", str(err)) from None
    try:
        return TranspileJob(model, transpile_args(transpiler, cluster), "--model")
    except ValueError as err:
        field, _, reason = str(err).partition(": ")
        raise UsageError(FLAG_OF_FIELD.get(field, "--mode"), reason or field) from None


def role_program(job: TranspileJob, role: NodeRole, startup: bool) -> Program:
    """The main (or startup) program of `role` in `job`."""
    count = job.args.trainers if role.kind == "trainer" else len(job.args.pservers)
    if role.index >= count:
        raise UsageError("--role", f"{role} is not in the job, which has {count} "
                                   f"{role.kind}s ({role.kind}:0 to {role.kind}:{count - 1})")
    trainer_id = role.index if role.kind == "trainer" else 0
    try:
        t = transpile_from_spec(job.model.main, job.model.startup, job.args, trainer_id)
        if role.kind == "trainer":
            return t.get_trainer_startup_program() if startup else t.get_trainer_program()
        main, pserver_startup = t.get_pserver_programs(job.args.pservers[role.index])
    except ValueError as err:
        raise UsageError(job.argument, f"{job.prefix}cannot transpile: {err}") from None
    return pserver_startup if startup else main


# -- text -----------------------------------------------------------------------------------------

def _value(value: Any) -> str:
    if isinstance(value, BlockRef):
        return f"block {value.idx}"
    if isinstance(value, list) and value and all(isinstance(v, BlockRef) for v in value):
        return "[" + ", ".join(f"block {v.idx}" for v in value) + "]"
    text = repr(value)
    return text if len(text) <= MAX_ATTR else text[:MAX_ATTR - 3] + "..."


def _slots(slots: dict[str, list[str]]) -> str:
    return ", ".join(f"{k}={v[0] if len(v) == 1 else '[' + ', '.join(v) + ']'}"
                     for k, v in slots.items() if v)


def format_op(op: Op) -> str:
    """``outputs = type(inputs) {attrs} [role param <- grad]``."""
    attrs = {k: v for k, v in op.attrs.items() if k not in ("op_role", OP_ROLE_VAR_ATTR)}
    line = f"{_slots(op.outputs) or '_'} = {op.type}({_slots(op.inputs)})"
    if attrs:
        line += " {" + ", ".join(f"{k}={_value(v)}" for k, v in attrs.items()) + "}"
    role = "|".join(r.name for r in type(op.role) if r.value and r in op.role and r.name)
    pairs = op.role_var
    updates = ", ".join(f"{p} <- {g}" for p, g in zip(pairs[::2], pairs[1::2]))
    if role or updates:
        line += " [" + " ".join(filter(None, (role, updates))) + "]"
    return line


def block_labels(program: Program) -> dict[int, str]:
    """What each block is for, read from the ops that refer to it."""
    labels: dict[int, str] = {}
    for block in program.blocks:
        for i, op in enumerate(block.ops):
            for ref in op.sub_block_refs():
                labels.setdefault(ref.idx, f"run by block {block.idx} op {i} ({op.type})")
            if op.type == "listen_and_serv":
                labels.update(_listen_labels(op))
    return labels


def _listen_labels(op: Op) -> dict[int, str]:
    labels = {}
    for key, what in (("grad_to_block_id", "optimize"), ("prefetch_var_name_to_block_id",
                                                         "prefetch")):
        for entry in op.attr(key, []):
            name, _, idx = entry.rpartition(":")
            labels[int(idx)] = f"{what} {name}"
    if op.attr("lr_decay_block_id", -1) >= 0:
        labels[op.attr("lr_decay_block_id")] = "learning-rate decay"
    if op.attr("checkpint_block_id", -1) >= 0:
        labels[op.attr("checkpint_block_id")] = "checkpoint"
    for ref in op.attr("optimize_blocks", []):
        labels.setdefault(ref.idx, "optimize (empty)")
    return labels


def block_title(block: Block, labels: dict[int, str]) -> str:
    """``block 4, parent 3: optimize fc_w@GRAD``."""
    parent = f", parent {block.parent_idx}" if block.parent_idx >= 0 else ""
    label = f": {labels[block.idx]}" if block.idx in labels else ""
    return f"block {block.idx}{parent}{label}"


def _depth(block: Block) -> int:
    depth, parent = 0, block.parent
    while parent is not None:
        depth, parent = depth + 1, parent.parent
    return depth


def _placement(placed: list[dict[str, Any]]) -> list[str]:
    lines = [f"  {'kind':<9} {'name':<28} {'rows of origin':<30} {'shape':<14} endpoint"]
    for pv in placed:
        rows = f"{pv['origin']}[{pv['row_offset']}:{pv['row_offset'] + pv['shape'][0]}]" \
            if pv["shape"] else pv["origin"]
        lines.append(f"  {pv['kind']:<9} {pv['name']:<28} {rows:<30} "
                     f"{str(tuple(pv['shape'])):<14} {pv['endpoint']}")
    return lines


def format_text(program: Program) -> str:
    lines = [f"program (seed {program.random_seed}, {program.num_blocks} blocks)"]
    for key, value in program.attrs.items():
        if key != "_parameters_on_pservers":
            lines.append(f"  {key} = {_value(value)}")
    if program.attrs.get("_parameters_on_pservers"):
        lines.append("  _parameters_on_pservers:")
        lines += ["  " + line for line in _placement(program.attrs["_parameters_on_pservers"])]
    labels = block_labels(program)
    for block in program.blocks:
        pad = "  " * _depth(block)
        lines.append(pad + block_title(block, labels))
        lines += [f"{pad}  var {var}" for var in block.vars.values()]
        width = len(str(max(len(block.ops) - 1, 0)))
        lines += [f"{pad}  {i:>{width}}  {format_op(op)}" for i, op in enumerate(block.ops)]
    return "\n".join(lines) + "\n"


# -- dot ------------------------------------------------------------------------------------------

def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _quote(*lines: str) -> str:
    """A dot string (ID or label); several lines are joined by dot's ``\\n``."""
    return '"' + "\\n".join(_escape(line) for line in lines) + '"'


def _var_label(var: Var) -> str:
    kind = f" {var.type.value}" if var.type.value != "LOD_TENSOR" else ""
    return _quote(var.name, f"{var.dtype}{list(var.shape)}{kind}")


def _node(node_id: str, **attrs: str) -> str:
    """A dot node statement; attribute values are written as they are given."""
    return f"{_quote(node_id)} [{', '.join(f'{k}={v}' for k, v in attrs.items())}];"


class _DotWriter:
    """Nodes go into the cluster of the block that declares them; edges go at the top level."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.labels = block_labels(program)
        self.children: dict[int, list[Block]] = {}
        for block in program.blocks[1:]:
            self.children.setdefault(block.parent_idx, []).append(block)
        self.used: dict[int, set[str]] = {}
        self.edges: list[str] = []
        for block in program.blocks:
            for i, op in enumerate(block.ops):
                self._op_edges(block, i, op)

    def _var_id(self, block: Block, name: str) -> str:
        """The node of var `name` as `block` sees it (declared there or in an ancestor)."""
        var = block.find_var_recursive(name)
        owner = var.block.idx if var is not None and var.block is not None else block.idx
        self.used.setdefault(owner, set()).add(name)
        return _quote(f"var:{owner}:{name}")

    def _op_edges(self, block: Block, i: int, op: Op) -> None:
        node = _quote(f"op:{block.idx}:{i}")
        self.edges += [f"  {self._var_id(block, n)} -> {node};" for n in op.input_arg_names]
        self.edges += [f"  {node} -> {self._var_id(block, n)};" for n in op.output_arg_names]
        for ref in op.sub_block_refs():
            entry = f"op:{ref.idx}:0" if self.program.block(ref.idx).ops else f"empty:{ref.idx}"
            self.edges.append(f"  {node} -> {_quote(entry)} [style=dashed, "
                              f"lhead=cluster_{ref.idx}];")

    def _op_nodes(self, block: Block) -> list[str]:
        if not block.ops:
            return [_node(f"empty:{block.idx}", shape="plaintext", label='"(empty)"')]
        return [_node(f"op:{block.idx}:{i}", shape="box", label=_quote(f"{i}: {op.type}"))
                for i, op in enumerate(block.ops)]

    def _var_nodes(self, block: Block) -> list[str]:
        nodes = []
        for name in sorted(self.used.get(block.idx, ())):
            var = block.vars.get(name)
            style = {"style": "filled", "fillcolor": "lightgrey"} \
                if var is not None and var.persistable else {}
            label = _var_label(var) if var is not None else _quote(name)
            nodes.append(_node(f"var:{block.idx}:{name}", shape="ellipse", label=label, **style))
        return nodes

    def block_lines(self, block: Block, pad: str) -> list[str]:
        """The nodes of `block`, then a cluster per child block."""
        lines = [pad + line for line in self._op_nodes(block) + self._var_nodes(block)]
        for child in self.children.get(block.idx, []):
            lines.append(f"{pad}subgraph cluster_{child.idx} {{")
            lines.append(f"{pad}  label={_quote(block_title(child, self.labels))};")
            lines += self.block_lines(child, pad + "  ")
            lines.append(f"{pad}}}")
        return lines

    def render(self) -> str:
        head = ["digraph program {", "  compound=true;", "  rankdir=TB;",
                '  node [fontname="monospace", fontsize=10];']
        return "\n".join(head + self.block_lines(self.program.global_block(), "  ")
                         + self.edges + ["}"]) + "\n"


def format_dot(program: Program) -> str:
    return _DotWriter(program).render()


def format_json(program: Program) -> str:
    return json.dumps(program.to_dict(), indent=1, sort_keys=True) + "\n"


FORMATTERS = {"text": format_text, "json": format_json, "dot": format_dot}


# -- the command ----------------------------------------------------------------------------------

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "show", help="print the program one role of a distributed job runs",
        description="Transpile a scenario's model (or --model with cluster flags) and print the "
                    "main or startup program of one trainer or pserver.")
    p.add_argument("scenario", nargs="?", metavar="SCENARIO", help="scenario YAML file")
    p.add_argument("--role", type=parse_role, required=True, help="trainer:N or pserver:N")
    p.add_argument("--startup", action="store_true", help="the role's startup program")
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (text)")
    jobs = p.add_argument_group("a job without a scenario")
    jobs.add_argument("--model", choices=sorted(MODELS), help="a ready model (instead of SCENARIO)")
    jobs.add_argument("--pservers", type=int, help="pservers (1), at 127.0.0.1:6170+i")
    jobs.add_argument("--trainers", type=int, help="trainers (1)")
    jobs.add_argument("--mode", choices=MODES, help="training mode (sync)")
    jobs.add_argument("--split-method", choices=sorted(SPLIT_METHODS), help="(round_robin)")
    jobs.add_argument("--min-block-size", type=int, help="elements per block, >= 8192 (8192)")
    jobs.add_argument("--no-slice", action="store_true", default=None,
                      help="keep every var in one block")
    jobs.add_argument("--dc-asgd", action="store_true", default=None,
                      help="delay-compensated async SGD (--mode async)")
    jobs.add_argument("--geo-push-every", type=int, help="steps between geo pushes (100)")
    jobs.add_argument("--optimizer", choices=sorted(OPTIMIZERS), help="(the model's default)")
    jobs.add_argument("--lr", type=float, help="learning rate (the model's default)")
    jobs.add_argument("--seed", type=int, help="seed of the model's programs (0)")
    p.set_defaults(run=run, parser=p)


def _job(args: argparse.Namespace) -> TranspileJob:
    given = [f"--{f.replace('_', '-')}" for f in MODEL_FLAGS if getattr(args, f) is not None]
    if args.scenario and args.model:
        raise UsageError("--model", "give SCENARIO or --model, not both")
    if args.scenario:
        if given:
            raise UsageError(given[0], "only with --model; a scenario sets it in its sections")
        return scenario_job(args.scenario)
    if not args.model:
        raise UsageError("SCENARIO", "give a scenario file, or --model with cluster flags")
    return flags_job(args)


def run(args: argparse.Namespace, out: TextIO) -> int:
    parser: argparse.ArgumentParser = args.parser
    try:
        job = _job(args)
        program = role_program(job, args.role, args.startup)
    except UsageError as err:
        parser.error(str(err))
    out.write(FORMATTERS[args.format](program))
    return 0

