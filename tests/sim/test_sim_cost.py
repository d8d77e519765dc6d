"""The simulator's compute models: FLOPs and bytes per op, roofline and profile times, stragglers,
and `compute` sections refused naming the field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.execution.scope import Scope
from runtime.execution.tensor import LoDTensor, Phantom, SelectedRows, phantom_of
from sim.cost import (ComputeConfigError, Device, OpTime, Profile, Roofline, Straggler, Stragglers,
                      Work, WorkCache, compute_model, op_work)
from transpiler.ir import Op

F32 = np.float32


def scope_of(**values: Any) -> Scope:
    scope = Scope()
    for name, value in values.items():
        scope.put(name, value)
    return scope


def zeros(*shape: int, dtype: Any = F32) -> np.ndarray:
    return np.zeros(shape, dtype)


# -- op work ------------------------------------------------------------------------------------

def test_mul_is_2mkn_flops_over_the_flattened_operands() -> None:
    op = Op("mul", {"X": ["x"], "Y": ["y"]}, {"Out": ["out"]},
            {"x_num_col_dims": 2, "y_num_col_dims": 1})
    scope = scope_of(x=zeros(8, 3, 4), y=zeros(4, 5), out=zeros(8, 3, 5))
    # X is [M=24, K=4], Y [K=4, N=5]; bytes: X 96 + Y 20 + Out 120 floats of 4 bytes
    assert op_work(op, scope) == Work(2 * 24 * 4 * 5, (96 + 20 + 120) * 4)


def test_mul_grad_counts_each_product_it_computes() -> None:
    inputs = {"X": ["x"], "Y": ["y"], "Out": ["out"], "Out@GRAD": ["dout"]}
    values = dict(x=zeros(6, 4), y=zeros(4, 3), out=zeros(6, 3), dout=zeros(6, 3))
    both = Op("mul_grad", inputs, {"X@GRAD": ["dx"], "Y@GRAD": ["dy"]})
    only_y = Op("mul_grad", inputs, {"Y@GRAD": ["dy"]})
    scope = scope_of(**values, dx=zeros(6, 4), dy=zeros(4, 3))
    read = (24 + 12 + 18 + 18) * 4
    assert op_work(both, scope) == Work(2 * (2 * 6 * 4 * 3), read + (24 + 12) * 4)
    assert op_work(only_y, scope) == Work(2 * 6 * 4 * 3, read + 12 * 4)


def test_sequence_conv_is_the_product_of_the_windows_and_the_filter() -> None:
    x, w = LoDTensor(zeros(6, 4), [[0, 2, 6]]), zeros(12, 5)  # windows of 3 rows: [6, 12] x [12, 5]
    forward = Op("sequence_conv", {"X": ["x"], "Filter": ["w"]}, {"Out": ["out"]})
    scope = scope_of(x=x, w=w, out=zeros(6, 5), dout=zeros(6, 5), dx=zeros(6, 4), dw=zeros(12, 5))
    assert op_work(forward, scope).flops == 2 * 6 * 12 * 5
    grad = Op("sequence_conv_grad", {"X": ["x"], "Filter": ["w"], "Out": ["out"],
                                     "Out@GRAD": ["dout"]}, {"X@GRAD": ["dx"], "Filter@GRAD": ["dw"]})
    assert op_work(grad, scope).flops == 2 * (2 * 6 * 12 * 5)


@pytest.mark.parametrize("op_type,flops_per_element", [
    ("relu", 1), ("sigmoid", 4), ("elementwise_add", 1), ("scale", 2), ("cast", 0)])
def test_elementwise_ops_count_flops_per_output_element(op_type: str,
                                                        flops_per_element: int) -> None:
    op = Op(op_type, {"X": ["x"]}, {"Out": ["out"]})
    scope = scope_of(x=zeros(10, 10), out=zeros(10, 10))
    assert op_work(op, scope) == Work(100 * flops_per_element, 800)


def test_sum_adds_inputs_minus_one_times_the_elements() -> None:
    op = Op("sum", {"X": ["a", "b", "c"]}, {"Out": ["out"]})
    scope = scope_of(a=zeros(4, 4), b=zeros(4, 4), c=zeros(4, 4), out=zeros(4, 4))
    assert op_work(op, scope) == Work(16 * 2, 4 * 16 * 4)


def test_softmax_with_cross_entropy_is_a_constant_per_logit() -> None:
    op = Op("softmax_with_cross_entropy", {"Logits": ["logits"], "Label": ["label"]},
            {"Softmax": ["softmax"], "Loss": ["loss"]})
    scope = scope_of(logits=zeros(32, 10), label=zeros(32, 1, dtype=np.int64),
                     softmax=zeros(32, 10), loss=zeros(32, 1))
    assert op_work(op, scope) == Work(5 * 320, 1280 + 256 + 1280 + 128)


def test_lookup_table_moves_the_rows_read_not_the_table() -> None:
    op = Op("lookup_table", {"W": ["table"], "Ids": ["ids"]}, {"Out": ["rows"]})
    scope = scope_of(table=zeros(1000, 8), ids=zeros(6, 1, dtype=np.int64), rows=zeros(6, 8))
    assert op_work(op, scope) == Work(0, 48 + 2 * 192)  # ids, rows read and rows written


def test_optimizers_move_the_grad_and_read_and_write_each_state() -> None:
    lr = np.array([0.1], F32)
    sgd = Op("sgd", {"Param": ["p"], "Grad": ["g"], "LearningRate": ["lr"]}, {"ParamOut": ["p"]})
    scope = scope_of(p=zeros(10, 4), g=zeros(10, 4), lr=lr)
    assert op_work(sgd, scope) == Work(2 * 40, 160 + 2 * 1 * 160)
    adam = Op("adam", {"Param": ["p"], "Grad": ["g"], "LearningRate": ["lr"], "Moment1": ["m"],
                       "Moment2": ["v"], "Beta1Pow": ["b1"], "Beta2Pow": ["b2"]},
              {"ParamOut": ["p"], "Moment1Out": ["m"], "Moment2Out": ["v"]})
    scope = scope_of(p=zeros(10, 4), g=zeros(10, 4), lr=lr, m=zeros(10, 4), v=zeros(10, 4),
                     b1=lr, b2=lr)
    assert op_work(adam, scope) == Work(12 * 40, 160 + 2 * 3 * 160)


def test_sparse_sgd_touches_only_the_rows_of_its_gradient() -> None:
    sgd = Op("sgd", {"Param": ["p"], "Grad": ["g"], "LearningRate": ["lr"]}, {"ParamOut": ["p"]})
    grad = SelectedRows(np.array([1, 3], np.int64), zeros(2, 4), 10)
    scope = scope_of(p=zeros(10, 4), g=grad, lr=np.array([0.1], F32))
    assert op_work(sgd, scope) == Work(2 * 8, (32 + 16) + 2 * 8 * 4)


def test_any_other_op_is_one_flop_per_output_element() -> None:
    op = Op("fill_constant", {}, {"Out": ["out"]}, {"shape": [3, 3]})
    assert op_work(op, scope_of(out=zeros(3, 3))) == Work(9, 36)


def phantoms_of(scope: Scope) -> Scope:
    """The timing-mode twin of `scope`: every value replaced by its phantom."""
    return scope_of(**{name: phantom_of(scope.get_tensor(name)) for name in scope.names()})


TWIN_CASES: dict[str, tuple[Op, dict[str, Any]]] = {
    "mul": (Op("mul", {"X": ["x"], "Y": ["y"]}, {"Out": ["out"]}, {"x_num_col_dims": 2}),
            dict(x=zeros(8, 3, 4), y=zeros(4, 5), out=zeros(8, 3, 5))),
    "elementwise_add": (Op("elementwise_add", {"X": ["x"], "Y": ["y"]}, {"Out": ["out"]}),
                        dict(x=zeros(16, 10), y=zeros(10), out=zeros(16, 10))),
    "sgd": (Op("sgd", {"Param": ["p"], "Grad": ["g"], "LearningRate": ["lr"]},
               {"ParamOut": ["p"]}),
            dict(p=zeros(10, 4), g=zeros(10, 4), lr=np.array([0.1], F32))),
    "sparse sgd": (Op("sgd", {"Param": ["p"], "Grad": ["g"], "LearningRate": ["lr"]},
                      {"ParamOut": ["p"]}),
                   dict(p=zeros(10, 4), lr=np.array([0.1], F32),
                        g=SelectedRows(np.array([1, 3, 3], np.int64), zeros(3, 4), 10))),
    "lookup_table": (Op("lookup_table", {"W": ["table"], "Ids": ["ids"]}, {"Out": ["rows"]}),
                     dict(table=zeros(1000, 8), ids=zeros(6, 1, dtype=np.int64),
                          rows=LoDTensor(zeros(6, 8), [[0, 2, 6]]))),
    "sequence_pool": (Op("sequence_pool", {"X": ["x"]}, {"Out": ["out"]}),
                      dict(x=LoDTensor(zeros(6, 8), [[0, 2, 6]]), out=zeros(2, 8))),
    "sequence_conv": (Op("sequence_conv", {"X": ["x"], "Filter": ["w"]}, {"Out": ["out"]},
                         {"contextLength": 3}),
                      dict(x=LoDTensor(zeros(6, 8), [[0, 2, 6]]), w=zeros(24, 5),
                           out=LoDTensor(zeros(6, 5), [[0, 2, 6]]))),
}


@pytest.mark.parametrize("case", sorted(TWIN_CASES))
def test_a_phantom_op_costs_what_its_numeric_twin_costs(case: str) -> None:
    op, values = TWIN_CASES[case]
    numeric = scope_of(**values)
    timing = phantoms_of(numeric)
    assert all(isinstance(timing.get_tensor(name), Phantom) for name in values)
    roofline = Roofline(Device(flops=1e9, mem_bandwidth=1e9, op_overhead=1e-6))
    work = op_work(op, numeric)
    assert work.flops > 0 or work.bytes > 0
    assert op_work(op, timing) == work
    assert roofline.cost("pserver:0", op, timing, 0) == roofline.cost("pserver:0", op, numeric, 0)
    assert roofline.cost("pserver:0", op, timing, 0) > 1e-6  # more than the overhead alone


# -- models -------------------------------------------------------------------------------------

MUL = Op("mul", {"X": ["x"], "Y": ["y"]}, {"Out": ["out"]})
MUL_SCOPE = scope_of(x=zeros(8, 4), y=zeros(4, 5), out=zeros(8, 5))  # 320 FLOPs, 368 bytes


def test_roofline_takes_the_slower_of_compute_and_memory_plus_the_overhead() -> None:
    compute_bound = Roofline(Device(flops=1e9, mem_bandwidth=1e12, op_overhead=2e-6))
    memory_bound = Roofline(Device(flops=1e12, mem_bandwidth=1e9))
    assert compute_bound.cost("trainer:0", MUL, MUL_SCOPE, 0) == 320 / 1e9 + 2e-6
    assert memory_bound.cost("trainer:0", MUL, MUL_SCOPE, 0) == 368 / 1e9


def test_the_work_of_phantom_ops_is_counted_once_per_op_and_shapes() -> None:
    cache = WorkCache()
    scope = scope_of(x=Phantom((8, 4), F32), y=Phantom((4, 5), F32), out=Phantom((8, 5), F32))
    first = cache.work(MUL, scope)
    assert first == op_work(MUL, MUL_SCOPE) == Work(320, 368)
    scope.put("out", Phantom((8, 5), F32))  # an equal phantom, made anew: the same work
    assert cache.work(MUL, scope) is first
    scope.put("x", Phantom((16, 4), F32))  # another shape: counted again
    assert cache.work(MUL, scope) == Work(640, 256 + 80 + 160)
    assert cache.work(MUL, MUL_SCOPE) == Work(320, 368)  # arrays: counted every time


def test_a_section_builds_the_roofline_with_units_and_per_node_overrides() -> None:
    model = compute_model({"model": "roofline",
                           "device": {"flops": "2TFLOPS", "mem_bandwidth": "50GB/s",
                                      "op_overhead": "2us"},
                           "overrides": [{"nodes": "pserver:*",
                                          "device": {"mem_bandwidth": "100GB/s"}}]}, seed=0)
    assert isinstance(model, Roofline)
    assert model.device_for("trainer:1") == Device(2e12, 50e9, 2e-6)
    assert model.device_for("pserver:0") == Device(2e12, 100e9, 2e-6)


def test_a_profile_charges_per_call_per_element_or_its_default() -> None:
    profile = Profile({"mul": OpTime(per_call=25e-6),
                       "relu": OpTime(per_element=1e-9)}, default=1e-6)
    relu = Op("relu", {"X": ["x"]}, {"Out": ["out"]})
    assert profile.cost("trainer:0", MUL, MUL_SCOPE, 0) == 25e-6
    assert profile.cost("trainer:0", relu, scope_of(x=zeros(10, 10), out=zeros(10, 10)), 0) \
        == 100 * 1e-9
    assert profile.cost("trainer:0", Op("sgd"), Scope(), 0) == 1e-6


def test_a_profile_file_is_read_relative_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "profile.json").write_text(json.dumps(
        {"ops": {"mul": 2.5e-5, "relu": {"per_element": 1e-9}}}))
    model = compute_model({"model": "profile", "path": "profile.json"}, seed=0, base_dir=tmp_path)
    assert isinstance(model, Profile)
    assert model.ops == {"mul": OpTime(2.5e-5), "relu": OpTime(per_element=1e-9)}
    assert model.default == 0.0


def test_inline_profile_times_take_units() -> None:
    model = compute_model({"model": "profile", "ops": {"mul": "1ms"}, "default": "5us"}, seed=0)
    assert isinstance(model, Profile)
    assert (model.ops["mul"].per_call, model.default) == (1e-3, 5e-6)


def test_no_section_means_no_compute_time() -> None:
    assert compute_model(None, seed=0) is None


# -- stragglers -----------------------------------------------------------------------------------

def test_a_fixed_straggler_multiplies_every_op_of_its_node_only() -> None:
    model = Stragglers(Profile({"mul": OpTime(1e-3)}), [Straggler(("trainer:3",), 3.0)], seed=7)
    assert model.cost("trainer:3", MUL, MUL_SCOPE, 5) == 3e-3
    assert model.cost("trainer:2", MUL, MUL_SCOPE, 5) == 1e-3


def test_random_stragglers_are_seeded_per_node_and_step() -> None:
    rule = Straggler(("trainer:*",), 10.0, probability=0.25)

    def pattern(seed: int, node: str) -> list[float]:
        model = Stragglers(Profile({}), [rule], seed)
        return [model.slowdown(node, step) for step in range(2000)]

    first = pattern(1, "trainer:0")
    assert first == pattern(1, "trainer:0")
    assert set(first) == {1.0, 10.0}
    assert 400 < first.count(10.0) < 600  # 2000 steps at probability 0.25
    assert first != pattern(2, "trainer:0") and first != pattern(1, "trainer:1")
    assert set(pattern(1, "pserver:0")) == {1.0}


def test_the_factors_of_every_rule_that_applies_multiply() -> None:
    section = {"model": "profile", "ops": {"mul": "1ms"},
               "stragglers": [{"node": "trainer:1", "slowdown": 2.0},
                              {"nodes": ["trainer:*"], "probability": 1.0, "slowdown": 5.0}]}
    model = compute_model(section, seed=3)
    assert isinstance(model, Stragglers)
    assert model.cost("trainer:1", MUL, MUL_SCOPE, 0) == pytest.approx(1e-2, rel=1e-15)
    assert model.cost("trainer:0", MUL, MUL_SCOPE, 0) == pytest.approx(5e-3, rel=1e-15)
    assert model.cost("pserver:0", MUL, MUL_SCOPE, 0) == 1e-3


# -- bad sections ---------------------------------------------------------------------------------

DEVICE = {"flops": 1e12, "mem_bandwidth": "50GB/s"}


@pytest.mark.parametrize("section,field", [
    ([], "compute"),
    ({"model": "gpu"}, "compute.model"),
    ({"model": ["roofline"]}, "compute.model"),
    ({"device": DEVICE}, "compute.model"),
    ({"model": "roofline"}, "compute.device"),
    ({"model": "roofline", "device": {"mem_bandwidth": "1GB/s"}}, "compute.device.flops"),
    ({"model": "roofline", "device": {**DEVICE, "flops": 0}}, "compute.device.flops"),
    ({"model": "roofline", "device": {**DEVICE, "flops": "fast"}}, "compute.device.flops"),
    ({"model": "roofline", "device": {**DEVICE, "mem_bandwidth": "50 furlongs"}},
     "compute.device.mem_bandwidth"),
    ({"model": "roofline", "device": {**DEVICE, "op_overhead": "-1us"}},
     "compute.device.op_overhead"),
    ({"model": "roofline", "device": {**DEVICE, "speed": 1}}, "compute.device.speed"),
    ({"model": "roofline", "device": DEVICE, "overrides": [{"nodes": [], "device": {}}]},
     "compute.overrides[0].nodes"),
    ({"model": "roofline", "device": DEVICE, "stragglers": [{"slowdown": 2}]},
     "compute.stragglers[0]"),
    ({"model": "roofline", "device": DEVICE,
      "stragglers": [{"node": "trainer:0", "slowdown": 0}]}, "compute.stragglers[0].slowdown"),
    ({"model": "roofline", "device": DEVICE,
      "stragglers": [{"node": "trainer:0", "slowdown": 2, "probability": 2}]},
     "compute.stragglers[0].probability"),
    ({"model": "profile"}, "compute"),
    ({"model": "profile", "ops": {"mul": {"per_call": 1}}}, "compute.ops.mul"),
    ({"model": "profile", "ops": {"mul": "soon"}}, "compute.ops.mul"),
    ({"model": "profile", "path": "missing.json"}, "compute.path"),
])
def test_an_invalid_section_is_refused_naming_the_field(section: Any, field: str,
                                                        tmp_path: Path) -> None:
    with pytest.raises(ComputeConfigError, match=f"^{re.escape(field)}: ") as info:
        compute_model(section, seed=0, base_dir=tmp_path)
    assert info.value.field == field


def test_another_models_field_says_to_set_the_whole_section(tmp_path: Path) -> None:
    """``--set compute.model=calibrated`` on a roofline scenario keeps its ``device``: the error
    names that field, the model it belongs to, and how to change the model."""
    section = {"model": "calibrated", "path": "m.json", "device": DEVICE}
    with pytest.raises(ComputeConfigError) as info:
        compute_model(section, seed=0, base_dir=tmp_path)
    assert info.value.field == "compute.device"
    assert info.value.problem == (
        "a field of model roofline, not of calibrated (its fields: model, path, kernels, "
        "stragglers, runtime); to change the model, set the whole section: "
        "--set 'compute={model: calibrated, ...}'")


def test_a_section_without_a_model_lists_its_keys(tmp_path: Path) -> None:
    """``--set 'compute={model:calibrated}'`` is YAML for one key, ``model:calibrated``."""
    with pytest.raises(ComputeConfigError) as info:
        compute_model({"model:calibrated": None}, seed=0, base_dir=tmp_path)
    assert str(info.value) == ("compute.model: missing: one of ['calibrated', 'profile', "
                               "'roofline'] (the section's keys: 'model:calibrated'; in YAML a "
                               "key needs ': ', with a space)")
    with pytest.raises(ComputeConfigError, match=r"\(the section's keys: 'device'\)$"):
        compute_model({"device": DEVICE}, seed=0, base_dir=tmp_path)


def test_an_unknown_field_is_still_pydantics_refusal(tmp_path: Path) -> None:
    with pytest.raises(ComputeConfigError) as info:
        compute_model({"model": "roofline", "device": DEVICE, "speed": 2}, seed=0,
                      base_dir=tmp_path)
    assert info.value.field == "compute.speed"
    assert info.value.problem == "Extra inputs are not permitted"


def test_a_machine_file_read_as_a_profile_and_back_says_which_it_is(tmp_path: Path) -> None:
    (tmp_path / "machine.json").write_text(json.dumps({"format": "x", "version": 1,
                                                       "kernels": {}}))
    (tmp_path / "profile.json").write_text(json.dumps({"ops": {"mul": 1e-6}}))
    with pytest.raises(ComputeConfigError) as info:
        compute_model({"model": "profile", "path": "machine.json"}, seed=0, base_dir=tmp_path)
    assert str(info.value).endswith("machine.json: profile.ops: Field required (it is a machine "
                                    "file (`runtime calibrate`): model: calibrated reads it)")
    with pytest.raises(ComputeConfigError) as info:
        compute_model({"model": "calibrated", "path": "profile.json"}, seed=0,
                      base_dir=tmp_path)
    assert str(info.value).endswith("profile.json: machine.format: Field required (it is a "
                                    "profile (`runtime profile`): model: profile reads it)")


def test_a_bad_profile_file_names_the_file_and_its_field(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps({"ops": {"mul": -1.0}}))
    with pytest.raises(ComputeConfigError) as info:
        compute_model({"model": "profile", "path": "p.json"}, seed=0, base_dir=tmp_path)
    assert info.value.field == "compute.path"
    assert f"{tmp_path / 'p.json'}: profile.ops.mul: must be finite and >= 0" in str(info.value)


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "scenario-example.yaml"


def test_the_examples_compute_section_builds_its_model() -> None:
    from runtime.config.scenario import load_scenario

    model = compute_model(load_scenario(EXAMPLE).compute, seed=7)
    assert isinstance(model, Stragglers) and isinstance(model.base, Roofline)
    assert model.base.device == Device(2.0e12, 50e9, 0.0)
    assert model.rules == [Straggler(("trainer:3",), 3.0),
                           Straggler(("trainer:*",), 10.0, probability=0.02)]
