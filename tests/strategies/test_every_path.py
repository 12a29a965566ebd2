"""Every output a user reads after ``fit`` equals plain Keras' on every path the plan can take,
through both doors (issue 32, item 3).

Each test forces one path through the driver's seams (``Collaborators``: a planner that returns
the plans the path needs, a ``ScriptedStopwatch`` that runs every step for real but reports the
seconds the path needs, a profiler or planner that raises), checks the path really happened
(the plan in force, the report, the placement report, the stopwatch's counts, the warnings),
then compares every output with plain Keras' run of the same model, seed and data: each step's
logs, History (validation metrics included), ``evaluate``, ``predict``, every weight (moving
statistics and seed states included), every optimizer variable, the weights ModelCheckpoint
kept, EarlyStopping's ``stopped_epoch``, the learning rate ReduceLROnPlateau left, and a
BackupAndRestore resume. ``python -m pytest -v`` prints the matrix: ``model-path-door``.

The convnet takes every path but the split ones through both doors with every callback; the
BatchNormalization CNN takes the split paths through both doors and, with the GAN (its own
train_step, two optimizers) and the ``tf.data`` pipeline (a partial last batch), the main paths,
alternating doors. Where a path is the first fit of another path's run (kept
of second_fit's, replaced of fit_evaluate_fit's, dropped of use_plan's), one run serves both: the
first is judged on the first fit's outputs and the door's state after it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import pytest

from kerasflow.planner import Shard
from kerasflow.planner.ir.graphtables import LOSS_GROUP
from kerasflow.strategies import Collaborators
from kerasflow.strategies.verdict import TIMED_ROUNDS
from kerasflow.testing import ScriptedStopwatch
from kerasflow.testing.rounding import Spread
from tests.strategies import paths
from tests.strategies.paths import (BACKUP, ONE, SPECS, TWO, TWO_WITH_EVALUATE, TWO_WITH_EVALUATE_AND_PREDICT, Door,
                                    Program, Spec)

DEFAULT, FAST, SLOW = 1.0, 0.5, 2.0  # scripted seconds of a default step, a fast and a slow plan's
FIX = ("If this persists, report it with the model's code, or plan offline with kerasflow.profiling.profile_model "
       "and kerasflow.plan and pass plan=.")
LATER_STEP = 10  # the planned step that fails on the "later step" path: after the plan was kept


def slower(rounds: int = TIMED_ROUNDS, ms: str = "2000.00", ratio: str = "2.00") -> str:
    return (f"the plan measured {ms} ms a step, slower than the default placement's 1000.00 ms in alternating "
            f"steps ({ratio}x its step, the median of {rounds} round{'s' if rounds != 1 else ''})")


def dropped_warning(why: str) -> str:
    return (f"kerasflow: {why}; training continues on the default placement. Pass drop_slower_plan=False to keep "
            "a slower plan.")


def failed_warning(stage: str, cause: str, planned: bool) -> str:
    return (f"kerasflow: {stage} failed ({cause}); training continues on the default placement"
            f"{'' if planned else ', unchanged'}. {FIX}")


# ---------------------------------------------------------------------------------------- paths
@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a run forces its path: ``door(spec)``, the door's options (the seams); the program; what
    runs between two fits."""

    door: Callable[[Spec], dict]
    program: Program = ONE
    between: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Path:
    """A path: its ``recipe`` and ``check(state, spec)``, which asserts that it really happened.

    ``first_fit_of``: a path whose run's first fit is this path; where that path is in the matrix
    too (same model and door), this one is judged on that run's first fit (its logs, History and
    state after it), and one run serves both.
    """

    recipe: Recipe
    check: Callable
    first_fit_of: str | None = None


def seams(planner=None, seconds=None, fail_from=None, profiler=None) -> dict:
    parts = {"stopwatch": ScriptedStopwatch(seconds or {None: DEFAULT}, fail_from=fail_from)}
    if planner is not None:
        parts["planner"] = planner
    if profiler is not None:
        parts["profiler"] = profiler
    return {"collaborators": Collaborators(**parts)}


def tried(spec, *, first=FAST, second=None, fail_from=None, seconds=None, **options) -> dict:
    """The first plan, then (when ``second`` gives its seconds) the runner-up, predicted fast
    enough to be tried; ``seconds``: more of the stopwatch's script."""
    if second is None:
        planner = paths.planner(spec.first, spec.second, runner_up_predicted=10.0)  # never worth a try
        script = {None: DEFAULT, spec.first: first}
    else:
        planner = paths.planner(spec.first, spec.second, runner_up_predicted=lambda first: first * 0.01)
        script = {None: DEFAULT, spec.first: first, spec.second: second}
    return {**seams(planner, {**script, **(seconds or {})}, fail_from), **options}


def check_kept(state, spec):
    assert state.plan_in_force and state.plan.algorithm == spec.first
    report = state.report
    assert report["measured_step_time"] == FAST and report["default_step_time"] == DEFAULT
    assert "plan_replaced" not in report and "plan_dropped" not in report
    assert state.placement.in_force and state.placement.fallback is None
    assert state.counts[None] == 1 + TIMED_ROUNDS  # the untimed default step and one a round
    assert state.warnings == []


def check_replaced(state, spec):
    assert state.plan_in_force and state.plan.algorithm == spec.second
    report = state.report
    assert report["plan_replaced"] == f"{spec.first}: {slower()}"
    assert report["algorithm"] == spec.second and report["measured_step_time"] == FAST
    assert "plan_dropped" not in report
    assert state.placement.in_force and state.placement.fallback is None
    assert state.counts[None] == 2 * (1 + TIMED_ROUNDS)  # both plans timed in full
    assert state.warnings == []


def check_replaced_then_dropped(state, spec):
    report = state.report
    assert not state.plan_in_force and state.plan.algorithm == spec.second
    assert report["plan_replaced"] == f"{spec.first}: {slower()}"
    assert report["plan_dropped"] == slower()  # no runner-up is left after the first
    assert state.placement.fallback == report["plan_dropped"] and not state.placement.in_force
    assert state.counts[None] == 2 * (1 + TIMED_ROUNDS)
    assert state.warnings == [dropped_warning(slower())]


def check_dropped(state, spec):
    report = state.report
    assert not state.plan_in_force and "plan_replaced" not in report
    why = report["plan_dropped"]
    assert why.startswith(f"{slower()}; no other plan is tried: the best of them, {spec.second}, is expected at ")
    assert state.placement.fallback == why and not state.placement.in_force
    assert state.counts[None] == 1 + TIMED_ROUNDS and state.counts[spec.first] == 1 + TIMED_ROUNDS  # then never again
    assert state.warnings == [dropped_warning(why)]


def check_mid_trial(state, spec):
    # Planned after step 28 of 36: the first planned step 29, the untimed default step 30,
    # 2 rounds (31-34) and the planned half of a third (35) when fit ends; judged on 2 rounds.
    assert state.plan_in_force and state.plan.algorithm == spec.first
    report = state.report
    assert report["measured_step_time"] == FAST and report["default_step_time"] == DEFAULT
    assert TIMED_ROUNDS == 3 and state.counts == {spec.first: 1 + 3, None: 1 + 2}
    assert state.placement.in_force and state.warnings == []
    assert report["settled_step"] == state.steps  # the first step after the timing: none in this fit


def check_default_kept(state, spec):
    assert not state.plan_in_force and state.plan.algorithm == "default_placement"
    report = state.report
    assert report["predicted_default_step_time"] == report["predicted_step_time"]
    assert "measured_step_time" not in report and "plan_dropped" not in report
    assert state.counts == {}  # not a step was timed: there was no trial
    assert not state.placement.in_force and "no plan is predicted enough faster" in state.placement.fallback
    assert state.warnings == []


def check_trusted(state, spec):
    # Predicted 10x faster than the default placement: put in force untimed against it, and kept
    # though its steps "last" twice the default's.
    assert state.plan_in_force and state.plan.algorithm == spec.first
    report = state.report
    assert report["measured_step_time"] == SLOW and "default_step_time" not in report
    assert None not in state.counts and "plan_dropped" not in report
    assert state.placement.in_force and state.warnings == []


def check_loss_split(state, spec):
    # The compiled loss ran as two shards, each on its device and weighted by its share of the
    # batch (the predictions passed shard to shard from the split layer before it).
    check_kept(state, spec)
    assert state.plan.splits.keys() == {"classes", LOSS_GROUP}
    assert list(state.placement) == [] and state.placement.not_applied == [], state.placement.summary()


def the_loss_split(plan):
    """The plan with the output layer and the compiled loss split in halves over two devices; its
    order left out (it names the unsplit ops)."""
    halves = (Shard("/CPU:1", 0.5), Shard("/CPU:2", 0.5))
    return dataclasses.replace(plan, splits={"classes": halves, LOSS_GROUP: halves}, order={})


def check_normalization_split(state, spec):
    # Every layer ran as two shards: the BatchNormalization layers with the whole batch's
    # statistics (each shard's sums added and sent back), the first shard updating the moving ones.
    check_kept(state, spec)
    assert {"bn_a", "bn_b", LOSS_GROUP} <= state.plan.splits.keys()
    assert list(state.placement) == [] and state.placement.not_applied == [], state.placement.summary()


def the_normalization_split(plan):
    """The plan with every layer of the BatchNormalization CNN and its compiled loss split in
    halves over two devices; its order left out (it names the unsplit ops)."""
    halves = (Shard("/CPU:1", 0.5), Shard("/CPU:2", 0.5))
    layers = ("conv_a", "bn_a", "relu_a", "pool_a", "conv_b", "bn_b", "relu_b", "gap", "classes", LOSS_GROUP)
    return dataclasses.replace(plan, splits={layer: halves for layer in layers}, order={})


def predicted_ten_times_faster(plan):
    return dataclasses.replace(plan, candidates={**plan.candidates, "default_placement": 10 * plan.predicted_step_time})


def check_failed(stage: str, cause: str, planned: bool, plan_made: bool = True):
    """The failure at ``stage`` (its error's text starts with ``cause``, formatted with the spec)."""
    def check(state, spec):
        assert not state.plan_in_force
        assert (state.plan is not None) is plan_made
        begins = cause.format(spec=spec)
        *order, warning = state.warnings or [""]
        assert warning.startswith(f"kerasflow: {stage} failed ({begins}"), state.warnings
        assert warning.endswith(failed_warning(stage, "", planned).split("()", 1)[1]), warning
        if order:  # a plan with a per-device order drops the order first
            assert state.plan.order and len(order) == 1 and "the planned order could not run" in order[0], order
        assert state.placement.fallback.startswith(f"{stage} failed: {begins}") and not state.placement.in_force
        if not plan_made:
            assert state.counts == {}  # not a step ran through the stopwatch
    return check


def check_failed_later(state, spec):
    check_failed("running the planned step", f"RuntimeError: a failure forced at step {LATER_STEP} of "
                 "{spec.first}", planned=True)(state, spec)
    assert state.report["measured_step_time"] == FAST  # it was kept first
    assert state.counts[spec.first] == LATER_STEP + 1 and state.counts[None] == 1 + TIMED_ROUNDS


def check_given(state, spec, *, earlier: dict | None = None):
    given = paths.given_plan(spec.name)
    assert state.plan_in_force and state.plan.placement == given.placement
    report = state.report
    assert report["measured_step_time"] == FAST and "default_step_time" not in report  # timed for the report only
    # Checked after step 0 and applied from step 1 (FastTStrategy's and FastT's plan=); never
    # timed beside the default placement (``earlier``: the stopwatch's counts of an earlier fit).
    assert state.counts == {**(earlier or {}), given.algorithm: state.steps - 1}
    assert state.placement.in_force


def check_given_plan(state, spec):
    check_given(state, spec)
    assert state.warnings == []


def check_use_plan(state, spec):
    # The first fit dropped its plan (timed in full: 4 planned and 4 default steps); use_plan put
    # the given plan in force for the second.
    check_given(state, spec, earlier={spec.first: 1 + TIMED_ROUNDS, None: 1 + TIMED_ROUNDS})
    assert len(state.warnings) == 1 and state.warnings[0].startswith(dropped_warning(slower()).split(";")[0])


def given_options(spec):
    given = paths.given_plan(spec.name)
    return {"plan": given, **seams(seconds={None: DEFAULT, given.algorithm: FAST})}


def use_given_plan(door: Door):
    door.use_plan(paths.given_plan("convnet"))


def misplaced(plan):
    """The plan with every op, or every replica, on a device that does not exist."""
    changes = {"placement": {op: "/CPU:9" for op in plan.placement}}
    if plan.data_parallel is not None:
        changes["data_parallel"] = dataclasses.replace(
            plan.data_parallel, devices=tuple(f"/CPU:{9 + index}" for index in range(len(plan.data_parallel.devices))))
    return dataclasses.replace(plan, **changes)


def mid_trial_warmup(spec) -> int:
    return spec.epochs * paths.steps_an_epoch(spec) - 8  # plans after step 28 of 36 (see check_mid_trial)


KEPT = Recipe(lambda spec: tried(spec))
REPLACED = Recipe(lambda spec: tried(spec, first=SLOW, second=FAST))
DROPPED = Recipe(lambda spec: tried(spec, first=SLOW))
PATHS = {
    "kept": Path(KEPT, check_kept, first_fit_of="second_fit"),
    "replaced": Path(REPLACED, check_replaced, first_fit_of="fit_evaluate_fit"),
    "replaced_then_dropped": Path(Recipe(lambda spec: tried(spec, first=SLOW, second=SLOW)),
                                  check_replaced_then_dropped),
    "dropped": Path(DROPPED, check_dropped, first_fit_of="use_plan_after_a_dropped_plan"),
    "fit_ends_mid_trial": Path(Recipe(lambda spec: tried(spec, warmup_steps=mid_trial_warmup(spec))), check_mid_trial),
    # The collaborators' profiler runs when the plan is made, so its failure is named "planning".
    "profiling_fails": Path(Recipe(lambda spec: seams(profiler=paths.raising("profile"))),
                            check_failed("planning", "RuntimeError: no profile today", planned=False,
                                         plan_made=False)),
    "planning_fails": Path(Recipe(lambda spec: seams(planner=paths.raising("plan"))),
                           check_failed("planning", "RuntimeError: no plan today", planned=False, plan_made=False)),
    # The variables cannot move to /CPU:9: nothing ran on the plan, so training goes on "unchanged".
    "rebuilding_fails": Path(Recipe(lambda spec: seams(paths.planner(spec.first, change=misplaced),
                                                       {None: DEFAULT, spec.first: FAST})),
                             check_failed("rebuilding the step with the plan", "InvalidArgumentError: Could not "
                                          "satisfy device specification '/job:localhost/replica:0/task:0/device:CPU:9'",
                                          planned=False)),
    "first_planned_step_fails": Path(Recipe(lambda spec: tried(spec, fail_from=(spec.first, 0))),
                                     check_failed("running the planned step", "RuntimeError: a failure forced at "
                                                  "step 0 of {spec.first}", planned=True)),
    "later_step_fails": Path(Recipe(lambda spec: tried(spec, fail_from=(spec.first, LATER_STEP))), check_failed_later),
    "given_plan": Path(Recipe(given_options), check_given_plan),
    # evaluate and predict after the dropped plan (Keras' traced functions saw the planned variables).
    "use_plan_after_a_dropped_plan": Path(
        dataclasses.replace(DROPPED, program=TWO_WITH_EVALUATE_AND_PREDICT, between=use_given_plan,
                            door=lambda spec: tried(spec, first=SLOW, seconds={
                                paths.given_plan(spec.name).algorithm: FAST})),
        check_use_plan),
    "second_fit": Path(dataclasses.replace(KEPT, program=TWO), check_kept),
    "trusted": Path(Recipe(lambda spec: seams(paths.planner(spec.first, change=predicted_ten_times_faster),
                                              {None: DEFAULT, spec.first: SLOW})), check_trusted),
    # The planner keeps the default placement: nothing applied; a second fit, evaluate and predict.
    "default_kept": Path(Recipe(lambda spec: seams(paths.planner("default_placement")),
                                program=TWO_WITH_EVALUATE_AND_PREDICT), check_default_kept),
    "loss_split": Path(Recipe(lambda spec: seams(paths.planner(spec.first, spec.second, runner_up_predicted=10.0,
                                                               change=the_loss_split),
                                                 {None: DEFAULT, spec.first: FAST})), check_loss_split),
    "normalization_split": Path(Recipe(lambda spec: seams(paths.planner(
        spec.first, spec.second, runner_up_predicted=10.0, change=the_normalization_split),
        {None: DEFAULT, spec.first: FAST})), check_normalization_split),
    "fit_evaluate_fit": Path(dataclasses.replace(REPLACED, program=TWO_WITH_EVALUATE), check_replaced),
    "backup_and_restore": Path(dataclasses.replace(KEPT, program=BACKUP), check_kept),
}

DOORS = ("strategy", "callback")
MAIN = ("kept", "replaced", "dropped")
FAILURE = {"bn_cnn": "later_step_fails", "gan": "first_planned_step_fails", "pipeline": "rebuilding_fails"}
# The split paths reorder sums, so they are judged against plain Keras with permuted rows, which
# keeps a model's math only without random layers: they run on the BatchNormalization CNN.
SPLIT_PATHS = ("loss_split", "normalization_split")
CASES = [("convnet", path, door) for path in PATHS if path not in SPLIT_PATHS for door in DOORS]
CASES += [("bn_cnn", path, door) for path in SPLIT_PATHS for door in DOORS]
for number, name in enumerate(("bn_cnn", "gan", "pipeline")):
    for index, path in enumerate(MAIN + (FAILURE[name],)):
        CASES.append((name, path, DOORS[(number + index) % 2]))

_SHARED: dict = {}  # (model, path, door) -> the run a path judged on its first fit left for its owner


def run_for(model: str, path: str, door: str, directory) -> tuple[paths.Run, str, int]:
    """The run ``path`` is judged on, the path that owns it and the fit to judge (-1: the last,
    and what was read after it)."""
    owner = PATHS[path].first_fit_of
    if owner is None or (model, owner, door) not in CASES:
        owner = path
    key = (model, owner, door)
    recipe = PATHS[owner].recipe
    if key in _SHARED:
        run = _SHARED.pop(key)
    else:
        run = paths.run(model, recipe.program, Door(door, **recipe.door(SPECS[model])), between=recipe.between,
                        directory=str(directory))
        if owner != path:
            _SHARED[key] = run  # for the owner's test
    return run, owner, 0 if owner != path else -1


def reference(model: str, program: Program, fit: int, rows_permuted: bool = False) -> dict:
    """Plain Keras' outputs for ``program`` judged on ``fit`` (``rows_permuted``: with each training
    batch's rows permuted). Plain Keras' two-fit runs read evaluate and predict between the fits
    (it changes nothing else); only the reads ``program`` makes are kept."""
    full = dataclasses.replace(program, between=("evaluate", "predict")) if program.fits > 1 and not program.backup \
        else program
    return judged(paths.plain(model, full, rows_permuted).outputs, fit, program)


def judged(outputs: dict, fit: int, program: Program) -> dict:
    """The outputs a path judged on ``fit`` reads (0: the first fit's logs, History and what was
    read after it)."""
    def read(name):
        where, _, what = name.partition(".")
        if where.startswith("after_fit") and what.split(".")[0] in ("evaluate", "predict"):
            return what.split(".")[0] in program.between and (fit == -1 or where == f"after_fit{fit}")
        return fit == -1 or where in (f"fit{fit}", f"after_fit{fit}")
    return {name: value for name, value in outputs.items() if read(name)}


@pytest.mark.parametrize("model, path, door", CASES, ids=[f"{m}-{p}-{d}" for m, p, d in CASES])
def test_every_output_equals_plain_keras(model, path, door, tmp_path_factory):
    spec = SPECS[model]
    run, owner, fit = run_for(model, path, door, tmp_path_factory.mktemp(f"{model}-{path}-{door}"))
    program = PATHS[owner].recipe.program
    # A step ran that sums in another order than one device (data-parallel, or a split layer or
    # loss): the outputs are held to plain Keras' own spread under permuted rows.
    expected = reference(model, program, fit)
    spread = None
    state = run.states[fit]
    if (state.plan is not None and state.plan.splits) or any(name and "data_parallel" in name for name in state.counts):
        spread = Spread.between(expected, reference(model, program, fit, rows_permuted=True))
    problems = paths.differences(judged(run.outputs, fit, program), expected, run.names, spread=spread)
    try:
        PATHS[path].check(run.states[fit], spec)
    except AssertionError as error:
        problems.insert(0, f"the path did not happen as forced: {error}")
    assert problems == []
