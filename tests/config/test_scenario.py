"""Scenario schema: valid files load, bad ones name file, line, field and reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runtime.config import units
from runtime.config.scenario import ScenarioError, load_scenario, parse_scenario

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "scenario-example.yaml"


def test_units() -> None:
    assert units.duration("200us") == pytest.approx(200e-6)
    assert units.duration("2s") == 2.0 and units.duration(0.5) == 0.5
    assert units.duration("3ms") == pytest.approx(0.003)
    assert units.size("4MB") == 4e6 and units.size("1GiB") == 2**30
    assert units.rate("10Gbps") == pytest.approx(1.25e9)
    assert units.rate("50GB/s") == pytest.approx(50e9)
    assert units.flops("2TFLOPS") == pytest.approx(2e12)
    with pytest.raises(units.UnitError, match="unknown unit 'parsecs'"):
        units.duration("3parsecs")
    with pytest.raises(units.UnitError, match="not a number"):
        units.size("lots")


def test_minimal_scenario_gets_defaults() -> None:
    s = parse_scenario("name: t\nmodel: {name: mlp, sizes: [4, 8, 2]}\n")
    assert s.cluster.pservers == 1 and s.transpiler.mode == "sync" and s.train.steps == 100
    assert s.model.builder_kwargs() == {"sizes": [4, 8, 2]}
    assert s.model.optimizer.type == "sgd"


def test_the_example_with_every_section_loads() -> None:
    s = load_scenario(EXAMPLE)
    assert s.cluster.trainers == 4 and s.expect.max_step_time == pytest.approx(3.0)


BAD = """\
name: x
model: {name: mlp}
cluster:
  trainers: 0
train:
  steps: 10
  stepz: 3
transpiler: {mode: sync, dc_asgd: true}
"""


def test_errors_name_file_line_field_and_reason() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(BAD, "bad.yaml")
    lines = str(info.value).splitlines()
    assert "bad.yaml:4: cluster.trainers: Input should be greater than or equal to 1" in lines
    assert "bad.yaml:7: train.stepz: Extra inputs are not permitted (did you mean 'steps'?)" \
        in lines
    assert "bad.yaml:8: transpiler: dc_asgd needs mode async, not sync" in lines


def test_a_key_run_into_its_value_says_yaml_wants_a_space() -> None:
    """``{nodes:'*',cores:2}`` is YAML for keys ``nodes:'*'`` and ``cores:2``, no values."""
    with pytest.raises(ScenarioError) as info:
        parse_scenario("name: t\nmodel: {name: mlp}\n",
                       overrides=["cluster.hosts=[{nodes: '*', cores:2}]"])
    assert ("--set cluster.hosts=[{nodes: '*', cores:2}]: cluster.hosts.0.cores:2: Extra inputs "
            "are not permitted (YAML read 'cores:2' as one key: put a space after the colon, "
            "'cores: 2')") in str(info.value).splitlines()


@pytest.mark.parametrize("text,needle", [
    ("- a\n- b\n", "a mapping of sections"),
    ("name: [unclosed\n", "not valid YAML"),
    ("name: x\n", "model: Field required"),
    ("name: x\nmodel: {name: m}\ntrain: {deadline: 3parsecs}\n", "unknown unit"),
    ("name: x\nmodel: {name: m}\ncluster: {pservers: 2, endpoints: {pservers: ['a:1']}}\n",
     "lists 1 endpoints for 2 pservers"),
    ("name: x\nmodel: {name: m}\ntranspiler: {mode: async}\nexpect: {params_equal_to: local}\n",
     "params_equal_to needs transpiler.mode sync"),
    ("name: x\nmodel: {name: m}\nbackend: {device: cuda}\n", "device cuda needs kernels: torch"),
])
def test_bad_files(text: str, needle: str) -> None:
    with pytest.raises(ScenarioError, match=needle):
        parse_scenario(text, "f.yaml")


def test_overrides_are_validated() -> None:
    s = parse_scenario("name: t\nmodel: {name: mlp}\n", overrides=["cluster.trainers=4",
                                                                  "model.sizes=[3, 5]"])
    assert s.cluster.trainers == 4 and s.model.builder_kwargs()["sizes"] == [3, 5]
    with pytest.raises(ScenarioError, match="cluster.trainers"):
        parse_scenario("name: t\nmodel: {name: mlp}\n", overrides=["cluster.trainers=-1"])
    with pytest.raises(ScenarioError, match="expected path=value"):
        parse_scenario("name: t\nmodel: {name: mlp}\n", overrides=["cluster.trainers"])


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="nope.yaml: cannot read scenario"):
        load_scenario(tmp_path / "nope.yaml")


NETWORK_TYPOS = """\
name: x
model: {name: mlp}
network:
  default:
    latency: {dist: lognormal, median: 50us, sigm: 0.2}
    bandwith: 10Gbps
  links:
    - {between: ["trainer:0"], latency: 1ms}
  nics:
    - {nodes: "pserver:*", bandwidth: 10 furlongs}
"""


def test_a_typo_in_network_names_file_line_and_field() -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(NETWORK_TYPOS, "net.yaml")
    assert str(info.value).splitlines() == [
        "net.yaml:5: network.default.latency.sigma: Field required",
        "net.yaml:5: network.default.latency.sigm: Extra inputs are not permitted (did you "
        "mean 'sigma'?)",
        "net.yaml:6: network.default.bandwith: Extra inputs are not permitted (did you mean "
        "'bandwidth'?)",
        "net.yaml:8: network.links.0.between: needs two node patterns, got ['trainer:0']",
        "net.yaml:10: network.nics.0.bandwidth: rate '10 furlongs': unknown unit 'furlongs' "
        "(Gbps, Mbit/s, GB/s, MiB/s...)",
    ]


@pytest.mark.parametrize("text,needle", [
    ("network: {default: {latency: {dist: gamma, shape: 2}}}\n",
     "f.yaml:3: network.default.latency.dist: Input should be 'constant', 'uniform', 'normal' "
     "or 'lognormal'"),
    ("network: {defaults: {bandwidth: 1Gbps}}\n",
     "f.yaml:3: network.defaults: Extra inputs are not permitted (did you mean 'default'?)"),
    ("network:\n  links:\n    - between: [a, b]\n", "f.yaml:5: network.links.0: sets neither "
                                                       "latency nor bandwidth"),
])
def test_network_errors_point_at_their_line(text: str, needle: str) -> None:
    with pytest.raises(ScenarioError, match=f"^{re.escape(needle)}$"):
        parse_scenario("name: x\nmodel: {name: mlp}\n" + text, "f.yaml")


def test_network_overrides_are_validated_as_the_file_is() -> None:
    s = parse_scenario("name: t\nmodel: {name: mlp}\n", overrides=[
        "network.default.bandwidth=200Mbit/s", "network.default.latency={dist: uniform, "
        "low: 1ms, high: 2ms}"])
    assert s.network is not None and s.network.default.bandwidth == units.rate("200Mbit/s")
    with pytest.raises(ScenarioError, match=r": network.default.latency.high: Field required$"):
        parse_scenario("name: t\nmodel: {name: mlp}\n", "f.yaml",
                       overrides=["network.default.latency={dist: uniform, low: 1ms}"])


def test_every_shipped_scenario_network_validates() -> None:
    root = Path(__file__).resolve().parents[2] / "scenarios"
    for path in sorted(root.rglob("*.yaml")):
        scenario = load_scenario(path)
        if scenario.network is not None:
            assert scenario.network.default.bandwidth == units.rate("10Gbps"), path
