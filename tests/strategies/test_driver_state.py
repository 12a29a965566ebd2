"""The driver's states as plain data: the only transitions allowed, and what each state says
(a plan in force, the plan chosen last, why training is on the default placement)."""

import dataclasses
import itertools

import pytest

from kerasflow.planner import Plan
from kerasflow.strategies.driver_state import (AT_FIT_END, TRANSITIONS, Default, InTrial, Planned, Planning, Profiling,
                                               WarmingUp)


@dataclasses.dataclass(frozen=True)
class Parts:
    """Stands for ``InForce``: the states read only its plan."""

    plan: Plan


HEFT, CPOP = Plan(algorithm="heft"), Plan(algorithm="cpop")
KEPT = Plan(algorithm="default_placement")
ONE_OF_EACH = {
    WarmingUp: WarmingUp(),
    Profiling: Profiling(steps="profiled steps"),
    Planning: Planning(job="planning job", since=5, profile_seconds=1.0),
    InTrial: InTrial(Parts(HEFT), trial="trial"),
    Planned: Planned(Parts(HEFT)),
    Default: Default("dropped", dropped=HEFT),
}
ALLOWED = {
    (WarmingUp, WarmingUp), (WarmingUp, Profiling), (WarmingUp, InTrial), (WarmingUp, Default),
    (Profiling, WarmingUp), (Profiling, Planning), (Profiling, InTrial), (Profiling, Default),
    (Planning, WarmingUp), (Planning, InTrial), (Planning, Default),
    (InTrial, InTrial), (InTrial, Planned), (InTrial, Default),
    (Planned, Default),
}


@pytest.mark.parametrize("before, after", list(itertools.product(ONE_OF_EACH, repeat=2)),
                         ids=lambda kind: kind.__name__)
def test_only_the_written_transitions_are_taken(before, after):
    state, following = ONE_OF_EACH[before], ONE_OF_EACH[after]
    if (before, after) in ALLOWED:
        assert state.then(following) is following
    else:
        with pytest.raises(AssertionError, match=f"no transition from {state.name} to {following.name}"):
            state.then(following)
    assert set(TRANSITIONS) == set(ONE_OF_EACH)


def test_default_is_for_good_and_the_trial_leads_everywhere_but_back():
    assert TRANSITIONS[Default] == frozenset()
    assert all(Default in allowed for kind, allowed in TRANSITIONS.items() if kind is not Default)
    assert not any(WarmingUp in TRANSITIONS[kind] or Profiling in TRANSITIONS[kind] or Planning in TRANSITIONS[kind]
                   for kind in (InTrial, Planned, Default))


def test_every_state_has_its_way_out_at_the_end_of_fit_and_it_is_a_transition():
    assert set(AT_FIT_END) == set(ONE_OF_EACH)
    for kind, ends in AT_FIT_END.items():
        assert ends and all(end is kind or end in TRANSITIONS[kind] for end in ends), kind
    # A profile, a planner and a trial never outlive their fit; warm-up counts on, a settled state stays.
    assert AT_FIT_END[Profiling] == AT_FIT_END[Planning] == {WarmingUp} and AT_FIT_END[InTrial] == {Planned, Default}
    assert all(AT_FIT_END[kind] == {kind} for kind in (WarmingUp, Planned, Default))


def test_a_plan_is_in_force_only_in_the_trial_and_once_settled():
    assert [kind.__name__ for kind, state in ONE_OF_EACH.items() if state.in_force] == ["InTrial", "Planned"]


def test_the_plan_chosen_last_is_read_from_the_state():
    assert WarmingUp(given=CPOP).plan is None  # a given plan is not chosen before it was checked
    assert Profiling("profiled steps").plan is None and Planning("planning job", 5, 1.0).plan is None
    assert InTrial(Parts(CPOP), "trial").plan is CPOP and Planned(Parts(CPOP)).plan is CPOP
    assert Default("kept", kept=KEPT).plan is KEPT
    assert Default("dropped", dropped=HEFT).plan is HEFT
    assert Default("profiling failed: RuntimeError: no profile").plan is None


def test_states_are_frozen_values():
    state = WarmingUp(given=HEFT, since=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.since = 0  # the driver moves to a new state instead
    assert state == WarmingUp(given=HEFT, since=3) != WarmingUp(since=3)
    assert [ONE_OF_EACH[kind].name for kind in ONE_OF_EACH] == ["warming_up", "profiling", "planning", "trial", "planned",
                                                                 "default"]


# ------------------------------------------------------------------ the driver reads its state
class Model:
    """Stands for a Keras model on the default placement: its train function counts its calls."""

    def __init__(self):
        self.calls = []
        self.train_function = lambda iterator: self.calls.append(iterator) or "default outputs"

    def make_train_function(self, force=False):
        return self.train_function


class Applier:
    def __init__(self):
        self.skip_order, self.refused = False, []

    def refuse_order(self, reason):
        self.skip_order = True
        self.refused.append(reason)


@dataclasses.dataclass(frozen=True)
class Failing:
    """Stands for ``InForce``: every planned call raises ``error``."""

    plan: Plan
    error: BaseException
    applier: Applier = dataclasses.field(default_factory=Applier)
    replicas: None = None

    def run(self, planned, iterator):
        raise self.error


def driver_on(state=None, plan=None):
    from kerasflow.strategies import Collaborators
    from kerasflow.strategies.driver import Driver
    from kerasflow.strategies.options import Options

    driver = Driver(Options(devices=("/CPU:0", "/CPU:1"), plan=plan, verbose=0),
                    collaborators=Collaborators(stopwatch=lambda step, plan: (step(), 0.0)))
    driver.model = Model()
    if state is not None:
        driver.state = state  # as the driver's own transitions would leave it
    return driver


def test_a_new_driver_warms_up_with_the_given_plan_and_says_nothing_else():
    driver = driver_on(plan=HEFT)
    assert driver.state == WarmingUp(given=HEFT, since=0) and driver.step == 0
    assert (driver.plan, driver.in_force, driver.in_force_parts, driver.fallback) == (None, False, None, None)
    assert driver.placement_report() is None


def test_the_plan_chosen_last_and_the_fallback_are_read_from_the_state():
    parts = Parts(HEFT)
    driver = driver_on(Planned(parts))
    assert driver.in_force and driver.in_force_parts is parts and driver.plan is HEFT and driver.fallback is None
    driver.state = Default("no plan is predicted enough faster", kept=KEPT)
    report = driver.placement_report()
    assert driver.plan is KEPT and not driver.in_force and driver.in_force_parts is None
    assert report == [] and report.default_kept and not report.in_force
    assert driver.fallback == report.fallback == "no plan is predicted enough faster"


def test_going_back_is_for_good_with_one_warning():
    driver = driver_on(Planned(Parts(HEFT)))
    with pytest.warns(RuntimeWarning) as caught:
        driver.back_to_default("the plan measured slower", "kerasflow: the plan measured slower")
        driver.fail("running the planned step", RuntimeError("too late"))  # already back: nothing happens
    assert [str(w.message) for w in caught] == ["kerasflow: the plan measured slower"]
    assert driver.state == Default("the plan measured slower", dropped=HEFT)


@pytest.mark.parametrize("order", [{}, {"/CPU:0": ("a", "b")}], ids=["without-order", "with-order"])
def test_a_planned_call_that_fails_goes_back_and_the_default_placement_runs_that_call(order):
    import tensorflow as tf

    # A lost cluster task is never the order's doing, so it is not dropped for another try.
    error = RuntimeError("no planned step today") if not order else tf.errors.UnavailableError(None, None, "lost")
    parts = Failing(dataclasses.replace(HEFT, order=order), error)
    driver = driver_on(Planned(parts))
    with pytest.warns(RuntimeWarning, match="running the planned step failed"):
        outputs = driver.run_step(lambda iterator: "planned outputs", "batch 7")
    assert outputs == "default outputs" and driver.model.calls == ["batch 7"]
    assert parts.applier.refused == [] and not driver.in_force
    assert driver.fallback.startswith("running the planned step failed: ") and driver.plan is parts.plan


@pytest.mark.parametrize("error", [StopIteration(), KeyboardInterrupt()], ids=["out-of-data", "interrupt"])
def test_the_end_of_the_data_and_an_interrupt_pass_through_a_planned_call(error):
    parts = Failing(HEFT, error)
    driver = driver_on(Planned(parts))
    with pytest.raises(type(error)):
        driver.run_step(lambda iterator: "planned outputs", "batch 7")
    assert driver.state == Planned(parts) and driver.model.calls == []

