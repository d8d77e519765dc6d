"""The `runtime` command.

``runtime train`` builds a ready-made model, makes its data set, and trains it in this process
with the executor, printing the mean loss of each logging window and the throughput, then a
summary line. ``runtime up SCENARIO`` runs a scenario's pservers and trainers as processes on
this host, injecting its faults (`runtime.launch.launcher`, `runtime.faults.inject`; with
``--netns`` each in a network namespace of its own, the scenario's network applied,
`runtime.launch.netns`), or with ``--role``/``TRAINING_ROLE`` one of them in the foreground
(`runtime.services.node`); its output folder is locked for the run (`runtime.config.outdir`: a
second run into it is refused, exit status 2). ``runtime profile SCENARIO`` runs a scenario's
job as ``runtime up`` does with every node measuring its kernels and its runtime costs, and
writes a profile file the simulator's ``compute: {model: profile}`` reads
(`runtime.launch.profile`). ``runtime calibrate`` measures this machine (kernels over a grid of
shapes, the runtime's costs on a reference job) into the machine file that ``compute: {model:
calibrated}`` prices any job from (`runtime.launch.calibrate`). ``runtime collect OUT_DIR...``
merges the records of a job's nodes run one per host into one metrics.json and checks the
scenario's expectations (`runtime.launch.collect`). ``runtime keys DIR`` writes a job's CurveZMQ
keys for nodes on several hosts, and ``runtime keys DIR --export NODE OUT`` copies what one of
them needs, the public keys and its own secret (`runtime.network.curve`, SECURITY.md).

Errors (`runtime.config.commandline`): a bad flag, scenario or ``--set`` is one line,
``runtime up: error: <where>: <what>``, exit status 2, no traceback (``--debug`` adds it); an
unexpected exception is one line saying it is an internal error, exit status 70.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, Sequence, TextIO

from transpiler.models import DEFAULT_OPTIMIZERS, MODELS, Model, ModelError, build_model
from transpiler.optimizer import OPTIMIZERS

from runtime import Executor, Scope
from runtime.config.commandline import CommandParser, add_debug, run_command
from runtime.config.nodes import node_file_stem
from runtime.config.outdir import OutputDirError, check_output_file, claim_output
from runtime.config.scenario import ScenarioError, load_scenario
from runtime.config.version import version
from runtime.execution.data import DATASETS, DataError, Dataset, dataset_for
from runtime.launch.collect import collect
from runtime.launch.launcher import ignored_by_runtime, launch
from runtime.launch.netns import NetnsError, check_netns
from runtime.launch.role import run_node
from runtime.launch.profile import (ProfileError, check_profilable, cpu_total, fit_all,
                                    format_costs, format_table, measure_runs, profile_document,
                                    write_profile)
from runtime.network.curve import KeyFileError, export_keys, write_keys
from runtime.services.job import check_job
from runtime.services.node import (RoleError, add_arguments, load_for_role, node_options,
                                   node_security, resolve_role)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return value


def _add_train(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train a ready-made model in this process",
        description="Train a ready-made model on a data set in one process and print the loss.")
    p.add_argument("--model", required=True, choices=sorted(MODELS), help="model to build")
    p.add_argument("--data", choices=sorted(DATASETS),
                   help="data set (default: the model's own synthetic data)")
    p.add_argument("--steps", type=_positive_int, default=200, help="training steps (200)")
    p.add_argument("--batch-size", type=_positive_int, default=32, help="examples per step (32)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS),
                   help="optimizer (default: the model's, see transpiler.models.DEFAULT_OPTIMIZERS)")
    p.add_argument("--lr", type=_positive_float, help="learning rate (default: the model's)")
    p.add_argument("--seed", type=int, default=0, help="seed for parameters and data (0)")
    p.add_argument("--log-every", type=_positive_int, default=10,
                   help="print the mean loss every this many steps (10)")
    p.set_defaults(run=_train, parser=p)


def _add_up(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "up", help="run a scenario's pservers and trainers as processes",
        description="Start every pserver and trainer of a scenario as a process on this host, "
                    "inject the scenario's faults, show their progress, write OUT/logs, "
                    "OUT/metrics.json and OUT/params.npz, check the scenario's expect section, "
                    "and exit non-zero on any failure. "
                    "With --role (or TRAINING_ROLE and the PADDLE_* variables, as Paddle's "
                    "launchers set them) run that one node in the foreground instead.")
    add_arguments(p)
    p.add_argument("--netns", action="store_true",
                   help="run each node in a network namespace of its own and apply the "
                        "scenario's network: bandwidth as tc tbf, latency by a relay in front of "
                        "each pserver (needs root and iproute2)")
    p.set_defaults(run=_up, parser=p)


def _add_profile(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="measure a real run's kernels and runtime costs, for the simulator",
        description="Run a scenario's job for real as `runtime up` does (a process per node), "
                    "every node timing its kernels and its runtime costs (messages by kind and "
                    "size, per-op, per-step and per-round work, process CPU), and write a "
                    "profile: seconds per call or per output element of each op type, the "
                    "runtime's costs, and the machine, the file that "
                    "`compute: {model: profile, path: FILE}` makes the simulator use.")
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("-o", "--output", type=Path, default=Path("profile.json"),
                   help="the profile file to write (profile.json)")
    p.add_argument("--steps", type=_positive_int,
                   help="training steps to run (default: the scenario's train.steps)")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override a scenario field, e.g. --set cluster.trainers=4 (repeatable)")
    p.add_argument("--top", type=_positive_int, default=10,
                   help="op types listed in the summary table (10)")
    p.add_argument("--out", type=Path,
                   help="keep the measured run's logs and metrics here (default: a temporary "
                        "directory, removed afterwards)")
    p.add_argument("--runs", type=_positive_int, default=1,
                   help="measured runs; the profile is the one whose nodes used the median "
                        "CPU time (1)")
    p.add_argument("--netns", action="store_true",
                   help="measure with each node in a network namespace of its own and the "
                        "scenario's network applied, as runtime up --netns (root)")
    p.set_defaults(run=_profile, parser=p)


def _add_calibrate(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure this machine (kernels over shapes, the runtime's costs), so "
                          "that the simulator prices any job",
        description="Measure this machine, not a job: each op type's kernel time over a grid "
                    "of shapes (reference models from tiny to beyond the caches, numpy and torch "
                    "kernels), and the runtime's costs (messages by kind and size, encryption, "
                    "dispatch, per-step work) on a reference job run for real. Writes the "
                    "machine file that `compute: {model: calibrated, path: FILE}` makes the "
                    "simulator use for any scenario.")
    p.add_argument("-o", "--output", type=Path, default=Path("machine.json"),
                   help="the machine file to write (machine.json)")
    p.add_argument("--kernels", default=None, metavar="BACKENDS",
                   help="kernel backends to calibrate, comma-separated (default: numpy, and "
                        "torch where installed)")
    p.add_argument("--budget", type=float, default=120.0, metavar="SECONDS",
                   help="time the kernel grid may take; references past it are skipped and "
                        "named (120)")
    p.add_argument("--quick", action="store_true", help="a coarser grid (about half the time)")
    p.add_argument("--no-runtime", dest="runtime", action="store_false",
                   help="kernels only: skip the reference job that measures the runtime's costs")
    p.set_defaults(run=_calibrate, parser=p)


def _add_collect(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "collect", help="merge the records of a job's nodes run across hosts into metrics.json",
        description="Read the output directories of a job's nodes, each run on its own "
                    "(runtime up --role ... --out DIR, or Paddle's variables), check that they "
                    "ran one job, merge their records into one metrics.json (the run record "
                    "runtime up writes), check the scenario's expect section, and exit non-zero "
                    "when a node wrote no record or an expectation does not hold.")
    p.add_argument("dirs", nargs="+", type=Path, metavar="OUT_DIR",
                   help="a node's output directory (its --out), copied here; several nodes "
                        "may share one")
    p.add_argument("-o", "--output", type=Path, default=Path("."), metavar="OUT",
                   help="where to write metrics.json (the current directory)")
    p.set_defaults(run=_collect, parser=p)


def _collect(args: argparse.Namespace, out: TextIO) -> int:
    return collect(args.dirs, args.output, out)

def _add_keys(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "keys", help="write a job's CurveZMQ keys, for nodes on several hosts",
        description="Write a CurveZMQ keypair per pserver (pserver-J.key, public, and "
                    "pserver-J.key_secret, mode 0600) and per trainer (trainer-I.key, "
                    "trainer-I.key_secret) into DIR (mode 0700). Give every node the public "
                    "keys and its own secret file, and --keys DIR: --export NODE OUT copies "
                    "exactly those, for one node, into OUT. See SECURITY.md.")
    p.add_argument("directory", type=Path, metavar="DIR", help="where to write the keys")
    p.add_argument("--pservers", type=_positive_int,
                   help="pservers of the job (one keypair per endpoint)")
    p.add_argument("--trainers", type=_positive_int, help="trainers of the job")
    p.add_argument("--force", action="store_true", help="replace keys already in DIR")
    p.add_argument("--export", nargs=2, metavar=("NODE", "OUT"),
                   help="instead of writing keys, copy DIR's public keys and NODE's secret "
                        "(NODE: pserver-J or trainer-I), and no other, into OUT: that node's "
                        "--keys directory")
    p.set_defaults(run=_keys, parser=p)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="runtime", description="Run pslab programs: train locally, or run a scenario.")
    parser.add_argument("--version", action="version", version=f"%(prog)s (pslab) {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train(subparsers)
    _add_up(subparsers)
    _add_profile(subparsers)
    _add_calibrate(subparsers)
    _add_collect(subparsers)
    _add_keys(subparsers)
    add_debug(parser, subparsers)
    return parser


def optimizer_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The model's default optimizer with --optimizer and --lr applied."""
    spec = dict(DEFAULT_OPTIMIZERS[args.model])
    if args.optimizer:
        spec = {"type": args.optimizer, "learning_rate": spec["learning_rate"]}
    if args.lr:
        spec["learning_rate"] = args.lr
    return spec


def _setup(args: argparse.Namespace) -> tuple[Model, Dataset]:
    parser: argparse.ArgumentParser = args.parser
    try:
        model = build_model(args.model, seed=args.seed, optimizer=optimizer_spec(args))
    except ModelError as err:
        parser.error(f"argument --model/--optimizer: {err}")
    try:
        dataset = dataset_for(model, args.data, seed=args.seed)
    except DataError as err:
        parser.error(f"argument --data: {err}")
    return model, dataset


def _train(args: argparse.Namespace, out: TextIO) -> int:
    model, dataset = _setup(args)
    spec = optimizer_spec(args)
    print(f"training {model.name} on {dataset.name} ({dataset.size} examples): {args.steps} steps "
          f"of {args.batch_size}, {spec['type']} lr {spec['learning_rate']}, seed {args.seed}",
          file=out)
    exe, scope = Executor(), Scope()
    exe.run(model.startup, scope=scope)
    shard = dataset.shard(0, 1)
    window: list[float] = []
    first = last = float("nan")
    start = tick = time.perf_counter()
    for step in range(1, args.steps + 1):
        feed = shard.batch(step - 1, args.batch_size, model.feeds)
        (loss,) = exe.run(model.main, feed=feed, fetch_list=[model.loss], scope=scope)
        window.append(float(loss.reshape(-1)[0]))
        if step % args.log_every == 0 or step == args.steps:
            now = time.perf_counter()
            mean = sum(window) / len(window)
            first = mean if step <= args.log_every else first
            last = mean
            rate = len(window) * args.batch_size / max(now - tick, 1e-9)
            print(f"step {step:6d}  loss {mean:.4f}  samples/s {rate:.0f}", file=out)
            window, tick = [], now
    elapsed = time.perf_counter() - start
    print(f"done: {args.steps} steps in {elapsed:.2f}s, "
          f"{args.steps * args.batch_size / elapsed:.0f} samples/s, "
          f"loss {first:.4f} -> {last:.4f}", file=out)
    return 0


def _up(args: argparse.Namespace, out: TextIO) -> int:
    parser: argparse.ArgumentParser = args.parser
    try:
        role = resolve_role(args.role, args.index, args.endpoints, os.environ)
        options = node_options(role, args.bind, args.recover, args.incarnation)
        scenario = load_for_role(args.scenario, args.set, role)
    except (RoleError, ScenarioError) as err:
        parser.error(str(err))
    if scenario.backend.kernels == "phantom":
        parser.error(f"{args.scenario}: backend.kernels phantom is timing mode, which computes no "
                     "numbers: only the simulator runs it (sim run); a real run needs "
                     "backend.kernels numpy or torch")
    if role is not None and args.netns:
        parser.error(f"--netns runs every node of the job itself, in namespaces of its own; it "
                     f"does not combine with running one node ({role.name}, from "
                     f"{role.index_source})")
    try:
        ipc, keys = node_security(role, args.ipc, args.keys, args.insecure, os.environ)
    except RoleError as err:
        parser.error(str(err))
    if role is not None:
        try:
            return run_node(Path(args.scenario), args.set, scenario, role, args.out,
                            replace(options, keys=keys, ipc=ipc))
        except RoleError as err:
            parser.error(str(err))
        except OutputDirError as err:
            _refuse(parser, str(err))
    if args.netns:
        try:
            check_netns(scenario)
        except NetnsError as err:
            parser.error(f"--netns {err}")
    out_dir = args.out or Path(scenario.outputs.dir or Path("out") / scenario.name)
    try:
        return launch(Path(args.scenario), args.set, scenario, out_dir, out, netns=args.netns,
                      keys=keys, insecure=args.insecure, ipc=ipc)
    except OutputDirError as err:
        _refuse(parser, str(err))


def _refuse(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """End the command with exit status 2 and one line, without the usage text: the command
    line is well formed, what it asks for is not possible (an output folder in use)."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _keys(args: argparse.Namespace, out: TextIO) -> int:
    parser: argparse.ArgumentParser = args.parser
    writing = args.pservers is not None or args.trainers is not None or args.force
    if args.export is not None:
        if writing:
            parser.error("--export copies keys already written: it takes no --pservers, "
                         "--trainers or --force")
        node, target = args.export
        try:
            written = export_keys(args.directory, node, Path(target))
        except KeyFileError as err:
            print(f"runtime keys: {err}", file=sys.stderr)
            return 1
        print(f"copied {len(written)} key files to {target}: the public keys and {node}'s "
              "secret key, for --keys on its host", file=out)
        return 0
    if args.pservers is None or args.trainers is None:
        parser.error("give --pservers and --trainers (the keys to write), or --export NODE OUT")
    stems = [node_file_stem("pserver", j) for j in range(args.pservers)]
    stems += [node_file_stem("trainer", i) for i in range(args.trainers)]
    try:
        written = write_keys(args.directory, stems, force=args.force)
    except KeyFileError as err:
        print(f"runtime keys: {err}", file=sys.stderr)
        return 1
    print(f"wrote {len(written)} key files to {args.directory} (secret keys mode 0600): give "
          "each node the *.key public keys, its own <node>.key_secret and --keys DIR "
          "(runtime keys DIR --export NODE OUT copies those)", file=out)
    return 0


def _calibrate(args: argparse.Namespace, out: TextIO) -> int:
    from runtime.launch.calibrate import CalibrationError, calibrate, summary, write_machine
    from runtime.launch.profile import ProfileError

    parser: argparse.ArgumentParser = args.parser
    backends = None if args.kernels is None else [b.strip() for b in args.kernels.split(",")]
    for backend in backends or ():
        if backend not in ("numpy", "torch"):
            parser.error(f"--kernels: {backend!r} is not numpy or torch")
    if backends and "torch" in backends and importlib.util.find_spec("torch") is None:
        parser.error("--kernels torch: torch is not installed (pip install -e '.[torch]')")
    try:
        check_output_file(args.output, "machine.json")
    except OutputDirError as err:
        _refuse(parser, f"-o {args.output}: {err}")
    print(f"calibrating this machine into {args.output}: kernels over a grid of shapes, "
          f"then the runtime's costs (a budget of {args.budget:g}s for the kernels)",
          file=out, flush=True)
    try:
        document = calibrate(out, backends, args.quick, args.budget, args.runtime)
    except (CalibrationError, ProfileError) as err:
        print(f"runtime calibrate: {err}", file=sys.stderr)
        return 1
    write_machine(args.output, document)
    for line in summary(document):
        print(line, file=out)
    print(f"wrote {args.output} in {document['meta']['seconds']:g}s; use it with "
          f"compute: {{model: calibrated, path: {args.output}}}", file=out)
    return 0


def _profile(args: argparse.Namespace, out: TextIO) -> int:
    parser: argparse.ArgumentParser = args.parser
    overrides = args.set + ([f"train.steps={args.steps}"] if args.steps else [])
    try:
        scenario = load_scenario(args.scenario, overrides)
        check_job(scenario)
        check_profilable(scenario, args.scenario)
    except (ScenarioError, ProfileError) as err:
        parser.error(str(err))
    if args.netns:
        try:
            check_netns(scenario)
        except NetnsError as err:
            parser.error(f"--netns {err}")
    try:
        check_output_file(args.output, "profile.json")
    except OutputDirError as err:
        _refuse(parser, f"-o {args.output}: {err}")
    print(f"profiling {scenario.name}: {scenario.cluster.pservers} pserver(s) x "
          f"{scenario.cluster.trainers} trainer(s), {scenario.train.steps} steps, "
          f"{scenario.backend.kernels} kernels on {scenario.backend.device}, "
          "every node measuring", file=out, flush=True)
    with tempfile.TemporaryDirectory(prefix="pslab-profile-") as tmp:
        run_dir = args.out or Path(tmp)
        try:
            with claim_output(run_dir):
                run, totals = measure_runs(Path(args.scenario), overrides, scenario, run_dir,
                                           out, args.netns, args.runs)
        except OutputDirError as err:
            _refuse(parser, str(err))
        except ProfileError as err:
            print(f"runtime profile: {err}", file=sys.stderr)
            return 1
    fits = fit_all(run.times)
    document = profile_document(scenario, args.scenario, fits, run)
    document["meta"]["runs_cpu_seconds"] = totals
    write_profile(args.output, document)
    if len(totals) > 1:
        print("nodes' CPU seconds of each run: " + ", ".join(f"{t:.2f}" for t in totals)
              + f"; profiled: the median, {cpu_total(run):.2f}", file=out)
    print(f"measured {run.times.calls} kernel calls of {len(fits)} op types", file=out)
    for line in format_table(fits, args.top):
        print(line, file=out)
    for line in format_costs(run.costs):
        print(line, file=out)
    measured = document["meta"]["measured"]["step_time_median"]
    print(f"median step time of the measured run: {measured * 1e3:.2f}ms", file=out)
    print(f"wrote {args.output}", file=out)
    return 0


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args, lambda: int(args.run(args, out or sys.stdout)),
                       (ScenarioError, RoleError))


if __name__ == "__main__":
    sys.exit(main())
