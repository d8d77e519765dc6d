"""A machine's calibration: curves that follow shape, the file, and the simulator pricing from it.

The accounting is checked exactly: a curve evaluated at a size costs what its points say (a
power law between two points, the floor below, the last throughput above); a calibrated model
prices an op from its type's curve at the op's work; an op type or size the file lacks is
priced by the fallback or the nearest end and named once in the run's notes; a sim run of a
scenario with ``compute: {model: calibrated}`` charges exactly those prices. The calibration
itself runs on a small grid (kernels only), and its curves are checked against the samples.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.config.scenario import parse_scenario
from runtime.execution.costs import RuntimeCosts
from runtime.execution.curves import Curve, fit_curve
from runtime.execution.scope import Scope
from runtime.execution.work import op_work
from runtime.launch import calibrate as calibrate_module
from runtime.launch.calibrate import (BYTES_REFERENCE, FORMAT, KIND_REFERENCES, LOCAL_REFERENCE,
                                      PEERS_REFERENCE, PROBE_TRIES, REFERENCE_PEERS,
                                      RUNTIME_REFERENCE, Reference, WorkTimes,
                                      calibrate, feature_of, fit_kernels, fold_local, grid,
                                      job_curves, measure_kernels, measure_sharing, merge_bytes,
                                      merge_kinds, merge_peers, ops_per_period, param_bytes,
                                      family_variant, FAMILY_REFERENCES)
from runtime.services.job import Job
from sim.cost import Calibrated, ComputeConfigError, OnCpus, Profile, compute_model
from sim.cpu import Cpus, SimHost, hosts_of
from sim.report import notes_for
from sim.simulate import simulate
from transpiler.ir import Program

from sim_cpu_helpers import U, finish_times


def test_a_curve_is_a_power_law_between_points_a_floor_below_and_a_throughput_above() -> None:
    curve = Curve("flops", ((1e3, 1e-6), (1e6, 1e-4), (1e9, 1e-1)))
    assert curve.seconds(1e3) == 1e-6 and curve.seconds(1e6) == pytest.approx(1e-4)
    # halfway in log-size between 1e3 and 1e6 is halfway in log-seconds between 1e-6 and 1e-4
    assert curve.seconds(10 ** 4.5) == pytest.approx(1e-5)
    assert curve.seconds(10) == 1e-6 and not curve.covers(10)  # the floor
    assert curve.seconds(4e9) == pytest.approx(4e-1) and not curve.covers(4e9)  # last rate
    assert curve.covers(5e5)


def test_fitting_takes_each_sizes_median_and_never_lets_a_larger_op_cost_less() -> None:
    xs = [100, 100, 100, 200, 200, 400, 0]
    seconds = [1.0, 9.0, 2.0, 1.0, 1.0, 5.0, 3.0]  # the 0-size op counts at 100, the floor
    curve = fit_curve("bytes", xs, seconds)
    # medians: 100 -> 2.5 (1, 2, 3, 9), 200 -> 1; pooled (4 calls and 2): (2.5*4 + 1*2)/6 = 2
    assert curve.points == ((100.0, 2.0), (200.0, 2.0), (400.0, 5.0))


def test_bad_curves_are_refused() -> None:
    with pytest.raises(ValueError, match="rising"):
        Curve("bytes", ((2.0, 1.0), (1.0, 2.0)))
    with pytest.raises(ValueError, match="at least one"):
        Curve("bytes", ())


def mul_program(m: int, k: int, n: int) -> tuple[Program, Scope]:
    from transpiler import layers
    from transpiler.framework import program_guard

    main, startup = Program(), Program()
    with program_guard(main, startup):
        x = layers.data("x", [k])
        layers.fc(x, n, bias_attr=False)
    scope = Scope()
    scope.put("x", np.zeros((m, k), np.float32))
    for var in main.global_block().vars.values():
        if var.persistable:
            scope.put(var.name, np.zeros(var.shape, np.float32))
    out = [op for op in main.global_block().ops if op.type == "mul"][0]
    scope.put(out.output("Out")[0], np.zeros((m, n), np.float32))
    return main, scope


def test_a_calibrated_model_prices_an_op_from_its_types_curve_at_its_work() -> None:
    main, scope = mul_program(8, 64, 32)
    op = [op for op in main.global_block().ops if op.type == "mul"][0]
    flops = op_work(op, scope).flops
    assert flops == 2 * 8 * 64 * 32
    curve = Curve("flops", ((1e3, 2e-6), (1e5, 5e-5)))
    model = Calibrated({"mul": curve}, None)
    assert model.cost("trainer:0", op, scope, 0) == curve.seconds(flops)
    assert model.notes == []


def test_an_op_type_or_size_the_file_lacks_is_priced_approximately_and_named_once() -> None:
    main, scope = mul_program(8, 64, 32)
    op = [op for op in main.global_block().ops if op.type == "mul"][0]
    fallback = Curve("bytes", ((10.0, 1e-6), (1e6, 1e-3)))
    model = Calibrated({}, fallback, "machine.json")
    nbytes = op_work(op, scope).bytes
    for _ in range(3):
        assert model.cost("trainer:0", op, scope, 0) == fallback.seconds(nbytes)
    assert model.notes == ["compute: op type mul was not calibrated in machine.json; priced as "
                           "an elementwise op of the bytes it moves"]
    small = Calibrated({"mul": Curve("flops", ((1e6, 1e-4), (1e7, 1e-3)))}, None, "m.json")
    assert small.cost("trainer:0", op, scope, 0) == 1e-4  # below the range: its floor
    small.cost("trainer:0", op, scope, 0)
    assert len(small.notes) == 1 and "outside the sizes m.json measured" in small.notes[0]


def test_feature_follows_the_op_catalogs_cost_rule() -> None:
    assert feature_of("mul") == "flops" and feature_of("conv2d_grad") == "flops"
    assert feature_of("relu") == "bytes" and feature_of("sgd") == "bytes"
    assert feature_of("no_such_op") == "bytes"


def test_the_grid_spans_tiny_to_beyond_the_caches_and_runs_cheapest_first() -> None:
    refs = grid()
    names = [r.name for r in refs]
    assert "mlp-16-b1" in names and "mlp-4096-b512" in names
    assert any(n.startswith("cnn-") for n in names) and any(n.startswith("ctr-") for n in names)
    assert names.index("mlp-16-b1") < names.index("mlp-4096-b512")
    # the largest MLP's weights alone (64 x 4096 floats, and its activations at batch 512:
    # 8 MiB) are beyond the caches of the machines this runs on
    assert 512 * 4096 * 4 >= 8 << 20


SMALL = [Reference("mlp-16-b8", "{name: mlp, sizes: [64, 16, 10]}", 8, 64, steps=3),
         Reference("mlp-64-b32", "{name: mlp, sizes: [64, 64, 10]}", 32, 64, steps=3)]


def test_measuring_a_small_grid_gives_a_curve_per_op_type_through_its_samples() -> None:
    run = measure_kernels("numpy", SMALL, budget=300, stream=io.StringIO(),
                          probe=lambda: 1.0)
    times = run.times
    assert run.skipped == [] and run.slow == {}
    curves, fallback = fit_kernels(times)
    assert {"mul", "mul_grad", "elementwise_add", "relu", "sgd", "sum", "scale"} <= set(curves)
    # the startups' initializers too, where the steps do not run them
    assert "uniform_random" in curves
    assert {b for _, b, _ in times.samples["fill_constant"]} == {4}  # the steps' scalars only
    assert fallback is not None and fallback.feature == "bytes"
    for op_type, samples in times.samples.items():
        curve = curves[op_type]
        xs = {(f if curve.feature == "flops" else b) for f, b, _ in samples}
        assert {x for x, _ in curve.points} == {x for x in xs if x > 0} or min(xs) == 0


def test_the_grid_times_the_ops_of_parameters_sliced_over_two_pservers_at_their_sizes() -> None:
    """A trainer whose parameters are sliced joins the blocks it receives (`concat`) and cuts
    its gradients into blocks (`split_byref`): a wide layer's concat copies megabytes a step,
    far beyond the reference jobs' 128 KiB messages, so the grid runs them at its own sizes."""
    wide = Reference("mlp-1024-b8", "{name: mlp, sizes: [64, 1024, 10]}", 8, 1024, steps=2)
    samples = measure_kernels("numpy", [wide], budget=300, stream=io.StringIO(),
                              probe=lambda: 1.0).times.samples
    weight = 64 * 1024 * 4  # fc0.w, in two blocks of 32 rows
    # fc0.w's, once a step each (fc1.w's 10,240 floats stay whole); bytes read and written
    assert [b for _, b, _ in samples["concat"]] == [2 * weight] * 2
    assert [b for _, b, _ in samples["split_byref"]] == [2 * weight] * 2
    curves, _ = fit_kernels(WorkTimes({"concat": samples["concat"]}))
    assert curves["concat"].covers(2 * weight)


def test_a_budget_of_nothing_skips_all_but_the_first_and_says_so() -> None:
    run = measure_kernels("numpy", SMALL, budget=0.0, stream=io.StringIO(), probe=lambda: 1.0)
    assert run.skipped == ["mlp-64-b32"] and run.times.calls > 0


def test_a_reference_measured_while_the_machine_ran_slow_is_measured_again() -> None:
    # the probe before and after each measurement: the first reference's second probe is
    # slow, so it is measured again (its samples once only); then every probe of the second
    # is slow, and after PROBE_TRIES tries its samples are kept and it is named
    probes = iter([1.0, 1.0, 2.0, 1.0, 1.0] + [1.0] + [1.6] * (2 * PROBE_TRIES))
    out = io.StringIO()
    run = measure_kernels("numpy", SMALL, budget=300, stream=out, probe=lambda: next(probes))
    once = measure_kernels("numpy", SMALL[:1], budget=300, stream=io.StringIO(),
                           probe=lambda: 1.0)
    first_calls = once.times.calls
    assert run.slow == {"mlp-64-b32": 1.6}
    assert "slow machine: x1.60" in out.getvalue()
    assert run.times.calls == first_calls + measure_kernels(
        "numpy", SMALL[1:], budget=300, stream=io.StringIO(), probe=lambda: 1.0).times.calls


def test_the_kind_references_add_only_the_kinds_the_main_reference_lacks() -> None:
    main = {"messages": {"send": {"send": {"per_message": 1.0}, "*": {"per_message": 2.0}},
                         "receive": {"get": {"per_message": 3.0}}},
            "step_overhead": 5.0}
    extra = {"messages": {"send": {"send": {"per_message": 9.0}, "*": {"per_message": 9.0},
                                   "prefetch": {"per_message": 4.0}},
                          "receive": {"collective": {"per_message": 6.0}}},
             "step_overhead": 9.0}
    merged = merge_kinds(main, extra)
    assert merged == {"messages": {"send": {"send": {"per_message": 1.0},
                                            "*": {"per_message": 2.0},
                                            "prefetch": {"per_message": 4.0}},
                                   "receive": {"get": {"per_message": 3.0},
                                               "collective": {"per_message": 6.0}}},
                      "step_overhead": 5.0}
    assert "prefetch" not in main["messages"]["send"]  # not changed in place


def test_the_kind_references_are_valid_jobs_with_the_kinds_they_are_for() -> None:
    table = parse_scenario(KIND_REFERENCES["table"], "table")
    assert table.model.is_distributed
    assert Job.from_scenario(table).family == "table"
    assert FAMILY_REFERENCES == {"table": KIND_REFERENCES["table"]}
    collective = parse_scenario(KIND_REFERENCES["collective"], "collective")
    assert collective.transpiler.mode == "collective"


def test_a_family_variant_is_its_jobs_figures_with_the_main_ones_slopes_and_kinds(
        ) -> None:
    main = {"messages": {"send": {"send": {"per_message": 1.0}},
                         "receive": {"collective": {"per_message": 6.0}}},
            "step_residual": 5.0, "residual_peers": 2.0, "step_residual_per_peer": 0.5,
            "round_residual_per_peer": 0.25, "curve": {"handshake": 3.0, "per_byte": 0.0},
            "io": {"per_message": 1.0, "per_byte": 0.25}}
    table = {"messages": {"send": {"send": {"per_message": 9.0},
                                   "prefetch": {"per_message": 4.0}}},
             "step_residual": 7.0, "step_overhead": 2.0,
             "io": {"per_message": 1.0, "per_byte": 0.5}}
    # its I/O threads spent 10 x 1 + 40 x 0.5 = 30 s on 10 messages of 40 bytes; at main's
    # 0.25 a byte, 10 of the 30 are bytes and 20 are per message: 2 each
    variant = family_variant(table, dict(main, variants={"table": {}}), traffic=(10, 40))
    assert variant == {"messages": {"send": {"send": {"per_message": 9.0},
                                             "prefetch": {"per_message": 4.0}},
                                    "receive": {"collective": {"per_message": 6.0}}},
                       "step_residual": 7.0, "step_overhead": 2.0, "residual_peers": 2.0,
                       "step_residual_per_peer": 0.5, "round_residual_per_peer": 0.25,
                       "curve": {"handshake": 3.0, "per_byte": 0.0},
                       "io": {"per_message": 2.0, "per_byte": 0.25}}
    costs = RuntimeCosts.from_document(dict(main, variants={"table": variant}))
    assert RuntimeCosts.from_document(costs.document()) == costs
    table_costs = costs.for_job("table")
    assert table_costs == costs.variants["table"] and table_costs.step_residual == 7.0
    assert costs.for_job(None) is costs and costs.for_job("async") is costs  # none measured
    assert table_costs.for_job("table") is table_costs  # no variants of its own: itself


def machine_file(tmp_path: Path, curves: dict[str, Curve], fallback: Curve | None = None,
                 runtime: dict[str, Any] | None = None) -> Path:
    path = tmp_path / "machine.json"
    path.write_text(json.dumps({
        "format": FORMAT, "version": 1,
        "kernels": {"numpy": {op: c.document() for op, c in curves.items()}},
        "fallback": {} if fallback is None else {"numpy": fallback.document()}}
        | ({} if runtime is None else {"runtime": runtime})))
    return path


SCENARIO = """name: priced
seed: 1
model: {name: mlp, sizes: [64, 16, 10]}
data: {batch_size: 8}
cluster: {pservers: 1, trainers: 1}
train: {steps: 3}
compute: {model: calibrated, path: machine.json}
"""


def test_a_sim_run_charges_the_calibrated_prices_and_notes_what_it_approximated(
        tmp_path: Path) -> None:
    """One-point curves at a size beyond every op's price each op at their floor: mul 2 ms,
    anything else (the fallback) 1 ms. The same prices given as a profile make the very same run."""
    beyond = 1e30  # every op is below the one size measured: priced at its floor
    machine_file(tmp_path, {"mul": Curve("flops", ((beyond, 2e-3),))},
                 fallback=Curve("bytes", ((beyond, 1e-3),)))
    calibrated = simulate(parse_scenario(SCENARIO), base_dir=tmp_path)
    profiled = simulate(parse_scenario(SCENARIO.replace(
        "{model: calibrated, path: machine.json}",
        "{model: profile, ops: {mul: 2ms}, default: 1ms}")), base_dir=tmp_path)
    assert calibrated.trainers[0].step_times == profiled.trainers[0].step_times
    assert calibrated.simulated_seconds == profiled.simulated_seconds > 3 * 2e-3
    notes = notes_for(calibrated)
    assert sum("op type relu was not calibrated in machine.json" in n for n in notes) == 1
    assert sum("compute: mul of" in n and "outside the sizes" in n for n in notes) == 1


TABLE_SCENARIO = SCENARIO.replace(
    "{name: mlp, sizes: [64, 16, 10]}",
    "{name: ctr_dnn, vocab: 200, embed_dim: 4, hidden: [8], is_distributed: true}").replace(
    "{pservers: 1, trainers: 1}", "{pservers: 2, trainers: 2}")
ASYNC_SCENARIO = SCENARIO.replace("train: {steps: 3}",
                                  "transpiler: {mode: async}\ntrain: {steps: 3}")


def test_a_job_of_a_family_measured_apart_is_priced_by_its_familys_figures(
        tmp_path: Path) -> None:
    """A step costs 1 ms in a dense job, sync or async, 4 ms where the trainers prefetch from
    a distributed table: the runtime section's ``variants`` price exactly their family's
    jobs."""
    curves = {"mul": Curve("flops", ((1e30, 1e-4),))}

    def steps(text: str, runtime: dict[str, Any]) -> list[float]:
        machine_file(tmp_path, curves, Curve("bytes", ((1e30, 1e-5),)), runtime)
        return simulate(parse_scenario(text), base_dir=tmp_path).trainers[0].step_times

    dense, table = {"step_overhead": 1e-3}, {"step_overhead": 4e-3}
    every = dict(dense, variants={"table": table})
    assert steps(TABLE_SCENARIO, every) == steps(TABLE_SCENARIO, table) \
        != steps(TABLE_SCENARIO, dense)
    assert steps(SCENARIO, every) == steps(SCENARIO, dense) != steps(SCENARIO, table)
    assert steps(ASYNC_SCENARIO, every) == steps(ASYNC_SCENARIO, dense)  # a family of none


def test_a_machine_file_missing_or_without_the_backend_is_a_named_error(tmp_path: Path) -> None:
    section = {"model": "calibrated", "path": "nope.json"}
    with pytest.raises(ComputeConfigError, match=r"compute.path: cannot read machine file .*"
                                                 r"runtime calibrate -o FILE"):
        compute_model(section, 1, tmp_path)
    machine_file(tmp_path, {"mul": Curve("flops", ((1.0, 1e-3),))})
    with pytest.raises(ComputeConfigError, match="holds no calibration of torch kernels, only "
                                                 "of numpy"):
        compute_model({"model": "calibrated", "path": "machine.json", "kernels": "torch"}, 1,
                      tmp_path)
    (tmp_path / "machine.json").write_text(json.dumps({
        "format": FORMAT, "version": 1,
        "kernels": {"numpy": {"mul": {"feature": "flops", "points": [[2, 1e-3], [1, 1e-3]]}}}}))
    with pytest.raises(ComputeConfigError, match="rising"):
        compute_model(section | {"path": "machine.json"}, 1, tmp_path)


@pytest.mark.timeout(120)
def test_calibrate_writes_a_file_the_simulator_reads(tmp_path: Path) -> None:
    document = calibrate(io.StringIO(), ["numpy"], quick=True, budget=2.0, runtime=False)
    assert document["format"] == FORMAT and "numpy" in document["kernels"]
    (tmp_path / "machine.json").write_text(json.dumps(document))
    model = compute_model({"model": "calibrated", "path": "machine.json"}, 1, tmp_path)
    assert isinstance(model, Calibrated) and "mul" in model.curves
    cores = document["cores"]
    assert model.sharing == {float(cores["count"]): tuple(cores["rates"])}
    assert document["meta"]["kernel_threads"] == 1


# -- how busy processes share the cores

def test_a_host_of_measured_rates_gives_each_busy_thread_its_rate() -> None:
    """2 cores measured at 1, 1/2, 1/4 per busy thread for 1, 2, 3 threads (beyond three: the
    last throughput, 3/4, split evenly)."""
    host = SimHost("box", ("*",), 2.0, (1.0, 0.5, 0.25))
    cpus = Cpus([host], ["a", "b", "c", "d"])
    done = finish_times(cpus, [(0, "a", U), (0, "b", U), (0, "c", 2 * U), (0, "d", 2 * U)])
    # 4 busy: each at 0.75 / 4 = 3/16: a and b finish at 16/3 U, having done U each;
    # c and d have U left; 2 busy at 1/2 each: 2 U more
    assert done["a"] == done["b"] == [pytest.approx(16 / 3 * U)]
    assert done["c"] == done["d"] == [pytest.approx((16 / 3 + 2) * U)]


def test_a_host_never_does_more_than_its_cores_work_whatever_its_file_says() -> None:
    """The rates a machine file of 2026-12-07 10:54 carries (measured before they were capped):
    three busy threads at 0.877 of a core each on 2 cores. Three threads of U each take 1.5 U
    together at best, time-sliced or shared."""
    rates = (1.0, 1.0, 0.877, 0.631)
    for slice_ in (0.0, 0.004):
        host = SimHost("box", ("*",), 2.0, rates, slice_)
        done = finish_times(Cpus([host], ["a", "b", "c"]), [(0, n, U) for n in "abc"])
        assert max(t for times in done.values() for t in times) >= 1.5 * U * (1 - 1e-9)


def test_a_host_whose_two_threads_run_slower_than_alone_is_shared_even_when_not_full() -> None:
    host = SimHost("box", ("*",), 2.0, (1.0, 0.5))
    done = finish_times(Cpus([host], ["a", "b"]), [(0, "a", U), (0, "b", U)])
    assert done == {"a": [2 * U], "b": [2 * U]}  # ideal sharing would say U each


def test_measured_rates_reach_the_hosts_of_as_many_cores() -> None:
    entries = [{"nodes": ["*"], "cores": 2}, {"nodes": ["x"], "cores": 4}]
    two, four = hosts_of(entries, {2.0: (1.0, 0.9)})
    assert two.rates == (1.0, 0.9) and four.rates == ()


def test_measure_sharing_gives_one_alone_the_rate_one() -> None:
    rates = measure_sharing(2, seconds=0.05)
    assert len(rates) == 2 and rates[0] == 1.0 and 0 < rates[1] <= 1.0


def test_sharing_keeps_each_counts_best_rate_of_its_tries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # each try: one alone does 100; two at once do 60 each in the first try (someone else
    # held a core), 95 in the second, 90 in the third
    together = iter([[100], [60, 60], [100], [95, 95], [100], [90, 90]])
    monkeypatch.setattr(calibrate_module, "busy_together", lambda work, m, s: next(together))
    assert measure_sharing(2, seconds=0.0, tries=3, cores=2) == [1.0, 0.95]


def test_sharing_divides_by_the_fastest_alone_and_never_beats_the_cores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As measured on the 2-core machine on 2026-12-07: a try whose lone process ran in a
    slow spell (820 against 1,416) made three at once look 0.91 of a core each, 2.7 cores in
    all. Each count's best is set against the best alone, and m busy processes share the
    cores: each gets at most cores / m."""
    together = iter([[820], [918] * 2, [743] * 3,
                     [1269], [1295] * 2, [844] * 3,
                     [1416], [1103] * 2, [746] * 3])
    monkeypatch.setattr(calibrate_module, "busy_together", lambda work, m, s: next(together))
    assert measure_sharing(3, seconds=0.0, tries=3, cores=2) == [1.0, 0.9145, 0.596]
    together = iter([[100], [100, 100], [99, 99, 99]])  # a machine faster together, somehow
    monkeypatch.setattr(calibrate_module, "busy_together", lambda work, m, s: next(together))
    assert measure_sharing(3, seconds=0.0, tries=1, cores=2) == [1.0, 1.0, 0.6667]


def test_op_types_only_the_reference_jobs_ran_get_curves_and_the_grids_are_kept() -> None:
    runs = WorkTimes({"split_ids": [(0.0, 1000.0, 2e-5), (0.0, 1000.0, 4e-5),
                                    (0.0, 1000.0, 3e-5), (0.0, 8000.0, 9e-5)],
                      "mul": [(1e6, 0.0, 1.0)]})
    grid_curves = {"mul": Curve("flops", ((1e6, 3e-5),)).document()}
    extra = job_curves(grid_curves, runs)
    assert set(extra) == {"split_ids"}  # the grid's mul is not replaced by the jobs' samples
    assert extra["split_ids"] == {"feature": "bytes", "points": [[1000.0, 3e-5], [8000.0, 9e-5]]}


def test_a_step_and_an_op_cost_what_the_local_job_says_and_the_rest_is_owed_by_rpc_steps() -> None:
    main = {"op_overhead": 4.0, "step_overhead": 100.0, "step_residual": 50.0,
            "round_residual": 20.0, "messages": {}}
    local = {"op_overhead": 1.0, "step_overhead": 60.0, "step_residual": 7.0}
    folded = fold_local(main, local, trainer_ops=10, pserver_ops=3)
    # a step with RPCs costs as before: 60 + 10 x 1 + (50 + 40 + 10 x 3) = 100 + 10 x 4 + 50
    assert folded == {"op_overhead": 1.0, "step_overhead": 60.0, "step_residual": 120.0,
                      "round_residual": 29.0, "messages": {}}
    # a local job that measured more than the main one changes nothing
    assert fold_local(main, {"op_overhead": 5.0, "step_overhead": 120.0}, 10, 3) == main


def test_the_residuals_grow_with_peers_and_crowding_as_the_two_reference_jobs_say() -> None:
    """2 x 2 against 1 x 1 on 2 cores: a trainer's step residual 120 against 70 (50 per
    pserver more), a pserver's round 29 with 2 nodes beyond the cores against 33 with none
    (a line through both, even where it falls: -2 per node)."""
    main = {"step_residual": 120.0, "round_residual": 29.0, "messages": {}}
    alone = {"step_residual": 70.0, "round_residual": 33.0, "messages": {"x": 1}}
    merged = merge_peers(main, alone, cores=2)
    assert merged == {"step_residual": 120.0, "round_residual": 29.0, "messages": {},
                      "residual_peers": 2.0, "step_residual_per_peer": 50.0,
                      "round_residual_per_peer": 0.0, "residual_crowding": 2.0,
                      "round_residual_per_node": -2.0}
    costs = RuntimeCosts.from_document(merged)
    assert RuntimeCosts.from_document(costs.document()) == costs
    assert [costs.residual("rpc_step", n) for n in (0, 1, 2, 3)] == [20.0, 70.0, 120.0, 170.0]
    # the round's trainers move nothing; the nodes beyond the host's cores do
    assert [costs.residual("round", n, 0.0) for n in (1, 2, 9)] == [33.0, 33.0, 33.0]
    assert [costs.residual("round", 2, c) for c in (0.0, 2.0, 5.0, 16.0)] == [33.0, 29.0, 23.0, 1.0]
    assert costs.residual("round", 2, 17.0) == 0.0  # never below nothing
    # 1 x 1 and 2 x 2 on 4 cores: neither crowded, so the round's residual stays as measured
    roomy = merge_peers(main, alone, cores=4)
    assert "round_residual_per_node" not in roomy and roomy["round_residual_per_peer"] == 0.0
    assert RuntimeCosts.from_document(roomy).residual("round", 6, 3.0) == 29.0
    # a file from before: per trainer in the round, as it priced then
    old = RuntimeCosts.from_document(dict(main, residual_peers=2.0, round_residual_per_peer=-4.0))
    assert [old.residual("round", n, 5.0) for n in (1, 2, 9)] == [33.0, 29.0, 1.0]
    assert "residual_crowding" not in old.document()
    # the simulator's ledger: a trainer's peers are its pservers; a pserver's crowding is its
    # host's nodes beyond its cores (none on a machine of its own)
    cpus = Cpus([], ["trainer:0", "pserver:0"])
    ledger = OnCpus(Profile({}), costs, cpus, pservers=3, trainers=1)
    assert ledger.overhead("trainer:0", "rpc_step", 0) == 170.0
    assert ledger.overhead("pserver:0", "round", 0) == 33.0
    names = ["pserver:0", "pserver:1", "trainer:0", "trainer:1", "trainer:2", "trainer:3"]
    crowded = Cpus([SimHost("box", ("pserver:*", "trainer:*"), 2.0)], names, io=True)
    assert [crowded.crowding(n) for n in names] == [4.0] * 6
    assert OnCpus(Profile({}), costs, crowded, pservers=2, trainers=4).overhead(
        "pserver:1", "round", 0) == 25.0
    split = Cpus([SimHost("a", ("pserver:*",), 1.0), SimHost("b", ("trainer:*",), 2.0)],
                 names)
    assert [split.crowding(n) for n in names] == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert RuntimeCosts(step_residual=5.0).residual("rpc_step", 7) == 5.0  # not measured
    # the second reference is the first with one node of each role
    one = parse_scenario(PEERS_REFERENCE, "peers")
    assert (one.cluster.pservers, one.cluster.trainers, REFERENCE_PEERS) == (1, 1, 2)
    assert PEERS_REFERENCE.replace("pservers: 1, trainers: 1", "pservers: 2, trainers: 2") \
        .replace("calibrate-peers", "calibrate-runtime") == RUNTIME_REFERENCE


def test_the_part_of_a_received_send_that_is_the_rounds_goes_on_the_round() -> None:
    """A SEND costs a + X / trainers: 0.8 with one trainer a round, 0.6 with two, so X = 0.4
    is the round's and a = 0.4 the message's; a round of 2 costs what it did, of 1 and of 6
    what a + X / trainers says."""
    def job(send: float, round_residual: float) -> dict[str, Any]:
        return {"step_residual": 1.0, "round_residual": round_residual, "messages": {
            "receive": {"send": {"per_message": send, "per_byte": 0.5},
                        "reply": {"per_message": 0.1, "per_byte": 0.0}}}}

    merged = merge_peers(job(0.6, 3.0), job(0.8, 2.0), cores=2)
    assert merged["messages"]["receive"] == {"send": {"per_message": pytest.approx(0.4),
                                                      "per_byte": 0.5},
                                             "reply": {"per_message": 0.1, "per_byte": 0.0}}
    # the crowding slope is the residuals' own, before the round's part joins them
    assert merged["round_residual"] == pytest.approx(3.4)
    assert merged["round_residual_per_node"] == pytest.approx(0.5)
    costs = RuntimeCosts.from_document(merged)
    per_round = [trainers * costs.message("receive", "send", 0)
                 + costs.residual("round", trainers, 2.0) for trainers in (1, 2, 6)]
    assert per_round == pytest.approx([0.8 + 3.0, 2 * 0.6 + 3.0, 6 * (0.4 + 0.4 / 6) + 3.0])
    # a SEND that cost more in the larger job keeps its price: no round's part below nothing
    assert merge_peers(job(0.8, 3.0), job(0.6, 2.0), cores=2)["messages"]["receive"]["send"] \
        == {"per_message": 0.8, "per_byte": 0.5}


def test_the_reference_jobs_ops_per_step_and_round_are_its_programs() -> None:
    trainer, pserver = ops_per_period(RUNTIME_REFERENCE)
    assert trainer > 0 and pserver > 0
    assert parse_scenario(LOCAL_REFERENCE, "local").transpiler.mode == "geo"


def test_past_the_reference_messages_the_large_jobs_cost_per_byte_holds() -> None:
    main = {"messages": {"receive": {"reply": {"per_message": 5.0, "per_byte": 1.0},
                                     "send": {"per_message": 6.0, "per_byte": 2.0},
                                     "get": {"per_message": 7.0, "per_byte": 0.0}},
                         "send": {"send": {"per_message": 8.0, "per_byte": 3.0}}},
            "io": {"per_message": 9.0, "per_byte": 4.0},
            "step_residual": 100.0, "round_residual": 10.0}
    big = {"messages": {"receive": {"reply": {"per_message": 50.0, "per_byte": 0.5},
                                    "send": {"per_message": 60.0, "per_byte": 0.25}},
                        "send": {"send": {"per_message": 80.0, "per_byte": 0.125}}},
           "io": {"per_message": 90.0, "per_byte": 0.75},
           "step_residual": 300.0, "round_residual": 50.0}
    merged = merge_bytes(main, big, main_bytes=100, big_bytes=500)
    # up to a pserver's share of main's 100 bytes, main's line; past it big's per byte, plus
    # its unseen work per byte more (200 / 400 a step, 40 / 400 a round)
    assert merged["messages"] == {
        "receive": {"reply": {"per_message": 5.0, "per_byte": 1.0, "up_to": 50,
                              "beyond": 0.5 + 0.5},
                    "send": {"per_message": 6.0, "per_byte": 2.0, "up_to": 50,
                             "beyond": 0.25 + 0.1},
                    "get": {"per_message": 7.0, "per_byte": 0.0}},
        "send": {"send": {"per_message": 8.0, "per_byte": 3.0, "up_to": 50, "beyond": 0.125}}}
    costs = RuntimeCosts.from_document(merged)
    assert RuntimeCosts.from_document(costs.document()) == costs
    # a reference-sized reply costs what the reference measured; a larger one, big's more
    assert [costs.message("receive", "reply", n) for n in (0, 50, 150)] == \
        [5.0, 5.0 + 50 * 1.0, 5.0 + 50 * 1.0 + 100 * 1.0]
    assert costs.message("send", "send", 70) == 8.0 + 50 * 3.0 + 20 * 0.125
    assert costs.message("receive", "get", 70) == 7.0
    assert merged["io"] == {"per_message": 9.0, "per_byte": 0.75}
    assert (merged["step_residual"], merged["round_residual"]) == (100.0, 10.0)
    # with what a message's size adds measured apart, the I/O thread keeps main's figures
    by_size = {"bytes": [0, 100], "seconds": [0.0, 1.0]}
    sized = dict(main, io={"per_message": 9.0, "per_byte": 0.0}, io_by_size=by_size)
    merged = merge_bytes(sized, dict(big, io_by_size=by_size), main_bytes=100, big_bytes=500)
    assert (merged["io"], merged["io_by_size"]) == ({"per_message": 9.0, "per_byte": 0.0},
                                                     by_size)
    variant = family_variant(dict(big, io={"per_message": 3.0, "per_byte": 0.0},
                                  io_by_size=by_size), merged, traffic=(10, 40))
    assert (variant["io"], variant["io_by_size"]) == ({"per_message": 3.0, "per_byte": 0.0},
                                                       by_size)  # its own, beyond the curve


def test_the_bytes_reference_carries_nine_times_the_main_ones_parameters() -> None:
    assert param_bytes(BYTES_REFERENCE) > 8 * param_bytes(RUNTIME_REFERENCE)
