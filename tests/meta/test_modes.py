"""The MODES table (transpiler/distribute/modes.py): the one home of every mode's facts, read
by the scenario schema, the transpiler config, the fault validation and the pserver."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from runtime.config.scenario import ScenarioError, TranspilerSpec, parse_scenario
from runtime.services.pserver_core import POLICIES
from transpiler.distribute.contract import ServeContract
from transpiler.distribute.from_spec import config_from_spec
from transpiler.distribute.modes import (COMPRESSED_MODES, MODE_NAMES, MODES, TRAINER_RING_MODES,
                                         conflicts)

ROOT = Path(__file__).resolve().parents[2]


def test_the_scenario_schema_offers_exactly_the_tables_modes_in_its_order() -> None:
    field = TranspilerSpec.model_fields["mode"]
    assert typing.get_args(field.annotation) == MODE_NAMES == tuple(MODES)


def test_every_pserver_mode_has_its_policy_and_the_ring_modes_none() -> None:
    for mode in MODES.values():
        assert (mode.policy is None) == mode.ring, mode.name
        assert mode.policy is None or mode.policy in POLICIES, mode.name
    assert TRAINER_RING_MODES == ("nccl2", "collective")
    assert COMPRESSED_MODES == ("sync", "async", "ssp", "half_async")


@pytest.mark.parametrize("mode", [m for m in MODE_NAMES if not MODES[m].ring])
def test_the_transpiler_writes_the_policy_the_pserver_picks(mode: str) -> None:
    from runtime.services.job import Job
    extra = ", staleness: 2" if mode == "ssp" else ""
    scenario = parse_scenario(
        "name: m\nmodel: {name: mlp, sizes: [8, 4, 2]}\ndata: {batch_size: 4}\n"
        f"cluster: {{pservers: 1, trainers: 2}}\ntranspiler: {{mode: {mode}{extra}}}\n")
    contract = ServeContract.of(Job.from_scenario(scenario).pserver_programs(0)[0])
    assert contract.op.attr("policy") == contract.policy == MODES[mode].policy
    assert MODES[mode].synchronous == config_from_spec({"mode": mode, **(
        {"staleness": 2} if mode == "ssp" else {})})[1]


def test_a_program_without_the_policy_attribute_gets_its_modes() -> None:
    from runtime.services.job import Job
    scenario = parse_scenario(
        "name: m\nmodel: {name: mlp, sizes: [8, 4, 2]}\ndata: {batch_size: 4}\n"
        "cluster: {pservers: 1, trainers: 2}\ntranspiler: {mode: async, dc_asgd: true}\n")
    program = Job.from_scenario(scenario).pserver_programs(0)[0]
    op = ServeContract.of(program).op
    del op.attrs["policy"]
    assert ServeContract.of(program).policy == "dc_asgd"


def test_the_cross_field_rules_are_written_once_and_both_readers_enforce_them() -> None:
    assert conflicts("async", True, None, "none") == []
    assert [f for _, f in conflicts("sync", True, 3, "fp16")] == [
        ("dc_asgd", "mode"), ("staleness", "mode")]
    assert [f for _, f in conflicts("geo", False, None, "int8")] == [
        ("compression.method", "mode")]
    for spec, field in (({"mode": "sync", "dc_asgd": True}, "dc_asgd"),
                        ({"mode": "ssp"}, "staleness"),
                        ({"mode": "nccl2", "compression": {"method": "fp16"}},
                         "compression.method")):
        with pytest.raises(ValueError, match=f"transpiler.{re.escape(field)}: "):
            config_from_spec(spec)
        flow = ", ".join(f"{k}: {v}" for k, v in spec.items()).replace("'", "")
        with pytest.raises(ScenarioError, match=re.escape(field)):
            parse_scenario(f"name: m\nmodel: {{name: mlp, sizes: [8, 4, 2]}}\n"
                           f"transpiler: {{{flow}}}\n")


PRODUCT = [p for d in ("transpiler", "runtime", "sim") for p in (ROOT / d).rglob("*.py")]


def test_a_modes_name_is_spelled_only_in_the_table_its_policy_and_the_schema() -> None:
    """Adding a mode is its name and row in modes.py and its policy file (listed in
    pserver_core.POLICIES): no other product file spells a mode's name."""
    allowed = {"transpiler/distribute/modes.py"}
    spelled: dict[str, list[str]] = {}
    for mode in ("half_async", "geo", "ssp", "nccl2"):
        pattern = re.compile(rf"""(["']){mode}\1""")
        for path in PRODUCT:
            rel = path.relative_to(ROOT).as_posix()
            if rel in allowed or rel == f"runtime/services/pserver_{mode}.py":
                continue
            if pattern.search(path.read_text()):
                spelled.setdefault(mode, []).append(rel)
    assert spelled == EXCEPTIONS


EXCEPTIONS: dict[str, list[str]] = {
    # the original's config fields and values (`half_async`, ``mode='nccl2'``), which
    # the table's rows set and the transpiler reads as the original did (the RPC plan reads
    # a send barrier's ``half_async`` where the program states no mode)
    "half_async": ["transpiler/distribute/config.py", "transpiler/distribute/rpc_plan.py"],
    "nccl2": ["transpiler/distribute/config.py", "transpiler/distribute/transpiler.py",
              "runtime/services/job.py"],
}
"""Files that spell a mode's name, and why: each is the original's name of a config field,
a config value or an op attribute (``send_barrier``'s ``half_async``), not the mode's."""
