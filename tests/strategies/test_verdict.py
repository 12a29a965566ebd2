"""The verdict on a plan timed beside the default placement, worked out by hand: keep it, try a runner-up, or drop it.

Every expected value below is computed in the comments from the numbers of the case, not by
calling the code: a plan predicted 10 ms that measured 12 ms beside a default step of 10 ms is
1.2x the default, 20 % over the 3 % margin, and a plan of its kind is expected at 1.2x its own
prediction.
"""

import keras
import pytest

from kerasflow.planner import DataParallel, Plan
from kerasflow.strategies.trial import Trial
from kerasflow.strategies.verdict import (RUNNER_UP_GAIN, SLOWER_MARGIN, TIMED_ROUNDS, Verdict, judge,
                                         needs_confirmation, trusted_gains)

TWO_CPUS = DataParallel(("/CPU:0", "/CPU:1"))


def placed(predicted, algorithm="heft"):
    """A plan that places ops (it does not replicate the step)."""
    return Plan(placement={}, predicted_step_time=predicted, algorithm=algorithm)


def replicated(predicted, algorithm="data_parallel"):
    """A data-parallel plan: the other kind from ``placed``."""
    return Plan(placement={}, data_parallel=TWO_CPUS, predicted_step_time=predicted, algorithm=algorithm)


def slower(measured_ms, default_ms, ratio, rounds):
    """The sentence of a plan that gave way; every argument is the text as it is printed."""
    return (f"the plan measured {measured_ms} ms a step, slower than the default placement's {default_ms} ms in "
            f"alternating steps ({ratio}x its step, the median of {rounds})")


# The plan of most cases: predicted 10 ms, measured 12 ms beside a default step of 10 ms, so
# 1.2x the default and 1.2x its own prediction.
PLAN = placed(0.010)
SLOWER = slower("12.00", "10.00", "1.20", "6 rounds")
# RUNNER_UP_GAIN: a runner-up must be expected under 10 ms * (1 - 0.05) = 9.5 ms.


def test_the_trials_numbers_are_a_3_percent_margin_a_5_percent_gain_and_three_rounds():
    assert (SLOWER_MARGIN, RUNNER_UP_GAIN, TIMED_ROUNDS) == (0.03, 0.05, 3)


def plan_against(default):
    return Plan(placement={}, predicted_step_time=0.010, candidates={"default_placement": default})


def test_a_plan_on_cpus_predicted_more_than_2_76x_faster_than_the_default_placement_needs_no_trial():
    # Predicted 10 ms against the default placement's 27.6 ms: a gain of exactly 1.76 is timed.
    assert trusted_gains()["CPU"] == 1.76  # the calibration of 2026-12-06 on logical CPUs
    assert needs_confirmation(plan_against(0.0276), ["CPU"]) and not needs_confirmation(plan_against(0.0277), ["CPU"])
    assert needs_confirmation(Plan(placement={}, predicted_step_time=0.010), ["CPU"])  # no default priced: timed


def test_on_a_kind_never_calibrated_every_plan_is_timed():
    # The simulator's error on an H100 was never measured: even a plan predicted 100x faster is timed.
    assert "H100" not in trusted_gains()
    assert needs_confirmation(plan_against(1.0), ["H100"])
    assert needs_confirmation(plan_against(1.0), ["CPU", "H100"])  # a plan on both kinds: the unknown one counts
    gains = {"CPU": 1.48, "H100": 0.5}  # as if calibrated: the smaller gain of the two kinds counts
    assert not needs_confirmation(plan_against(0.0151), ["H100"], gains)
    assert needs_confirmation(plan_against(0.0149), ["CPU", "H100"], gains)


@pytest.mark.parametrize("ratio", [1.03, 1.0299, 1.0, 0.7])
def test_a_plan_at_most_3_percent_slower_than_the_default_is_kept(ratio):
    # 1.03 is the margin itself (1 + 0.03 is 1.03 in floating point too): kept. A faster
    # runner-up changes nothing: a kept plan tries none.
    assert judge(PLAN, 0.0103, 0.010, ratio, 6, [replicated(0.001)]) == Verdict(keep=True, runner_up=None, why="")


def test_a_plan_just_over_3_percent_slower_is_dropped():
    # 1.031 prints as 1.03x, yet it is over the margin.
    assert judge(PLAN, 0.01031, 0.010, 1.031, 6) == Verdict(
        keep=False, why=slower("10.31", "10.00", "1.03", "6 rounds"))


def test_with_no_runner_up_the_reason_is_only_the_slower_sentence():
    assert judge(PLAN, 0.012, 0.010, 1.2, 6) == Verdict(keep=False, runner_up=None, why=SLOWER)
    assert SLOWER == ("the plan measured 12.00 ms a step, slower than the default placement's 10.00 ms in "
                      "alternating steps (1.20x its step, the median of 6 rounds)")


def test_one_round_is_said_in_the_singular():
    # A fit that ended after one round is judged on it.
    assert judge(PLAN, 0.012, 0.010, 1.2, 1).why == slower("12.00", "10.00", "1.20", "1 round")


def test_a_runner_up_of_the_other_kind_is_tried_on_its_own_prediction():
    # The measurement says nothing about data parallelism: 9.4 ms stands, under 9.5 ms.
    other = replicated(0.0094)
    verdict = judge(PLAN, 0.012, 0.010, 1.2, 6, [other])
    assert verdict.runner_up is other and not verdict.keep and verdict.why == SLOWER


def test_a_runner_up_of_the_same_kind_is_scaled_by_the_plans_measured_over_predicted():
    # 7.5 ms * 1.2 = 9.0 ms, under 9.5 ms: tried.
    cpop = placed(0.0075, "cpop")
    assert judge(PLAN, 0.012, 0.010, 1.2, 6, [cpop]) == Verdict(keep=False, runner_up=cpop, why=SLOWER)


def test_the_runner_up_is_the_fastest_once_scaled_not_the_first_given():
    # Given best first by prediction: cpop 7.8 ms, then data parallel 9.0 ms. Scaled, cpop is
    # expected at 7.8 * 1.2 = 9.36 ms and data parallel stays at 9.0 ms: data parallel goes first.
    # Both are under 9.5 ms, so taking the wrong end of the ranking would try cpop.
    cpop, other = placed(0.0078, "cpop"), replicated(0.0090)
    assert judge(PLAN, 0.012, 0.010, 1.2, 6, [cpop, other]).runner_up is other


def test_a_runner_up_expected_exactly_5_percent_faster_is_not_tried():
    # 9.5 ms is not under 10 ms * 0.95 (both are the same float, 0.0095): not tried.
    assert judge(PLAN, 0.012, 0.010, 1.2, 6, [replicated(0.0095)]) == Verdict(
        keep=False, runner_up=None,
        why=SLOWER + "; no other plan is tried: the best of them, data_parallel, is expected at 9.50 ms, "
                     "not 5 % faster than the default placement")
    # Just under the boundary it is.
    assert judge(PLAN, 0.012, 0.010, 1.2, 6, [replicated(0.00949)]).runner_up is not None


def test_a_runner_up_of_the_same_kind_at_the_boundary_is_reported_with_its_scaling():
    # Predicted 6 ms, measured 12 ms: 2x. cpop predicted 4.75 ms is expected at 9.5 ms, the
    # boundary (exactly: doubling a float is exact), so it is not tried, and the reason shows
    # the scaling.
    plan = placed(0.006)
    verdict = judge(plan, 0.012, 0.010, 1.2, 6, [placed(0.00475, "cpop")])
    assert verdict == Verdict(
        keep=False, runner_up=None,
        why=SLOWER + "; no other plan is tried: the best of them, cpop, is expected at 9.50 ms (predicted 4.75 ms, "
                     "a plan of the same kind, scaled by this plan's measured / predicted 2.00x), not 5 % faster "
                     "than the default placement")


def test_no_ratio_means_fit_ended_first_and_the_plan_is_dropped_untried():
    why = "fit ended before the plan was timed beside the default placement"
    # Nothing timed at all, or planned steps but no default one: no ratio either way.
    assert judge(PLAN, None, None, None, 0, [replicated(0.001)]) == Verdict(keep=False, runner_up=None, why=why)
    assert judge(PLAN, 0.012, None, None, 0, [replicated(0.001)]) == Verdict(keep=False, runner_up=None, why=why)


def test_runners_up_without_a_prediction_are_left_out():
    unpredicted = Plan(placement={}, algorithm="cpop")
    assert judge(PLAN, 0.012, 0.010, 1.2, 6, [unpredicted]) == Verdict(
        keep=False, why=SLOWER + "; no other plan is left to try")
    # With one that has a prediction, that one is the runner-up, though given second.
    other = replicated(0.009)
    assert judge(PLAN, 0.012, 0.010, 1.2, 6, [unpredicted, other]).runner_up is other


def test_a_plan_without_a_prediction_tries_no_runner_up():
    # Nothing to scale the runners-up by (a plan given up front may have no prediction).
    given = Plan(placement={}, algorithm="given")
    assert judge(given, 0.012, 0.010, 1.2, 6, [replicated(0.001)]) == Verdict(
        keep=False, why=SLOWER + "; no other plan is left to try")


@pytest.fixture
def trial():
    """A trial beside the default placement of a tiny model, one round timed: the plan 12 ms,
    the default 10 ms (1.2x), with a data-parallel runner-up expected at 9 ms."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    timed = Trial(model, stopwatch=None, against_default=True, runners_up=[replicated(0.009)], unplanned=None)
    timed.start_timing()
    for seconds in (5.0, 0.012, 0.010):  # the untimed default step (it traces), then one round
        timed.schedule.record(seconds)
    return timed


def test_at_fits_end_the_trial_tries_no_runner_up(trial):
    # fit ended: a runner-up would never be timed, so the plan is dropped on the round it had.
    verdict, measured = trial.judge(PLAN, final=True)
    assert verdict == Verdict(keep=False, runner_up=None, why=slower("12.00", "10.00", "1.20", "1 round"))
    assert measured == {"measured_step_time": 0.012, "default_step_time": 0.010, "ratio": 0.012 / 0.010}
    assert [plan.algorithm for plan in trial.runners_up] == ["data_parallel"]


def test_before_fits_end_the_trial_tries_its_runner_up_once(trial):
    verdict, _ = trial.judge(PLAN)
    assert verdict.runner_up.algorithm == "data_parallel" and trial.runners_up == []
