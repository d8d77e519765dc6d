"""``python -m transpiler show`` and the scenario-to-config mapping it shares with the runtime
(`transpiler.distribute.from_spec`): every format, both ways of naming a job, and errors that
name the argument."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import transpiler as T
from runtime.config.scenario import load_scenario
from runtime.services.job import Job
from transpiler.__main__ import main
from transpiler.distribute.from_spec import (config_from_spec, pserver_endpoints, transpile_args,
                                             transpile_from_spec)
from transpiler.ir import Program
from transpiler.models import build_model
from transpiler.show import format_dot, format_text

ROOT = Path(__file__).resolve().parents[2]
MLP = ["--model", "mlp", "--pservers", "2", "--trainers", "2"]
EP0, EP1 = "127.0.0.1:6170", "127.0.0.1:6171"
SCENARIO = """\
name: ctr
seed: 3
model:
  name: ctr_dnn
  vocab: 500
  optimizer: {type: adam, learning_rate: 0.01}
  lr: {type: exponential_decay, decay_steps: 10, decay_rate: 0.5}
cluster: {pservers: 3, trainers: 4}
transpiler: {mode: async, split_method: hash_name, min_block_size: 8192}
train: {steps: 5}
network: {default: {bandwidth: 10Gbps}}
"""


def show(*argv: str) -> str:
    out = io.StringIO()
    assert main(["show", *argv], out=out) == 0
    return out.getvalue()


def fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The last line of the usage error `show` exits with (status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["show", *argv], out=io.StringIO())
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


PIECEWISE: dict[str, object] = {"type": "piecewise_decay", "boundaries": [5], "values": [0.1, 0.01]}


def transpiled(trainers: int = 2, trainer_id: int = 0,
               lr: dict[str, object] | None = None) -> T.DistributeTranspiler:
    """mlp with its default SGD on 2 pservers, as the CLI's --model jobs build it."""
    built = build_model("mlp", optimizer={"type": "sgd", "learning_rate": 0.1}, lr=lr)
    args = transpile_args({}, {"pservers": 2, "trainers": trainers})
    return transpile_from_spec(built.main, built.startup, args, trainer_id)


def from_json(text: str) -> Program:
    return Program.from_dict(json.loads(text))


def scenario_file(tmp_path: Path, text: str = SCENARIO) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


# -- text -----------------------------------------------------------------------------------------

def test_text_shows_each_block_with_its_job_and_one_op_a_line() -> None:
    lines = show(*MLP, "--role", "pserver:0", "--optimizer", "adam").splitlines()
    assert lines[0] == "program (seed 0, 3 blocks)"
    assert "  _endpoints = ['127.0.0.1:6170', '127.0.0.1:6171']" in lines
    assert ["block 0", "  block 1, parent 0: optimize mlp.fc0.b@GRAD",
            "  block 2, parent 0: optimize mlp.fc1.b@GRAD"] == \
        [line for line in lines if line.lstrip().startswith("block ")]
    (listen,) = [line for line in lines if "listen_and_serv(" in line]
    assert re.fullmatch(r"  0  _ = listen_and_serv\(X=\[mlp\.fc0\.b@GRAD\.trainer_0, .*\]\) "
                        r"\{optimize_blocks=\[block 1, block 2\], endpoint='127\.0\.0\.1:6170', "
                        r".*\} \[RPC\]", listen)
    ops = [line for line in lines if re.match(r"    \d  ", line)]
    assert [line.split(" = ")[1].split("(")[0] for line in ops] == \
        ["sum", "scale", "adam", "scale", "scale"] * 2
    assert ops[2].startswith("    2  ParamOut=mlp.fc0.b, Moment1Out=moment1_0, "
                             "Moment2Out=moment2_0 = adam(Param=mlp.fc0.b, Grad=mlp.fc0.b@GRAD, ")
    assert ops[2].endswith("{beta1=0.9, beta2=0.999, epsilon=1e-08, lazy_mode=False} "
                           "[Optimize mlp.fc0.b <- mlp.fc0.b@GRAD]")
    assert "  var moment1_0: float32[128] persist" in lines


def test_text_lists_where_every_param_block_lives() -> None:
    text = show(*MLP, "--role", "trainer:1")
    rows = re.findall(r"^    (Param|Optimizer) +(\S+) +(\S+) +(\(.*?\)) +(\S+)$", text, re.M)
    assert rows == [("Param", "mlp.fc0.b", "mlp.fc0.b[0:128]", "(128,)", EP0),
                    ("Param", "mlp.fc1.b", "mlp.fc1.b[0:10]", "(10,)", EP0),
                    ("Param", "mlp.fc0.w", "mlp.fc0.w[0:64]", "(64, 128)", EP1),
                    ("Param", "mlp.fc1.w", "mlp.fc1.w[0:128]", "(128, 10)", EP1)]
    assert "  _trainer_id = 1" in text.splitlines()
    sends = re.findall(r"^ +\d+  Out=@SEND@\S+ = send\(X=(\S+)\) \{epmap=\['(\S+)'\].*"
                       r"\[RPC (\S+) <- (\S+)\]$", text, re.M)
    assert sends[0] == ("mlp.fc1.b@GRAD.trainer_1", EP0, "mlp.fc1.b", "mlp.fc1.b@GRAD.trainer_1")


def test_text_indents_sub_blocks_under_their_parent_and_says_who_runs_them() -> None:
    t = transpiled(trainers=1, lr=PIECEWISE)
    lines = format_text(t.get_pserver_program(EP0)).splitlines()
    assert "  block 1, parent 0: learning-rate decay" in lines
    assert "    block 2, parent 1: run by block 1 op 6 (conditional_block)" in lines
    assert "      0  Out=learning_rate = assign(X=fill_constant.tmp_1) [LRSched]" in lines
    assert "      block 4, parent 3: optimize mlp.fc0.b@GRAD" in lines


def test_text_startup_shows_the_initializers_of_the_role() -> None:
    text = show(*MLP, "--role", "pserver:1", "--startup")
    inits = re.findall(r"^ +\d+  Out=(\S+) = (\w+)\(\) \{shape=(\[.*?\])", text, re.M)
    assert ("mlp.fc0.w", "uniform_random", "[64, 128]") in inits
    assert ("mlp.fc1.w", "uniform_random", "[128, 10]") in inits


# -- json -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("role,startup", [("trainer:0", False), ("trainer:1", True),
                                          ("pserver:0", False), ("pserver:1", True)])
def test_json_reads_back_to_the_role_program(role: str, startup: bool) -> None:
    text = show(*MLP, "--role", role, *(["--startup"] if startup else []), "--format", "json")
    kind, index = role.split(":")
    t = transpiled(trainer_id=int(index) if kind == "trainer" else 0)
    if kind == "trainer":
        expected = t.get_trainer_startup_program() if startup else t.get_trainer_program()
    else:
        expected = t.get_pserver_programs([EP0, EP1][int(index)])[int(startup)]
    assert from_json(text) == expected


def test_model_flags_map_onto_the_config() -> None:
    text = show("--model", "mlp", "--pservers", "3", "--role", "pserver:2", "--mode", "async",
                "--dc-asgd", "--split-method", "hash_name", "--format", "json")
    (listen,) = from_json(text).global_block().ops
    assert listen.attr("endpoint") == "127.0.0.1:6172" and listen.attr("dc_asgd") is True
    assert listen.attr("distributed_mode") == int(T.DistributedMode.ASYNC)
    geo = from_json(show(*MLP, "--role", "pserver:0", "--mode", "geo", "--no-slice",
                         "--format", "json"))
    assert geo.global_block().ops[0].attr("distributed_mode") == int(T.DistributedMode.GEO)


# -- dot ------------------------------------------------------------------------------------------

def dot_parts(text: str) -> tuple[set[str], list[tuple[str, str]], list[str]]:
    """Declared node ids, edges, and cluster ids of a dot graph written by `format_dot`."""
    nodes = set(re.findall(r'^ *("[^"]+") \[shape=', text, re.M))
    edges = re.findall(r'^ *("[^"]+") -> ("[^"]+")', text, re.M)
    clusters = re.findall(r"^ *subgraph cluster_(\d+) \{$", text, re.M)
    return nodes, edges, clusters


def test_dot_is_a_dataflow_graph_with_a_cluster_per_sub_block() -> None:
    text = show(*MLP, "--role", "pserver:0", "--format", "dot")
    lines = text.splitlines()
    assert lines[0] == "digraph program {" and lines[-1] == "}"
    assert text.count("{") == text.count("}")
    nodes, edges, clusters = dot_parts(text)
    assert clusters == ["1", "2"]
    assert all(a in nodes and b in nodes for a, b in edges)
    assert '"op:1:2" [shape=box, label="2: sgd"];' in text
    assert '"var:0:mlp.fc0.b" [shape=ellipse, label="mlp.fc0.b\\nfloat32[128]", ' \
           'style=filled, fillcolor=lightgrey];' in text
    assert ('"var:0:mlp.fc0.b@GRAD.trainer_1"', '"op:0:0"') in edges  # received
    assert ('"op:1:2"', '"var:0:mlp.fc0.b"') in edges  # sgd writes the param
    assert '  "op:0:0" -> "op:1:0" [style=dashed, lhead=cluster_1];' in lines


def test_dot_nests_clusters_and_marks_empty_blocks() -> None:
    t = transpiled(trainers=1, lr=PIECEWISE)
    text = format_dot(t.get_pserver_program(EP0))
    nodes, edges, clusters = dot_parts(text)
    assert clusters[:3] == ["1", "2", "3"]
    assert all(a in nodes and b in nodes for a, b in edges)
    head = text[text.index("subgraph cluster_1"):text.index("subgraph cluster_2")]
    assert '"op:1:0" [shape=box, label="0: increment"];' in head
    empty = build_model("linear", optimizer={"type": "sgd", "learning_rate": 0.1})
    args = transpile_args({"slice_var_up": False}, {"pservers": 3})
    programs = [transpile_from_spec(empty.main, empty.startup, args).get_pserver_program(ep)
                for ep in args.pservers]
    (idle,) = [p for p in programs if not p.block(1).ops]
    assert '"empty:1" [shape=plaintext, label="(empty)"];' in format_dot(idle)


# -- scenarios ------------------------------------------------------------------------------------

def test_a_scenario_shows_what_the_runtime_runs(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    job = Job.from_scenario(load_scenario(path))
    trainer = from_json(show(path, "--role", "trainer:3", "--format", "json"))
    assert trainer == job.trainer_programs(3)[0]
    startup = from_json(show(path, "--role", "pserver:2", "--startup", "--format", "json"))
    assert startup == job.pserver_programs(2)[1]


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT))
                                        for p in (ROOT / "scenarios").glob("*.yaml")))
def test_every_shipped_scenario_shows_what_the_runtime_runs(path: str) -> None:
    job = Job.from_scenario(load_scenario(ROOT / path))
    last = f"pserver:{len(job.endpoints) - 1}"
    assert from_json(show(str(ROOT / path), "--role", "trainer:0", "--format", "json")) == \
        job.trainer_programs(0)[0]
    if not job.endpoints:  # nccl2, collective: no pservers
        return
    assert from_json(show(str(ROOT / path), "--role", last, "--format", "json")) == \
        job.pserver_programs(len(job.endpoints) - 1)[0]


def test_a_scenario_without_optimizer_or_sections_takes_the_schema_defaults(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, "name: x\nmodel: {name: linear}\n")
    job = Job.from_scenario(load_scenario(path))
    main_program = from_json(show(path, "--role", "pserver:0", "--format", "json"))
    assert main_program == job.pserver_programs(0)[0]
    assert main_program.global_block().ops[0].attr("endpoint") == EP0


# -- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,message", [
    (["--role", "worker:0", *MLP],
     "argument --role: expected trainer:N or pserver:N, got 'worker:0'"),
    (["--role", "pserver:2", *MLP],
     "argument --role: pserver:2 is not in the job, which has 2 pservers (pserver:0 to pserver:1)"),
    (["--role", "trainer:5", *MLP],
     "argument --role: trainer:5 is not in the job, which has 2 trainers (trainer:0 to trainer:1)"),
    (["--role", "trainer:0"],
     "argument SCENARIO: give a scenario file, or --model with cluster flags"),
    (["no/such.yaml", "--role", "trainer:0"],
     "argument SCENARIO: cannot read no/such.yaml: No such file or directory"),
    (["--role", "trainer:0", *MLP, "--min-block-size", "100"],
     "argument --min-block-size: must be an int >= 8192, got 100"),
    (["--role", "trainer:0", *MLP, "--dc-asgd"], "argument --dc-asgd: needs mode async, not sync"),
    (["--role", "trainer:0", "--model", "mlp", "--pservers", "0"],
     "argument --pservers: must be an int >= 1, got 0"),
    (["--role", "trainer:0", *MLP, "--format", "svg"], "argument --format: invalid choice: 'svg'"),
    (["--role", "trainer:0", *MLP, "--lr", "-1"],
     "argument --lr: SGD: learning_rate must be positive, got -1.0"),
])
def test_bad_arguments_exit_2_naming_the_argument(capsys: pytest.CaptureFixture[str],
                                                  argv: list[str], message: str) -> None:
    assert fails(capsys, *argv).startswith("python -m transpiler show: error: " + message)


@pytest.mark.parametrize("text,message", [
    ("model: [1, 2]\n", "model.name: a model section naming a builder"),
    ("model: {name: mlp}\ntranspiler: {mode: turbo}\n",
     "transpiler.mode: must be one of sync, async, ssp, half_async, geo, nccl2, collective, got 'turbo'"),
    ("model: {name: mlp}\ntranspiler: {slice: true}\n", "transpiler.slice: unknown field"),
    ("model: {name: mlp}\ncluster: {pservers: 2, endpoints: {pservers: ['a:1']}}\n",
     "cluster.endpoints.pservers: must list 2 endpoints"),
    ("model: {name: resnet}\n", "unknown model 'resnet'"),
    ("model: {name: mlp, optimizer: adam}\n", "model.optimizer: must be a mapping"),
    ("model: {name: mlp, depth: 3}\n", "unexpected keyword argument 'depth'"),
    ("model: {name: ctr_dnn, is_distributed: true}\ntranspiler: {mode: geo}\n",
     "cannot transpile: program: geo_sgd_mode does not support the distributed lookup table"),
    ("model: {name: mlp\n", "not valid YAML (line 2): expected ',' or '}'"),
])
def test_bad_scenarios_exit_2_naming_the_field(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path, text: str, message: str) -> None:
    path = scenario_file(tmp_path, text)
    line = fails(capsys, path, "--role", "trainer:0")
    assert line.startswith(f"python -m transpiler show: error: argument SCENARIO: {path}: ")
    assert message in line


def test_a_scenario_takes_no_cluster_flags(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    assert fails(capsys, path, "--role", "trainer:0", "--pservers", "2").endswith(
        "argument --pservers: only with --model; a scenario sets it in its sections")
    assert fails(capsys, path, "--role", "trainer:0", "--model", "mlp").endswith(
        "argument --model: give SCENARIO or --model, not both")


def test_python_dash_m_runs_the_command() -> None:
    ok = subprocess.run([sys.executable, "-m", "transpiler", "show", "--model", "linear",
                         "--role", "pserver:0"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "listen_and_serv(" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "transpiler", "show", "--model", "linear",
                          "--role", "pserver:1"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "argument --role: pserver:1 is not in the job" in bad.stderr


# -- from_spec ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,mode,fields", [
    ({}, T.DistributedMode.SYNC, {"sync_mode": True, "runtime_split_send_recv": False}),
    ({"mode": "async"}, T.DistributedMode.ASYNC,
     {"sync_mode": False, "runtime_split_send_recv": True, "enable_dc_asgd": False}),
    ({"mode": "async", "dc_asgd": True}, T.DistributedMode.ASYNC, {"enable_dc_asgd": True}),
    ({"mode": "half_async", "geo_push_every": 100, "dc_asgd": False}, T.DistributedMode.HALF_ASYNC,
     {"sync_mode": False, "half_async": True, "runtime_split_send_recv": False}),
    ({"mode": "geo", "geo_push_every": 7}, T.DistributedMode.GEO,
     {"geo_sgd_mode": True, "geo_sgd_need_push_nums": 7}),
    ({"slice_var_up": False, "split_method": "hash_name", "min_block_size": 10000},
     T.DistributedMode.SYNC, {"slice_var_up": False, "split_method": T.HashName,
                              "min_block_size": 10000}),
])
def test_config_from_spec_maps_each_mode(spec: dict[str, object], mode: T.DistributedMode,
                                         fields: dict[str, object]) -> None:
    from transpiler.distribute.config import resolve_mode

    config, sync_mode = config_from_spec(spec)
    assert resolve_mode(config, sync_mode) is mode
    assert {k: getattr(config, k) for k in fields} == fields


@pytest.mark.parametrize("cluster,endpoints", [
    (None, ("127.0.0.1:6170",)),
    ({"pservers": 3}, ("127.0.0.1:6170", "127.0.0.1:6171", "127.0.0.1:6172")),
    ({"pservers": 2, "host": "10.1.1.1", "base_port": 7000}, ("10.1.1.1:7000", "10.1.1.1:7001")),
    ({"pservers": 2, "endpoints": {"pservers": ["a:1", "b:2"], "trainers": ["c:3"]}},
     ("a:1", "b:2")),
])
def test_pserver_endpoints(cluster: dict[str, object] | None, endpoints: tuple[str, ...]) -> None:
    assert pserver_endpoints(cluster) == endpoints


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_graphviz_renders_the_dot_output_without_warnings() -> None:
    model = build_model("ctr_dnn", is_distributed=True, lr=PIECEWISE)
    t = transpile_from_spec(model.main, model.startup,
                            transpile_args({}, {"pservers": 2, "trainers": 2}), 0)
    for program in (t.get_trainer_program(), t.get_pserver_program(EP1)):
        done = subprocess.run(["dot", "-Tsvg"], input=format_dot(program), capture_output=True,
                              text=True)
        assert done.returncode == 0 and done.stderr == "" and "<svg" in done.stdout


@pytest.mark.parametrize("transpiler,cluster,message", [
    ({"min_block_size": 100}, None, "transpiler.min_block_size: must be an int >= 8192, got 100"),
    ({"mode": "geo", "dc_asgd": True}, None, "transpiler.dc_asgd: needs mode async, not geo"),
    ({"mode": "async", "dc_asgd": "yes"}, None, "transpiler.dc_asgd: must be a bool, got 'yes'"),
    ({"mode": "geo", "geo_push_every": 0}, None,
     "transpiler.geo_push_every: must be an int >= 1, got 0"),
    ({"split_method": "random"}, None,
     "transpiler.split_method: must be one of round_robin, hash_name, got 'random'"),
    ([], None, "transpiler: must be a mapping, got list"),
    (None, {"trainers": True}, "cluster.trainers: must be an int >= 1, got True"),
    (None, {"pservers": 2, "base_port": 65535}, "cluster.base_port: must be an int in 0..65533"),
    (None, {"workers": 2}, "cluster.workers: unknown field"),
])
def test_transpile_args_name_the_scenario_field(transpiler: object, cluster: object,
                                                message: str) -> None:
    with pytest.raises(ValueError) as err:
        transpile_args(transpiler, cluster)  # type: ignore[arg-type]
    assert str(err.value).startswith(message)
