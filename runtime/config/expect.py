"""A scenario's `expect` section, checked against what a run measured.

Each check is a small function returning an `ExpectationResult` that says what was expected,
what was measured and, in words, why it passed or failed:

- ``final_loss_below``: trainer 0's *mean loss over its last 10 steps* (all steps if fewer) is
  below the bound. A window, not the last loss, so that one noisy batch decides nothing.
- ``loss_drop_factor``: trainer 0's mean loss over its first 10 steps divided by the mean over its
  last 10 is at least the factor.
- ``params_equal_to: local``: the final parameters (trainer 0's) equal single-process training
  on the same global batches within ``params_rtol`` and ``params_atol`` (both 1e-5 by default:
  float32 sums in another order; long runs drift further and state their own tolerance).
- ``params_equal_to: fault_free``: the final parameters are *exactly* (bit for bit) those of
  the same scenario without its `faults` (sync mode: no update lost or applied twice).
- ``max_steps_redone``: no trainer redid more steps than this after pservers restarted from
  their checkpoints.
- ``error``: the run fails, with an error whose message contains the text (`outcome`): for a
  fault the job is not meant to survive.
- ``no_lost_updates``: in sync mode every pserver ran exactly ``train.steps`` optimize steps and
  rejected no message; in the other modes (no step count on the server) no message was rejected.
- ``max_step_time``: no step of any trainer took longer than the bound. It is about simulated
  time: checked only when the caller passes the step times (the simulator does; `runtime up`
  does not, and says so in its notes).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from runtime.config.metrics import ExpectationResult, PserverMetrics
from runtime.config.nodes import pserver_name
from runtime.config.scenario import Scenario

LOSS_WINDOW = 10


def _window(losses: list[float], last: bool) -> list[float]:
    n = min(LOSS_WINDOW, len(losses))
    return losses[-n:] if last else losses[:n]


def final_loss_below(bound: float, losses: list[float]) -> ExpectationResult:
    name = "final_loss_below"
    if not losses:
        return ExpectationResult(name, bound, None, False, "trainer 0 reported no loss")
    window = _window(losses, last=True)
    mean = float(np.mean(window))
    passed = bool(mean < bound)
    verb = "is" if passed else "is not"
    return ExpectationResult(name, bound, mean, passed,
                             f"trainer 0's mean loss over its last {len(window)} steps, "
                             f"{mean:.6g}, {verb} below {bound:g}")


def loss_drop_factor(factor: float, losses: list[float]) -> ExpectationResult:
    name = "loss_drop_factor"
    if not losses:
        return ExpectationResult(name, factor, None, False, "trainer 0 reported no loss")
    first, last = float(np.mean(_window(losses, False))), float(np.mean(_window(losses, True)))
    drop = first / last if last > 0 else float("inf")
    passed = bool(drop >= factor)
    verb = "at least" if passed else "less than"
    return ExpectationResult(name, factor, drop, passed,
                             f"trainer 0's mean loss fell from {first:.6g} (first steps) to "
                             f"{last:.6g} (last steps), a factor {drop:.4g}, {verb} {factor:g}")


def params_equal(actual: Mapping[str, np.ndarray] | None, reference: Mapping[str, np.ndarray],
                 rtol: float = 1e-5, atol: float = 1e-5,
                 against: str = "local") -> ExpectationResult:
    name = "params_equal_to"
    what = "local training" if against == "local" else "the fault-free run"
    if actual is None:
        return ExpectationResult(name, against, None, False, "trainer 0 wrote no parameters")
    if set(actual) != set(reference):
        return ExpectationResult(name, against, sorted(actual), False,
                                 f"parameter names differ: run has {sorted(actual)}, {what} "
                                 f"has {sorted(reference)}")
    worst, worst_name = 0.0, ""
    relative = 0.0  # the largest diff over its parameter's largest value (inf: a shape differs)
    failing = []
    for pname in sorted(reference):
        a, r = np.asarray(actual[pname]), np.asarray(reference[pname])
        if a.shape != r.shape:
            failing.append(f"{pname} (shape {list(a.shape)} vs {list(r.shape)})")
            relative = np.inf
            continue
        diff = float(np.max(np.abs(a - r))) if a.size else 0.0
        if diff >= worst:
            worst, worst_name = diff, pname
        if diff:
            scale = float(np.max(np.abs(r)))
            relative = max(relative, diff / scale if scale else np.inf)
        exact = rtol == 0 and atol == 0
        if not (np.array_equal(a, r) if exact else np.allclose(a, r, rtol=rtol, atol=atol)):
            failing.append(f"{pname} (max |diff| {diff:.3g})")
    tolerance = "bit for bit" if rtol == 0 and atol == 0 else f"within rtol {rtol:g}, atol {atol:g}"
    if failing:
        return ExpectationResult(name, against, worst, False,
                                 f"parameters differ from {what} ({tolerance}): "
                                 + ", ".join(failing)
                                 + (_drift_hint(relative) if against == "local" else ""))
    return ExpectationResult(name, against, worst, True,
                             f"{len(reference)} parameters equal {what} {tolerance} "
                             f"(largest |diff| {worst:.3g}, in {worst_name})")


DRIFT = 1e-2
"""A difference this small against the parameters' size reads as float32 rounding, not a lost
or doubled update (which moves a parameter by a step's whole update)."""


def _drift_hint(relative: float) -> str:
    """Where every difference is small against its parameter's size (`relative`, the largest
    such ratio): that sums in another order drift in float32 as training goes on, and the knob
    that allows for it."""
    if relative >= DRIFT:
        return ""
    return (f"; every difference is under {relative:.2g} of its parameter's largest value, the "
            "size float32 sums in another order drift to over many steps: if this run is "
            "longer than expect.params_atol was sized for, raise it (expect.no_lost_updates "
            "checks for lost updates)")


def max_steps_redone(bound: int, redone: Sequence[int]) -> ExpectationResult:
    name = "max_steps_redone"
    most = max(redone, default=0)
    passed = most <= bound
    return ExpectationResult(name, bound, most, passed,
                             f"the most steps a trainer redid after pserver restarts: {most}, "
                             f"{'within' if passed else 'over'} {bound}")


def outcome(scenario: Scenario, error: BaseException | None) -> ExpectationResult | None:
    """Whether the run ended as `expect.error` says: failed with that text (None: the
    scenario expects nothing of the kind). `error` is the run's failure, None if it succeeded."""
    wanted = scenario.expect.error
    if wanted is None:
        return None
    if error is None:
        return ExpectationResult("error", wanted, None, False,
                                 f"expected the run to fail with an error containing {wanted!r}; "
                                 "it succeeded")
    text = f"{type(error).__name__}: {error}"
    passed = wanted in text
    return ExpectationResult("error", wanted, text, passed,
                             f"the run failed {'as expected' if passed else 'otherwise'}: {text}")


def no_lost_updates(pservers: list[PserverMetrics], steps: int, sync: bool) -> ExpectationResult:
    name = "no_lost_updates"
    problems = []
    for p in pservers:
        if sync and p.steps != steps:
            problems.append(f"{pserver_name(p.index)} ran {p.steps} of {steps} steps")
        if p.errors:
            problems.append(f"{pserver_name(p.index)} rejected {p.errors} message(s)")
        if p.dropped:
            problems.append(f"{pserver_name(p.index)} dropped trainer(s) {p.dropped}")
    what = f"every pserver ran {steps} steps with" if sync else "every pserver had"
    detail = "; ".join(problems) if problems else f"{what} no rejected message or dropped trainer"
    return ExpectationResult(name, True, not problems, not problems, detail)


def max_step_time(bound: float, step_times: Sequence[Sequence[float]]) -> ExpectationResult:
    name = "max_step_time"
    steps = [(t, i, k) for i, times in enumerate(step_times) for k, t in enumerate(times)]
    if not steps:
        return ExpectationResult(name, bound, None, False, "no trainer reported a step")
    longest, trainer, step = max(steps, key=lambda s: s[0])  # the first of equals
    passed = bool(longest <= bound)
    verb = "within" if passed else "over"
    return ExpectationResult(name, bound, longest, passed,
                             f"the longest step, trainer {trainer}'s step {step}, took "
                             f"{longest * 1e3:.6g}ms, {verb} the bound of {bound * 1e3:.6g}ms")


def check(scenario: Scenario, losses: list[float], params: Mapping[str, np.ndarray] | None,
          pservers: list[PserverMetrics],
          local_params: Callable[[], Mapping[str, np.ndarray]],
          step_times: Sequence[Sequence[float]] | None = None,
          fault_free_params: Callable[[], Mapping[str, np.ndarray]] | None = None,
          redone: Sequence[int] = ()) -> list[ExpectationResult]:
    """Every expectation `scenario` states, measured on a run that ended (``error`` aside, see
    `outcome`): trainer 0's losses and final parameters, the pservers' records; `local_params`
    trains the local reference and `fault_free_params` runs the scenario without its faults,
    when asked. `step_times` (each trainer's, in simulated seconds) lets ``max_step_time`` be
    checked; `redone` is each trainer's count of steps redone."""
    spec = scenario.expect
    results = []
    if spec.final_loss_below is not None:
        results.append(final_loss_below(spec.final_loss_below, losses))
    if spec.loss_drop_factor is not None:
        results.append(loss_drop_factor(spec.loss_drop_factor, losses))
    if spec.params_equal_to == "local":
        results.append(params_equal(params, local_params(), spec.params_rtol, spec.params_atol))
    if spec.params_equal_to == "fault_free":
        if fault_free_params is None:
            raise ValueError("expect.params_equal_to fault_free: no fault-free run to compare with")
        results.append(params_equal(params, fault_free_params(), 0.0, 0.0, "fault_free"))
    if spec.max_steps_redone is not None:
        results.append(max_steps_redone(spec.max_steps_redone, redone))
    if spec.no_lost_updates:
        results.append(no_lost_updates(pservers, scenario.train.steps,
                                       scenario.transpiler.mode == "sync"))
    if spec.max_step_time is not None and step_times is not None:
        results.append(max_step_time(spec.max_step_time, step_times))
    return results
